package storetest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/store/storetest"
)

// ExampleRun is the test a store package adds to hold its store to the
// contract: a factory for fresh, isolated instances, each with its
// clock and a way to read an entry's remaining lifetime. It has no
// Output line, so go test compiles it without running it: Run needs the
// *testing.T of a real test. store/memory's TestConformance is this code,
// run; store/redis's and store/postgres's give the real clock
// (Now: time.Now, Advance: time.Sleep) for servers that expire entries by
// their own.
func ExampleRun() {
	// In mystore_test.go:
	testConformance := func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Instance {
			clock := storetest.NewClock(time.Now())
			s := memory.New(memory.WithClock(clock.Now)) // your store: its own key prefix, schema or database
			return storetest.Instance{Store: s, Limiter: s, Now: clock.Now, Advance: clock.Advance, TTL: ttlOf(s)}
		})
	}
	_ = testConformance // func TestConformance(t *testing.T) { … }
}

// ttlOf stands for the store's own way to read how long it keeps the
// entry under a token ID, written in its test package (PTTL for Redis,
// expires_at for PostgreSQL, a test hook for memory); this placeholder
// finds nothing.
func ttlOf(s store.Store) func(id string) (time.Duration, bool) {
	return func(id string) (time.Duration, bool) { return 0, false }
}

// ExampleClock moves a store's clock by hand instead of sleeping, as
// conformance instances do: a token put for a minute is gone once the
// clock has moved a minute on.
func ExampleClock() {
	clock := storetest.NewClock(time.Now())
	s := memory.New(memory.WithClock(clock.Now))
	defer s.Close()
	ctx := context.Background()
	tok := store.Token{Purpose: "checkout"}

	created, err := s.Put(ctx, "tok-1", tok, time.Minute)
	fmt.Println("put:", created, err)
	clock.Advance(time.Minute)
	res, _, err := s.Redeem(ctx, "tok-1", tok, "", 0)
	fmt.Println("a minute later:", res, err)
	// Output:
	// put: true <nil>
	// a minute later: absent <nil>
}
