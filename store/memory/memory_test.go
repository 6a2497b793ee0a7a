package memory_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newClock() *storetest.Clock { return storetest.NewClock(time.Unix(1_700_000_000, 0)) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Instance {
		c := newClock()
		s := memory.New(memory.WithClock(c.Now))
		return storetest.Instance{Store: s, Limiter: s, Now: c.Now, Advance: c.Advance, TTL: s.TTL}
	})
}

func TestBound(t *testing.T) {
	ctx := context.Background()
	tok := store.Token{Purpose: "p"}
	const max = 100
	tests := []struct {
		name string
		// free runs after the store is filled and must free exactly one slot.
		free func(t *testing.T, s *memory.Store, c *storetest.Clock)
	}{
		{"redeeming frees a slot", func(t *testing.T, s *memory.Store, _ *storetest.Clock) {
			if res, err := s.RedeemToken(ctx, "7", tok); err != nil || res != store.Redeemed {
				t.Fatalf("redeem = %v, %v", res, err)
			}
		}},
		{"expiry frees a slot before the janitor runs", func(t *testing.T, s *memory.Store, c *storetest.Clock) {
			c.Advance(30 * time.Second) // token "short" expires; the others live an hour
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock()
			s := memory.New(memory.WithMaxEntries(max), memory.WithClock(c.Now), memory.WithJanitorInterval(time.Hour))
			defer s.Close()
			for i := range max - 1 {
				if ok, err := s.PutToken(ctx, strconv.Itoa(i), tok, c.Now().Add(time.Hour)); err != nil || !ok {
					t.Fatalf("put %d = %v, %v", i, ok, err)
				}
			}
			if ok, err := s.PutToken(ctx, "short", tok, c.Now().Add(10*time.Second)); err != nil || !ok {
				t.Fatalf("put short = %v, %v", ok, err)
			}
			if ok, err := s.PutToken(ctx, "0", tok, c.Now().Add(time.Hour)); ok || err != nil {
				t.Fatalf("put of a live id in a full store = %v, %v; want false, nil", ok, err)
			}
			if _, err := s.PutToken(ctx, "overflow", tok, c.Now().Add(time.Hour)); !errors.Is(err, store.ErrFull) {
				t.Fatalf("put past the bound: err = %v, want ErrFull", err)
			}
			// A full store still redeems, and never evicted a live token.
			if got := s.Len(); got != max {
				t.Fatalf("Len = %d, want %d", got, max)
			}
			tc.free(t, s, c)
			if ok, err := s.PutToken(ctx, "after", tok, c.Now().Add(time.Hour)); err != nil || !ok {
				t.Fatalf("put after freeing = %v, %v; want a slot", ok, err)
			}
			if _, err := s.PutToken(ctx, "again", tok, c.Now().Add(time.Hour)); !errors.Is(err, store.ErrFull) {
				t.Fatalf("second put after freeing one slot: err = %v, want ErrFull", err)
			}
			for _, id := range []string{"0", "98"} {
				if res, _ := s.RedeemToken(ctx, id, tok); res != store.Redeemed {
					t.Fatalf("live token %s was lost: %v", id, res)
				}
			}
		})
	}
}

func TestJanitorRemovesExpiredEntries(t *testing.T) {
	c := newClock()
	s := memory.New(memory.WithClock(c.Now), memory.WithJanitorInterval(time.Millisecond))
	defer s.Close()
	ctx := context.Background()
	for i := range 10 {
		if _, err := s.PutToken(ctx, strconv.Itoa(i), store.Token{Purpose: "p"}, c.Now().Add(time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	c.Advance(2 * time.Second)
	// The janitor runs every millisecond; wait for it with a deadline.
	deadline := time.Now().Add(5 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Len = %d after expiry, want 0", s.Len())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestClosedStoreRefusesCalls(t *testing.T) {
	s := memory.New()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := context.Background()
	if _, err := s.PutToken(ctx, "x", store.Token{}, time.Now().Add(time.Minute)); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("put after close: %v", err)
	}
	if _, err := s.RedeemToken(ctx, "x", store.Token{}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("redeem after close: %v", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("ping after close: %v", err)
	}
}

func TestLimiterKeyBound(t *testing.T) {
	c := newClock()
	s := memory.New(memory.WithClock(c.Now), memory.WithMaxLimiterKeys(2), memory.WithJanitorInterval(time.Hour))
	defer s.Close()
	ctx := context.Background()
	l := store.Limit{Rate: 1, Burst: 1, Period: time.Minute}
	for _, k := range []string{"a", "b"} {
		if ok, _, _ := s.Allow(ctx, k, l); !ok {
			t.Fatalf("key %s refused", k)
		}
	}
	if ok, retry, err := s.Allow(ctx, "c", l); ok || err != nil || retry <= 0 {
		t.Fatalf("third key with a full table = (%v, %v, %v), want refused with a retry time", ok, retry, err)
	}
}

func BenchmarkRedeemParallel(b *testing.B) {
	s := memory.New(memory.WithMaxEntries(b.N + 1))
	defer s.Close()
	ctx := context.Background()
	tok := store.Token{Purpose: "default"}
	ids := make([]string, b.N)
	exp := time.Now().Add(time.Hour)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
		if _, err := s.PutToken(ctx, ids[i], tok, exp); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := ids[next.Add(1)-1]
			if res, err := s.RedeemToken(ctx, id, tok); err != nil || res != store.Redeemed {
				b.Errorf("redeem %s = %v, %v", id, res, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "redeems/s")
}

func BenchmarkPut(b *testing.B) {
	s := memory.New(memory.WithMaxEntries(b.N + 1))
	defer s.Close()
	ctx := context.Background()
	tok := store.Token{Purpose: "default"}
	exp := time.Now().Add(time.Hour)
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.PutToken(ctx, strconv.Itoa(i), tok, exp); err != nil {
			b.Fatal(err)
		}
	}
}
