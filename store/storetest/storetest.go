package storetest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store"
)

// Instance is one fresh store under test plus the means to observe it.
type Instance struct {
	// Store is the store under test; Run closes it when the test ends.
	Store store.Store
	// Limiter is the store's rate limiter, nil when it has none.
	Limiter store.Limiter
	// Now is the store's clock.
	Now func() time.Time
	// Advance moves the store's clock forward by d. Stores whose clock is
	// the real one (a real Redis server) wait for d to pass.
	Advance func(d time.Duration)
	// TTL returns the remaining lifetime of the entry stored under the
	// token ID id, and false when there is none.
	TTL func(id string) (time.Duration, bool)
	// RecordTTL returns the remaining lifetime of the idempotency record
	// under key (a token's record under store.TokenRecordKey(id)), and
	// false when there is none. It is optional: when nil, the checks that
	// need it are skipped.
	RecordTTL func(key string) (time.Duration, bool)
}

// Factory returns a fresh instance whose keys do not collide with any
// other instance's.
type Factory func(t *testing.T) Instance

var seq atomic.Int64

// ID returns an ID unique within this process, for test tokens.
func ID() string {
	return strconv.FormatInt(time.Now().UnixNano(), 10) + "-" + strconv.FormatInt(seq.Add(1), 10)
}

// errReplay marks a Put of a nonce that found it, in race results.
var errReplay = errors.New("storetest: replay")

