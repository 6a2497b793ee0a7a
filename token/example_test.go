package token_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// A token is redeemed exactly once; the replay is refused with ErrUsed.
func Example() {
	// Real keys come from token.ParseKeys(os.Getenv("REPLAYGUARD_SIGNING_KEYS")).
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()

	is, err := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("issued for:", is.Purpose, "lifetime:", is.TTL)

	c, err := svc.Redeem(ctx, is.Token, "checkout", "")
	fmt.Println("first redeem:", c.Purpose, err)

	_, err = svc.Redeem(ctx, is.Token, "checkout", "")
	fmt.Println("second redeem:", err, errors.Is(err, token.ErrUsed))
	// Output:
	// issued for: checkout lifetime: 5m0s
	// first redeem: checkout <nil>
	// second redeem: token: already used true
}

// A token bound to a subject is redeemed only for that subject. A
// mismatch, of purpose or subject, leaves the token valid.
func ExampleService_Redeem_binding() {
	// Real keys come from token.ParseKeys(os.Getenv("REPLAYGUARD_SIGNING_KEYS")).
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	is, err := svc.Issue(ctx, token.IssueRequest{Purpose: "transfer", Subject: "user-42"})
	if err != nil {
		fmt.Println(err)
		return
	}

	_, err = svc.Redeem(ctx, is.Token, "login", "user-42")
	fmt.Println("wrong purpose:", errors.Is(err, token.ErrPurposeMismatch))
	_, err = svc.Redeem(ctx, is.Token, "transfer", "user-7")
	fmt.Println("wrong subject:", errors.Is(err, token.ErrSubjectMismatch))
	c, err := svc.Redeem(ctx, is.Token, "transfer", "user-42")
	fmt.Println("right caller:", c.Subject, err)
	// Output:
	// wrong purpose: true
	// wrong subject: true
	// right caller: user-42 <nil>
}

// Parse checks a token's signature and expiry without touching the store:
// a token signed by a key outside the ring is invalid.
func ExampleService_Parse() {
	// Real keys come from token.ParseKeys(os.Getenv("REPLAYGUARD_SIGNING_KEYS")).
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	other, err := token.New(st, []token.Key{{ID: "2026-01", Secret: []byte(strings.Repeat("x", 32))}}, token.WithMachineID(2))
	if err != nil {
		fmt.Println(err)
		return
	}
	forged, err := other.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		fmt.Println(err)
		return
	}

	_, err = svc.Parse(forged.Token)
	fmt.Println("forged:", errors.Is(err, token.ErrInvalid))
	_, err = svc.Parse("not-a-jwt")
	fmt.Println("garbage:", errors.Is(err, token.ErrInvalid))
	// Output:
	// forged: true
	// garbage: true
}

// ParseKeys reads REPLAYGUARD_SIGNING_KEYS. The first key signs; all of
// them verify, which is how keys are rotated. Printing a key shows its kid
// only, never the secret.
func ExampleParseKeys() {
	newKey := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("n", 32)))
	oldKey := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("o", 32)))
	keys, err := token.ParseKeys("2026-02:" + newKey + ",2026-01:" + oldKey)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(keys)

	_, err = token.ParseKeys("short:" + base64.StdEncoding.EncodeToString([]byte("too short")))
	fmt.Println(err)
	// Output:
	// [Key(2026-02) Key(2026-01)]
	// token: bad signing keys: entry 1: the key is 9 bytes, need at least 32
}
