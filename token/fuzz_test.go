package token

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store/memory"
)

// FuzzParse checks that Parse never panics, answers every input with
// valid claims or ErrInvalid/ErrExpired, and accepts a token only in the
// one spelling this service signs: no re-encoding of a token (base64
// padding bits, header variants) passes. The seed corpus runs in the
// normal test suite.
func FuzzParse(f *testing.F) {
	st := memory.New()
	f.Cleanup(func() { _ = st.Close() })
	now := time.Now()
	svc, err := New(st, []Key{{ID: "a", Secret: []byte(strings.Repeat("A", 32))}}, WithMachineID(1), WithClock(func() time.Time { return now }))
	if err != nil {
		f.Fatal(err)
	}
	good, err := svc.Issue(context.Background(), IssueRequest{Purpose: "checkout", Subject: "alice"})
	if err != nil {
		f.Fatal(err)
	}
	last := good.Token[len(good.Token)-1]
	for _, seed := range []string{
		good.Token,
		good.Token[:len(good.Token)-1] + string(last^1),
		"", ".", "..", "a.b.c",
		"eyJhbGciOiJub25lIn0.eyJqdGkiOiIxIn0.",
		strings.Replace(good.Token, ".", "..", 1),
		good.Token + "x",
		strings.Repeat("A", MaxTokenLen+1),
		"eyJhbGciOiJIUzI1NiIsImtpZCI6WzFdfQ.e30.AAAA",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := svc.Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrExpired) {
				t.Fatalf("Parse(%q) = %v, want ErrInvalid or ErrExpired", s, err)
			}
			return
		}
		canonical, err := svc.sign(c)
		if err != nil {
			t.Fatal(err)
		}
		if s != canonical {
			t.Fatalf("Parse accepted %q, a re-encoding of %q", s, canonical)
		}
	})
}
