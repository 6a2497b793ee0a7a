package replay_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store/memory"
)

// Example verifies a request that a client signed with a shared secret,
// once: the same request sent again is refused as a replay, and so is one
// whose body was changed on the way.
func Example() {
	secret := []byte("a shared secret of at least 32 bytes")
	keys, err := replay.NewKeys(replay.Key{ID: "partner-1", Alg: replay.AlgHMACSHA256, Secret: secret})
	if err != nil {
		panic(err)
	}
	st := memory.New() // use store/redis when several servers verify
	defer st.Close()
	verifier := replay.NewVerifier(keys, st)

	// The client signs the request it sends.
	signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, secret)
	if err != nil {
		panic(err)
	}
	body := `{"item": "book", "qty": 1}`
	req, _ := http.NewRequest(http.MethodPost, "https://api.example.com/v1/orders?id=7", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if err := signer.Sign(req); err != nil {
		panic(err)
	}

	// The server verifies what it received.
	received := func(body string) replay.Message {
		u, _ := url.Parse("https://api.example.com/v1/orders?id=7")
		return replay.Message{Method: http.MethodPost, URL: u, Header: req.Header, Body: []byte(body)}
	}
	ctx := context.Background()
	res, err := verifier.Verify(ctx, received(body))
	fmt.Println(res.KeyID, err)
	_, err = verifier.Verify(ctx, received(body))
	fmt.Println(errors.Is(err, replay.ErrReplayed))
	_, err = verifier.Verify(ctx, received(`{"item": "book", "qty": 100}`))
	fmt.Println(errors.Is(err, replay.ErrInvalid))
	// Output:
	// partner-1 <nil>
	// true
	// true
}
