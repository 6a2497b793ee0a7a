package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/replayguard/replayguard/store"
)

// background keeps count of the completions a Keeper retries after the
// store failed to confirm them (Run.Complete), so that Shutdown can wait
// for them and metrics can count them.
type background struct {
	mu      sync.Mutex
	n       int
	idle    chan struct{} // closed while n == 0
	stopped bool          // Shutdown's time ran out: no new retries

	// stop is canceled when Shutdown's time runs out: the retries in
	// flight give up at once.
	stop    context.Context
	cancel  context.CancelFunc
	givenUp atomic.Int64
}

func newBackground() *background {
	b := &background{idle: make(chan struct{})}
	close(b.idle)
	b.stop, b.cancel = context.WithCancel(context.Background())
	return b
}

// add counts a new retry; it returns false once Shutdown gave up.
func (b *background) add() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return false
	}
	if b.n == 0 {
		b.idle = make(chan struct{})
	}
	b.n++
	return true
}

// done ends a retry counted by add.
func (b *background) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n--
	if b.n == 0 {
		close(b.idle)
	}
}

// Pending returns how many outcomes the Keeper (and every copy of it made
// with With) holds that the store has not confirmed yet and that it keeps
// trying to record in the background (see Run.Complete).
func (k *Keeper) Pending() int {
	k.bg.mu.Lock()
	defer k.bg.mu.Unlock()
	return k.bg.n
}

// GivenUp returns how many outcomes the Keeper (and its copies) could not
// record at all: the store did not confirm them within the retention, the
// record was lost meanwhile, or Shutdown's time ran out. Each is logged
// with its record key. After the lease and grace, one retry of each may
// run its work again.
func (k *Keeper) GivenUp() int64 { return k.bg.givenUp.Load() }

// Shutdown waits until every outcome being recorded in the background has
// landed or been given up, or until ctx is done: then the retries give up
// at once (each is logged) and Shutdown returns an error saying how many
// were not recorded. Completions that fail after Shutdown has given up are
// not retried. Call it after the server has stopped taking requests.
func (k *Keeper) Shutdown(ctx context.Context) error {
	b := k.bg
	b.mu.Lock()
	idle := b.idle
	b.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	b.stopped = true
	n := b.n
	idle = b.idle
	b.mu.Unlock()
	b.cancel()
	<-idle
	if n == 0 {
		return nil
	}
	return fmt.Errorf("idempotency: %d outcomes not recorded at shutdown: %w", n, context.Cause(ctx))
}

// Backoff of the background completions: from retryFirst, doubling up to
// the heartbeat's tick (the lock TTL's quarter), and at most retryMax.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 5 * time.Second
)

// completeLater records data, the outcome of r's execution (whose status
// is status), that the store did not confirm the first time (first says
// why), trying again with backoff while the heartbeat keeps the lease,
// for up to the retention but at least the lease and grace; then it stops
// the heartbeat.
func (r *Run) completeLater(data []byte, status int, first error) {
	k := r.k
	defer k.bg.done()
	defer r.end()
	log := k.log.With(slog.String("record_id", RecordID(r.key)), slog.Int("status", status))
	log.LogAttrs(context.Background(), slog.LevelWarn, "idempotency completion pending: the store did not confirm it; retrying in the background while the lease is renewed",
		slog.String("error", first.Error()))
	deadline := time.Now().Add(max(k.retention, k.recordTTL()))
	wait := retryFirst
	for attempt := 2; ; attempt++ {
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-k.bg.stop.Done():
			timer.Stop()
			r.giveUp(log, "the server shut down first", attempt-1)
			return
		}
		wait = min(2*wait, max(k.lockTTL/4, retryFirst), retryMax)
		ctx, cancel := context.WithTimeout(k.bg.stop, finishTimeout)
		ok, err := k.store.Complete(ctx, r.key, r.owner, data, k.retention)
		if err == nil && !ok {
			// An earlier attempt that timed out may have landed after all.
			ok, err = r.completedByUs(ctx)
			if err == nil && !ok {
				cancel()
				r.giveUp(log, "the record was lost first (its lease and grace ran out, or an operator released it)", attempt)
				return
			}
		}
		cancel()
		switch {
		case err == nil:
			log.LogAttrs(context.Background(), slog.LevelInfo, "idempotency completion recorded after a store failure", slog.Int("attempts", attempt))
			return
		case errors.Is(err, store.ErrFull) && !decodedOmitted(data):
			data = encodeOutcome(Outcome{Status: status, BodyOmitted: true})
		case time.Now().After(deadline):
			r.giveUp(log, "the store did not confirm it within the retention: "+err.Error(), attempt)
			return
		}
	}
}

// completedByUs reports whether r's record is completed under r's owner:
// a completion that timed out landed after all.
func (r *Run) completedByUs(ctx context.Context) (bool, error) {
	rec, found, err := r.k.store.Lookup(ctx, r.key)
	if err != nil {
		return false, err
	}
	return found && rec.Completed && rec.Owner == r.owner, nil
}

// giveUp counts and logs an outcome that will not be recorded.
func (r *Run) giveUp(log *slog.Logger, why string, attempts int) {
	r.k.bg.givenUp.Add(1)
	log.LogAttrs(context.Background(), slog.LevelError, "idempotency completion given up: the work ran but its outcome is not recorded; once the lease and grace end, one retry may run it again",
		slog.String("reason", why), slog.Int("attempts", attempts))
}

// decodedOmitted reports whether data is an outcome stored without its
// body.
func decodedOmitted(data []byte) bool {
	out, err := decodeOutcome(data)
	return err == nil && out.BodyOmitted
}

// Renew extends the lease of the run's record to the Keeper's lock TTL
// from now (the record outlives it by the grace), for an execution that
// ends in another request and takes longer than the lease (a Run from a
// Detached RedeemToken or ResumeToken; a Run with a heartbeat is renewed
// by it). It returns the lease's new end, on the Keeper's clock, read
// before the store was asked; ErrLeaseLost (ErrNotProcessing for a Run
// from ResumeToken) when the record is not the run's processing record;
// or the store's error.
func (r *Run) Renew(ctx context.Context) (time.Time, error) {
	expires := r.k.now().Add(r.k.lockTTL)
	ok, err := r.k.store.Renew(ctx, r.key, r.owner, r.k.recordTTL())
	switch {
	case err != nil:
		return time.Time{}, err
	case !ok:
		return time.Time{}, r.notHeld
	}
	return expires, nil
}
