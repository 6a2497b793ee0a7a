package token_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/token"
)

// FuzzParse checks that Parse never panics and answers every input with
// either valid claims or ErrInvalid/ErrExpired. The seed corpus runs in
// the normal test suite.
func FuzzParse(f *testing.F) {
	fx := newFixture(f)
	good := fx.issue(f, token.IssueRequest{Purpose: "checkout", Subject: "alice"})
	for _, seed := range []string{
		good.Token,
		"", ".", "..", "a.b.c",
		"eyJhbGciOiJub25lIn0.eyJqdGkiOiIxIn0.",
		strings.Replace(good.Token, ".", "..", 1),
		good.Token + "x",
		strings.Repeat("A", token.MaxTokenLen+1),
		"eyJhbGciOiJIUzI1NiIsImtpZCI6WzFdfQ.e30.AAAA",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := fx.svc.Parse(s)
		if err != nil {
			if !errors.Is(err, token.ErrInvalid) && !errors.Is(err, token.ErrExpired) {
				t.Fatalf("Parse(%q) = %v, want ErrInvalid or ErrExpired", s, err)
			}
			return
		}
		if s != good.Token {
			t.Fatalf("Parse accepted a token it never issued: %q -> %+v", s, c)
		}
	})
}