// race calls f(0) … f(n-1) at once, each in its own goroutine released
// by one signal, and returns their results in order.
func race[T any](n int, f func(i int) T) []T {
	out := make([]T, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range out {
		wg.Go(func() {
			<-start
			out[i] = f(i)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// Run runs the whole conformance suite against the stores newStore makes.
func Run(t *testing.T, newStore Factory) {
	t.Helper()
	open := func(t *testing.T) Instance {
		t.Helper()
		in := newStore(t)
		t.Cleanup(func() { _ = in.Store.Close() })
		return in
	}
	ctx := context.Background()
	checkoutAlice := store.Token{Purpose: "checkout", Subject: "alice"}

	t.Run("put then redeem succeeds exactly once", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeem(t, in, id, checkoutAlice, store.Redeemed)
		expectRedeem(t, in, id, checkoutAlice, store.Absent)
	})

	t.Run("token never issued is absent", func(t *testing.T) {
		in := open(t)
		expectRedeem(t, in, ID(), checkoutAlice, store.Absent)
	})

	t.Run("put on a live id leaves the existing token untouched", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		created, err := in.Store.Put(ctx, id, store.Token{Purpose: "other"}, time.Hour)
		if err != nil || created {
			t.Fatalf("second put = (%v, %v), want (false, nil)", created, err)
		}
		if ttl, ok := in.TTL(id); !ok || ttl > time.Minute {
			t.Fatalf("TTL after refused put = %v, %v; want the original minute at most", ttl, ok)
		}
		expectRedeem(t, in, id, checkoutAlice, store.Redeemed)
	})

	t.Run("purpose mismatch keeps the token", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeem(t, in, id, store.Token{Purpose: "login", Subject: "alice"}, store.PurposeMismatch)
		expectRedeem(t, in, id, checkoutAlice, store.Redeemed)
	})

	t.Run("purpose is compared before subject", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeem(t, in, id, store.Token{Purpose: "login", Subject: "bob"}, store.PurposeMismatch)
	})

	subjectCases := []struct {
		name      string
		issued    store.Token
		presented store.Token
	}{
		{"other subject", checkoutAlice, store.Token{Purpose: "checkout", Subject: "bob"}},
		{"bound token redeemed without subject", checkoutAlice, store.Token{Purpose: "checkout"}},
		{"unbound token redeemed with a subject", store.Token{Purpose: "checkout"}, checkoutAlice},
		{"subject that extends the stored one", checkoutAlice, store.Token{Purpose: "checkout", Subject: "alice2"}},
		{"purpose that extends the stored one", store.Token{Purpose: "check"}, store.Token{Purpose: "checkout"}},
	}
	for _, tc := range subjectCases {
		t.Run("mismatch keeps the token: "+tc.name, func(t *testing.T) {
			in := open(t)
			id := ID()
			mustPut(t, in, id, tc.issued, time.Minute)
			want := store.SubjectMismatch
			if tc.issued.Purpose != tc.presented.Purpose {
				want = store.PurposeMismatch
			}
			expectRedeem(t, in, id, tc.presented, want)
			expectRedeem(t, in, id, tc.issued, store.Redeemed)
		})
	}

	t.Run("subjects with separators and unicode round-trip", func(t *testing.T) {
		in := open(t)
		for _, sub := range []string{"a\nb", "user:42|x", "ünïcødé", "\x00zero"} {
			id := ID()
			tok := store.Token{Purpose: "p", Subject: sub}
			mustPut(t, in, id, tok, time.Minute)
			expectRedeem(t, in, id, store.Token{Purpose: "p", Subject: sub + "x"}, store.SubjectMismatch)
			expectRedeem(t, in, id, tok, store.Redeemed)
		}
	})

	t.Run("stored entry expires at expiresAt", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, 1500*time.Millisecond)
		ttl, ok := in.TTL(id)
		if !ok || ttl <= 0 || ttl > 1500*time.Millisecond {
			t.Fatalf("TTL = %v, %v; want in (0, 1.5s]", ttl, ok)
		}
		in.Advance(1600 * time.Millisecond)
		expectRedeem(t, in, id, checkoutAlice, store.Absent)
		if _, ok := in.TTL(id); ok {
			t.Fatal("expired entry is still stored")
		}
	})

	t.Run("expired id can be issued again", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Second)
		in.Advance(1100 * time.Millisecond)
		mustPut(t, in, id, store.Token{Purpose: "again"}, time.Minute)
		expectRedeem(t, in, id, store.Token{Purpose: "again"}, store.Redeemed)
	})

	t.Run("TTL of a long-lived token is its lifetime", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Hour)
		ttl, ok := in.TTL(id)
		if !ok || ttl > time.Hour || ttl < time.Hour-5*time.Second {
			t.Fatalf("TTL = %v, %v; want about one hour", ttl, ok)
		}
	})

	t.Run("expiresAt in the past stores nothing", func(t *testing.T) {
		in := open(t)
		id := ID()
		created, err := in.Store.Put(ctx, id, checkoutAlice, -time.Second)
		if err != nil {
			t.Fatalf("put: %v", err)
		}
		if created {
			if _, ok := in.TTL(id); ok {
				t.Fatal("an already expired token was stored")
			}
		}
		expectRedeem(t, in, id, checkoutAlice, store.Absent)
	})

	t.Run("cancelled context is an error, never a success", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if res, _, err := in.Store.Redeem(cctx, id, checkoutAlice, "", 0); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("redeem with cancelled context = %v, %v; want an error wrapping store.ErrUnavailable", res, err)
		}
		expectRedeem(t, in, id, checkoutAlice, store.Redeemed)
	})

	t.Run("ping answers", func(t *testing.T) {
		in := open(t)
		if err := in.Store.Ping(ctx); err != nil {
			t.Fatalf("ping: %v", err)
		}
	})

	t.Run("every call after Close fails with an error wrapping ErrUnavailable", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		if err := in.Store.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		calls := map[string]error{}
		_, calls["Put"] = in.Store.Put(ctx, ID(), checkoutAlice, time.Minute)
		_, _, calls["Redeem"] = in.Store.Redeem(ctx, id, checkoutAlice, "", 0)
		_, _, calls["Acquire"] = in.Store.Acquire(ctx, ID(), fp1, owner1, time.Minute)
		_, calls["Renew"] = in.Store.Renew(ctx, ID(), owner1, time.Minute)
		_, calls["Complete"] = in.Store.Complete(ctx, ID(), owner1, nil, time.Minute)
		_, calls["Release"] = in.Store.Release(ctx, ID(), owner1)
		_, _, calls["Lookup"] = in.Store.Lookup(ctx, ID())
		calls["Ping"] = in.Store.Ping(ctx)
		for name, err := range calls {
			if !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("%s after Close = %v, want an error wrapping store.ErrUnavailable", name, err)
			}
		}
	})

	t.Run("nonces, tokens and records live in separate key spaces", func(t *testing.T) {
		in := open(t)
		id := ID()
		if fresh, err := in.Store.Put(ctx, store.NonceKey("k", id), store.Token{}, time.Minute); err != nil || !fresh {
			t.Fatalf("nonce = (%v, %v), want fresh", fresh, err)
		}
		mustPut(t, in, id, checkoutAlice, time.Minute)
		// A nonce's key is never a token: nothing redeems it.
		expectRedeem(t, in, store.NonceKey("k", id), store.Token{}, store.Absent)
		expectRedeem(t, in, id, checkoutAlice, store.Redeemed)
		if fresh, err := in.Store.Put(ctx, store.NonceKey("k", id), store.Token{}, time.Minute); err != nil || fresh {
			t.Fatalf("the same nonce again = (%v, %v), want a replay", fresh, err)
		}
	})

	t.Run("concurrent redemption succeeds exactly once per token", func(t *testing.T) {
		in := open(t)
		const tokens, racers = 50, 20
		ids := make([]string, tokens)
		for i := range ids {
			ids[i] = ID()
			mustPut(t, in, ids[i], checkoutAlice, time.Minute)
		}
		type outcome struct {
			res store.RedeemResult
			err error
		}
		outcomes := race(tokens*racers, func(i int) outcome {
			res, _, err := in.Store.Redeem(ctx, ids[i%tokens], checkoutAlice, "", 0)
			return outcome{res, err}
		})
		counts := map[store.RedeemResult]int{}
		var errs []error
		for _, o := range outcomes {
			if o.err != nil {
				errs = append(errs, o.err)
				continue
			}
			counts[o.res]++
		}
		if len(errs) > 0 {
			t.Fatalf("%d errors, first: %v", len(errs), errs[0])
		}
		if counts[store.Redeemed] != tokens || counts[store.Absent] != tokens*(racers-1) {
			t.Fatalf("outcomes = %v; want %d redeemed and %d absent", counts, tokens, tokens*(racers-1))
		}
	})

	t.Run("a nonce is fresh once per scope, then a replay", func(t *testing.T) {
		in := open(t)
		n := ID()
		for _, step := range []struct {
			scope string
			fresh bool
		}{{"partner-1", true}, {"partner-1", false}, {"mobile", true}, {"mobile", false}} {
			fresh, err := in.Store.Put(ctx, store.NonceKey(step.scope, n), store.Token{}, time.Minute)
			if err != nil || fresh != step.fresh {
				t.Fatalf("Put(NonceKey(%s)) = (%v, %v), want (%v, nil)", step.scope, fresh, err, step.fresh)
			}
		}
	})

	t.Run("nonce scopes cannot be confused by separators", func(t *testing.T) {
		in := open(t)
		n := ID()
		if fresh, err := in.Store.Put(ctx, store.NonceKey("a:b", n), store.Token{}, time.Minute); err != nil || !fresh {
			t.Fatalf("first = %v, %v", fresh, err)
		}
		if fresh, err := in.Store.Put(ctx, store.NonceKey("a", "b:"+n), store.Token{}, time.Minute); err != nil || !fresh {
			t.Fatalf("a different scope and nonce with the same concatenation = %v, %v; want fresh", fresh, err)
		}
	})

	t.Run("a nonce is fresh again after it expires", func(t *testing.T) {
		in := open(t)
		n := ID()
		if fresh, _ := in.Store.Put(ctx, store.NonceKey("k", n), store.Token{}, time.Second); !fresh {
			t.Fatal("first not fresh")
		}
		in.Advance(1100 * time.Millisecond)
		if fresh, err := in.Store.Put(ctx, store.NonceKey("k", n), store.Token{}, time.Second); err != nil || !fresh {
			t.Fatalf("after expiry = %v, %v; want fresh", fresh, err)
		}
	})

	t.Run("concurrent nonces: exactly one is fresh", func(t *testing.T) {
		in := open(t)
		n := ID()
		var fresh, replays, errs int
		for _, err := range race(50, func(int) error {
			ok, err := in.Store.Put(ctx, store.NonceKey("k", n), store.Token{}, time.Minute)
			switch {
			case err != nil:
				return err
			case ok:
				return nil
			}
			return errReplay
		}) {
			switch err {
			case nil:
				fresh++
			case errReplay:
				replays++
			default:
				errs++
			}
		}
		if fresh != 1 || replays != 49 || errs != 0 {
			t.Fatalf("fresh=%d replays=%d errors=%d; want 1, 49, 0", fresh, replays, errs)
		}
	})

	runRecords(t, open)
	runTokenRecords(t, open)
	runLookup(t, open)

	t.Run("limiter admits the burst then refuses with a retry time", func(t *testing.T) {
		in := open(t)
		if in.Limiter == nil {
			t.Skip("store has no limiter")
		}
		l := store.Limit{Rate: 3, Burst: 3, Period: time.Minute}
		key := "ip:" + ID()
		for i := range 3 {
			ok, _, err := in.Limiter.Allow(ctx, key, l)
			if err != nil || !ok {
				t.Fatalf("event %d = (%v, %v), want allowed", i+1, ok, err)
			}
		}
		ok, retry, err := in.Limiter.Allow(ctx, key, l)
		if err != nil || ok {
			t.Fatalf("4th event = (%v, %v), want refused", ok, err)
		}
		if retry <= 0 || retry > 20*time.Second+time.Second {
			t.Fatalf("retryAfter = %v, want about 20s", retry)
		}
		if ok, _, err := in.Limiter.Allow(ctx, "ip:"+ID(), l); err != nil || !ok {
			t.Fatalf("another key = (%v, %v), want allowed", ok, err)
		}
	})
}

func mustPut(t *testing.T, in Instance, id string, tok store.Token, ttl time.Duration) {
	t.Helper()
	created, err := in.Store.Put(context.Background(), id, tok, ttl)
	if err != nil || !created {
		t.Fatalf("Put(%s) = (%v, %v), want (true, nil)", id, created, err)
	}
}

func expectRedeem(t *testing.T, in Instance, id string, tok store.Token, want store.RedeemResult) {
	t.Helper()
	got, rec, err := in.Store.Redeem(context.Background(), id, tok, "", 0)
	if err != nil {
		t.Fatalf("Redeem(%s, %+v): %v", id, tok, err)
	}
	if got != want || (got != store.Recorded && !sameRecord(rec, store.Record{})) {
		t.Fatalf("Redeem(%s, %+v) = %v, %+v; want %v", id, tok, got, describe(rec), want)
	}
}
