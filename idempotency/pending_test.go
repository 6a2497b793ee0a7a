package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store"
)

// stallingStore fails Complete, and Renew when renewals stall too, with
// store.ErrUnavailable while stalled, as a store that stopped answering
// does; every failed Complete is reported on failed.
type stallingStore struct {
	store.Store
	stalled       atomic.Bool
	renewalsStall atomic.Bool
	// landed makes a stalled Complete land in the store all the same, as
	// one whose reply was lost after the store carried it out.
	landed  atomic.Bool
	failed  chan struct{}
	renewed chan error // every Renew's error, when non-nil
}

func newStallingStore(st store.Store) *stallingStore {
	return &stallingStore{Store: st, failed: make(chan struct{}, 1000)}
}

func (s *stallingStore) Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (bool, error) {
	if !s.stalled.Load() {
		return s.Store.Complete(ctx, key, owner, response, keep)
	}
	if s.landed.Load() {
		_, _ = s.Store.Complete(ctx, key, owner, response, keep)
	}
	s.failed <- struct{}{}
	return false, fmt.Errorf("%w: stalled", store.ErrUnavailable)
}

func (s *stallingStore) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	ok, err := false, fmt.Errorf("%w: stalled", store.ErrUnavailable)
	if !s.renewalsStall.Load() {
		ok, err = s.Store.Renew(ctx, key, owner, lease)
	}
	if s.renewed != nil {
		s.renewed <- err
	}
	return ok, err
}

// waitFailures waits for n failed completions.
func (s *stallingStore) waitFailures(t *testing.T, n int) {
	t.Helper()
	for range n {
		<-s.failed
	}
}

// completePending opens the record of "key", stalls st and completes the
// run with status, which the Keeper must then hold as pending.
func completePending(t *testing.T, k *idempotency.Keeper, st *stallingStore, status int) {
	t.Helper()
	run, _, err := k.Start(context.Background(), "key", "fp")
	if err != nil {
		t.Fatal(err)
	}
	st.stalled.Store(true)
	if err := run.Complete(context.Background(), idempotency.Outcome{Status: status}); !errors.Is(err, idempotency.ErrPending) {
		t.Fatalf("Complete = %v, want ErrPending", err)
	}
}

// shutdown waits for the Keeper's background completions; the test's
// deadline bounds it.
func shutdown(t *testing.T, k *idempotency.Keeper) error {
	t.Helper()
	ctx := context.Background()
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
		defer cancel()
	}
	return k.Shutdown(ctx)
}

func TestCompletionIsRetriedUntilTheStoreComesBack(t *testing.T) {
	st := newStallingStore(newMemory(t, nil))
	k := idempotency.New(st)
	ctx := context.Background()
	runs := 0
	work := func(context.Context) (idempotency.Outcome, error) {
		runs++
		st.stalled.Store(true) // the store stalls while the work runs
		return idempotency.Outcome{Status: 201, Body: []byte("charged")}, nil
	}
	out, replayed, err := k.Do(ctx, "key", "fp", work)
	if !errors.Is(err, idempotency.ErrPending) || errors.Is(err, store.ErrUnavailable) || replayed || out.Status != 201 {
		t.Fatalf("Do = %+v, %v, %v; want the outcome with ErrPending (and not store.ErrUnavailable, which callers answer 503)", out, replayed, err)
	}
	if n := k.Pending(); n != 1 {
		t.Fatalf("Pending = %d, want 1", n)
	}
	st.waitFailures(t, 3) // the first attempt and two retries
	if _, _, err := k.Do(ctx, "key", "fp", work); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("a duplicate while the completion is pending: %v, want ErrInProgress", err)
	}
	st.stalled.Store(false)
	if err := shutdown(t, k); err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
	out, replayed, err = k.Do(ctx, "key", "fp", work)
	if err != nil || !replayed || string(out.Body) != "charged" || runs != 1 {
		t.Fatalf("a duplicate after the store came back: %+v, replayed %v, %v, %d runs; want the outcome replayed and one run", out, replayed, err, runs)
	}
	if k.Pending() != 0 || k.GivenUp() != 0 {
		t.Fatalf("Pending %d, GivenUp %d; want 0 and 0", k.Pending(), k.GivenUp())
	}
}

func TestCompletionIsGivenUpWhenTheRecordIsReleasedMeanwhile(t *testing.T) {
	st := newStallingStore(newMemory(t, nil))
	k := idempotency.New(st)
	ctx := context.Background()
	completePending(t, k, st, 200)
	st.waitFailures(t, 1)
	if ok, err := k.Release(ctx, "key"); !ok || err != nil { // an operator's release by hand
		t.Fatalf("Release = %v, %v", ok, err)
	}
	st.stalled.Store(false)
	if err := shutdown(t, k); err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
	if k.GivenUp() != 1 {
		t.Fatalf("GivenUp = %d, want 1", k.GivenUp())
	}
	if run, _, err := k.Start(ctx, "key", "fp"); run == nil || err != nil {
		t.Fatalf("a retry after the release: %v, %v; want it to run", run, err)
	} else {
		_ = run.Release(ctx)
	}
}

