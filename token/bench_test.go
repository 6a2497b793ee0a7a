package token_test

import (
	"context"
	"os"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/store"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/token"
)

// BenchmarkStores runs issue and redeem through the whole Service on each
// store: memory always, Redis when REPLAYGUARD_TEST_REDIS_URL is set.
// Issue is bounded by sonyflake v1 (256 IDs per 10 ms per machine ID).
func BenchmarkStores(b *testing.B) {
	stores := map[string]func(b *testing.B) store.Store{
		"memory": func(b *testing.B) store.Store { return newFixture(b).store.Store },
		"redis": func(b *testing.B) store.Store {
			url := os.Getenv("REPLAYGUARD_TEST_REDIS_URL")
			if url == "" {
				b.Skip("REPLAYGUARD_TEST_REDIS_URL not set")
			}
			opt, err := goredis.ParseURL(url)
			if err != nil {
				b.Fatal(err)
			}
			st := redisstore.New(goredis.NewClient(opt), redisstore.WithPrefix("rgbench:"))
			b.Cleanup(func() { _ = st.Close() })
			return st
		},
	}
	for _, name := range []string{"memory", "redis"} {
		b.Run(name, func(b *testing.B) {
			st := stores[name](b)
			svc, err := token.New(st, []token.Key{keyA}, token.WithMachineID(3))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.Run("issue", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, err := svc.Issue(ctx, token.IssueRequest{}); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("redeem", func(b *testing.B) {
				toks := make([]string, b.N)
				for i := range toks {
					is, err := svc.Issue(ctx, token.IssueRequest{})
					if err != nil {
						b.Fatal(err)
					}
					toks[i] = is.Token
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if _, err := svc.Redeem(ctx, toks[i], "", ""); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

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
// memory store (tokens are issued outside the timer, redeemBatch at a
// time, so that a large b.N does not fill the store).
func BenchmarkRedeem(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	toks := make([]string, 0, min(b.N, redeemBatch))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if i%redeemBatch == 0 {
			b.StopTimer()
			toks = toks[:0]
			for range min(redeemBatch, b.N-i) {
				toks = append(toks, f.issue(b, token.IssueRequest{}).Token)
			}
			b.StartTimer()
		}
		if _, err := f.svc.Redeem(ctx, toks[i%redeemBatch], "", ""); err != nil {
			b.Fatal(err)
		}
	}
}

// redeemBatch is how many tokens BenchmarkRedeem issues at a time.
const redeemBatch = 100_000

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
