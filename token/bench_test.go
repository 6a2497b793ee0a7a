package token_test

import (
	"context"
	"testing"

	"github.com/replayguard/replayguard/token"
)

// BenchmarkIssue measures issuing on the memory store: sonyflake ID,
// store put and HS256 signing.
func BenchmarkIssue(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.svc.Issue(ctx, token.IssueRequest{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParse measures signature and claim verification alone.
func BenchmarkParse(b *testing.B) {
	f := newFixture(b)
	tok := f.issue(b, token.IssueRequest{}).Token
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.svc.Parse(tok); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRedeem measures parse plus the atomic store redemption on the
// memory store (tokens are issued outside the timer).
func BenchmarkRedeem(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	toks := make([]string, b.N)
	for i := range toks {
		toks[i] = f.issue(b, token.IssueRequest{}).Token
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := f.svc.Redeem(ctx, toks[i], "", ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseForged measures rejecting a well-formed token with the
// current kid signed by another key: the attack the fast path is for.
func BenchmarkParseForged(b *testing.B) {
	f := newFixture(b)
	other := newFixture(b, token.Key{ID: "a", Secret: []byte("another-key-another-key-another-k")})
	forged := other.issue(b, token.IssueRequest{}).Token
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.svc.Parse(forged); err == nil {
			b.Fatal("forged token accepted")
		}
	}
}