func TestShutdownGivesUpWhatTheStoreNeverConfirms(t *testing.T) {
	st := newStallingStore(newMemory(t, nil))
	k := idempotency.New(st)
	ctx := context.Background()
	completePending(t, k, st, 200)
	st.waitFailures(t, 2)
	sctx, cancel := context.WithCancel(ctx)
	cancel() // no time left
	if err := k.Shutdown(sctx); err == nil {
		t.Fatal("Shutdown = nil, want the outcome not recorded")
	}
	if k.Pending() != 0 || k.GivenUp() != 1 {
		t.Fatalf("Pending %d, GivenUp %d; want 0 and 1", k.Pending(), k.GivenUp())
	}
	// After Shutdown gave up, a completion the store does not confirm is
	// reported as the store's error, not retried.
	run, _, err := k.Start(ctx, "other", "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Complete(ctx, idempotency.Outcome{Status: 200}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Complete after Shutdown = %v, want store.ErrUnavailable", err)
	}
}

func TestHeartbeatKeepsAPendingRecordPastLeaseAndGrace(t *testing.T) {
	clk := newClock()
	st := newStallingStore(newMemory(t, clk))
	st.renewed = make(chan error)
	k := idempotency.New(st, idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
	ticks, ticker := manualTicker()
	idempotency.SetTicker(k, ticker)
	ctx := context.Background()
	completePending(t, k, st, 202)
	for i := range 6 { // four minutes: twice the lease and grace
		clk.Advance(40 * time.Second)
		ticks <- clk.Now()
		if err := <-st.renewed; err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
	}
	if _, _, err := k.Start(ctx, "key", "fp"); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("a duplicate four minutes on: %v, want ErrInProgress", err)
	}
	st.stalled.Store(false)
	go func() { // the heartbeat may renew once more before it stops
		for range st.renewed {
		}
	}()
	if err := shutdown(t, k); err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
	close(st.renewed)
	if _, out, err := k.Start(ctx, "key", "fp"); err != nil || out.Status != 202 {
		t.Fatalf("a duplicate after the store came back: %+v, %v; want the outcome", out, err)
	}
}

func TestHeartbeatRetriesAFailedRenewalBeforeTheNextTick(t *testing.T) {
	clk := newClock()
	st := newStallingStore(newMemory(t, clk))
	st.renewed = make(chan error)
	k := idempotency.New(st, idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
	ticks, ticker := manualTicker() // never ticks but when told
	idempotency.SetTicker(k, ticker)
	ctx := context.Background()
	run, _, err := k.Start(ctx, "key", "fp")
	if err != nil {
		t.Fatal(err)
	}
	st.renewalsStall.Store(true)
	ticks <- clk.Now()
	if err := <-st.renewed; err == nil {
		t.Fatal("the renewal during the stall succeeded")
	}
	if err := <-st.renewed; err == nil { // retried without a tick
		t.Fatal("the second renewal during the stall succeeded")
	}
	st.renewalsStall.Store(false)
	for err := range st.renewed { // a retry lands once the store is back
		if err == nil {
			break
		}
	}
	go func() {
		for range st.renewed {
		}
	}()
	if err := run.Complete(ctx, idempotency.Outcome{Status: 200}); err != nil {
		t.Fatalf("Complete = %v", err)
	}
	close(st.renewed)
}

func TestGraceKeepsAnEndedLeaseFromBeingTakenOver(t *testing.T) {
	clk := newClock()
	k := idempotency.New(newMemory(t, clk), idempotency.WithClock(clk.Now), idempotency.WithLockTTL(10*time.Second), idempotency.WithGrace(20*time.Second))
	if k.Grace() != 20*time.Second {
		t.Fatalf("Grace = %v", k.Grace())
	}
	ctx := context.Background()
	crashed, _, err := k.Start(ctx, "key", "fp")
	if err != nil {
		t.Fatal(err)
	}
	crashed.Abandon() // no more renewals: the holder died
	for _, step := range []struct {
		advance time.Duration
		want    error
	}{
		{9 * time.Second, idempotency.ErrInProgress},  // inside the lease
		{20 * time.Second, idempotency.ErrInProgress}, // inside the grace
		{time.Second, nil},                            // the lease and grace are over: one retry runs
	} {
		clk.Advance(step.advance)
		run, _, err := k.Start(ctx, "key", "fp")
		if !errors.Is(err, step.want) || (err == nil) != (step.want == nil) {
			t.Fatalf("after %v more: %v, want %v", step.advance, err, step.want)
		}
		if run != nil {
			_ = run.Release(ctx)
		}
	}
	if d := idempotency.New(newMemory(t, clk), idempotency.WithLockTTL(7*time.Second)).Grace(); d != 7*time.Second {
		t.Fatalf("default grace = %v, want one lock TTL", d)
	}
}

func TestACompletionThatLandedUnseenIsNotGivenUp(t *testing.T) {
	st := newStallingStore(newMemory(t, nil))
	k := idempotency.New(st)
	ctx := context.Background()
	st.landed.Store(true) // the store carries the completion out, but its reply is lost
	completePending(t, k, st, 201)
	st.waitFailures(t, 1)
	st.stalled.Store(false) // the retry finds the record completed already, by this run
	if err := shutdown(t, k); err != nil {
		t.Fatalf("Shutdown = %v", err)
	}
	if k.GivenUp() != 0 {
		t.Fatalf("GivenUp = %d, want 0: the completion landed", k.GivenUp())
	}
	info, found, err := k.Lookup(ctx, "key")
	if err != nil || !found || !info.Completed || info.Status != 201 || !info.BodyStored || info.ID != "key" {
		t.Fatalf("Lookup = %+v, %v, %v", info, found, err)
	}
}
