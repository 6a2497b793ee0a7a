package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/storetest"
	"github.com/replayguard/replayguard/token"
)

// tokens returns a token service over st on clk (time.Now when nil).
func tokens(t *testing.T, st store.Store, clk *storetest.Clock) *token.Service {
	t.Helper()
	now := time.Now
	if clk != nil {
		now = clk.Now
	}
	key := token.Key{ID: "k", Secret: []byte(strings.Repeat("s", 32))}
	svc, err := token.New(st, []token.Key{key}, token.WithClock(now), token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// issue issues a checkout token bound to alice.
func issue(t *testing.T, svc *token.Service) string {
	t.Helper()
	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout", Subject: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return is.Token
}

func TestRedeemToken(t *testing.T) {
	ctx := context.Background()
	seeOther := idempotency.Outcome{Status: 303, Header: map[string][]string{"Location": {"/orders/7"}}}
	// Each step redeems the token (another one when tok is set) for
	// checkout and alice (unless purpose is set) in Record mode and, when
	// it got a run, ends it with finish.
	type step struct {
		name         string
		tok          string
		purpose      string
		wantErr      error
		wantRun      bool
		wantReplayed bool
		wantOut      idempotency.Outcome
		finish       func(run *idempotency.Run) error
	}
	complete := func(out idempotency.Outcome) func(*idempotency.Run) error {
		return func(r *idempotency.Run) error { return r.Complete(ctx, out) }
	}
	release := func(r *idempotency.Run) error { return r.Release(ctx) }
	hold := func(*idempotency.Run) error { return nil }
	tests := []struct {
		name  string
		opts  []idempotency.Option
		steps []step
	}{
		{"a completed run's outcome answers every duplicate", nil, []step{
			{name: "first redeems and runs", wantRun: true, finish: complete(seeOther)},
			{name: "duplicate gets the outcome", wantReplayed: true, wantOut: seeOther},
			{name: "and again", wantReplayed: true, wantOut: seeOther},
		}},
		{"a duplicate while running is in progress", nil, []step{
			{name: "first holds its run", wantRun: true, finish: hold},
			{name: "duplicate", wantErr: idempotency.ErrInProgress},
		}},
		{"a released run gives the token back once", nil, []step{
			{name: "first releases", wantRun: true, finish: release},
			{name: "retry runs", wantRun: true, finish: complete(seeOther)},
			{name: "then it is recorded", wantReplayed: true, wantOut: seeOther},
		}},
		{"an outcome over the cap is recorded without its body", []idempotency.Option{idempotency.WithMaxBody(4)}, []step{
			{name: "first", wantRun: true, finish: complete(idempotency.Outcome{Status: 200, Body: []byte("too long")})},
			{name: "duplicate", wantErr: idempotency.ErrNotStored},
		}},
		{"the token's own refusals come back as errors", nil, []step{
			{name: "another purpose", purpose: "login", wantErr: token.ErrPurposeMismatch},
			{name: "a forged token", tok: "a.b.c", wantErr: token.ErrInvalid},
			{name: "the token stayed valid", wantRun: true, finish: complete(seeOther)},
			{name: "another purpose on the record", purpose: "login", wantErr: token.ErrPurposeMismatch},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			st := newMemory(t, clk)
			svc := tokens(t, st, clk)
			k := idempotency.New(st, append([]idempotency.Option{idempotency.WithClock(clk.Now)}, tc.opts...)...)
			tok := issue(t, svc)
			var held []*idempotency.Run
			for _, s := range tc.steps {
				tk, purpose := tok, "checkout"
				if s.tok != "" {
					tk = s.tok
				}
				if s.purpose != "" {
					purpose = s.purpose
				}
				red, err := k.RedeemToken(ctx, svc, tk, purpose, "alice", idempotency.Record)
				if !errors.Is(err, s.wantErr) || (err == nil) != (s.wantErr == nil) || (red.Run != nil) != s.wantRun ||
					red.Replayed != s.wantReplayed || fmt.Sprint(red.Outcome) != fmt.Sprint(s.wantOut) {
					t.Fatalf("%s: RedeemToken = %+v, %v; want run %v, replayed %v with %+v, %v", s.name, red, err, s.wantRun, s.wantReplayed, s.wantOut, s.wantErr)
				}
				if red.Run != nil {
					if err := s.finish(red.Run); err != nil {
						t.Fatalf("%s: finishing = %v", s.name, err)
					}
					held = append(held, red.Run)
				}
			}
			for _, r := range held {
				_ = r.Release(ctx) // stop the heartbeats of held runs
			}
		})
	}
}

func TestRedeemTokenHeartbeatRenewsTheRecord(t *testing.T) {
	clk := newClock()
	renewed := make(chan bool)
	mem := newMemory(t, clk)
	st := hookStore{mem, func(ok bool, _ error) { renewed <- ok }}
	svc := tokens(t, st, clk)
	k := idempotency.New(st, idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
	ticks, ticker := manualTicker()
	idempotency.SetTicker(k, ticker)
	ctx := context.Background()
	tok := issue(t, svc)
	red, err := k.RedeemToken(ctx, svc, tok, "checkout", "alice", idempotency.Record)
	if err != nil || red.Run == nil {
		t.Fatalf("RedeemToken = %+v, %v", red, err)
	}
	for i := range 3 {
		clk.Advance(40 * time.Second)
		ticks <- clk.Now()
		if !<-renewed {
			t.Fatalf("renewal %d failed", i)
		}
	}
	clk.Advance(40 * time.Second) // 2m40s after the redemption
	if _, err := k.RedeemToken(ctx, svc, tok, "checkout", "alice", idempotency.Record); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("renewed lease: %v; want ErrInProgress", err)
	}
	if err := red.Run.Complete(ctx, idempotency.Outcome{Status: 204}); err != nil {
		t.Fatalf("Complete = %v", err)
	}
}

func TestRedeemTokenConcurrentDuplicatesRunOnce(t *testing.T) {
	const n = 50
	st := newMemory(t, nil)
	svc := tokens(t, st, nil)
	k := idempotency.New(st)
	ctx := context.Background()
	tok := issue(t, svc)
	type result struct {
		run *idempotency.Run
		err error
	}
	results := make(chan result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			red, err := k.RedeemToken(ctx, svc, tok, "checkout", "alice", idempotency.Record)
			results <- result{red.Run, err}
		})
	}
	close(start)
	wg.Wait()
	close(results)
	var runs []*idempotency.Run
	inProgress := 0
	for r := range results {
		switch {
		case r.run != nil && r.err == nil:
			runs = append(runs, r.run)
		case errors.Is(r.err, idempotency.ErrInProgress):
			inProgress++
		default:
			t.Errorf("unexpected result %v, %v", r.run, r.err)
		}
	}
	if len(runs) != 1 || inProgress != n-1 {
		t.Fatalf("%d runs, %d in progress; want 1 and %d", len(runs), inProgress, n-1)
	}
	if err := runs[0].Complete(ctx, idempotency.Outcome{Status: 201}); err != nil {
		t.Fatal(err)
	}
}

func TestDetachedRedemption(t *testing.T) {
	ctx := context.Background()
	seeOther := idempotency.Outcome{Status: 303, Header: map[string][]string{"Location": {"/orders/7"}}, Body: []byte("see other")}
	// A call returns what the step checks: for redemptions the
	// redemption, for finishing calls only the error.
	type call struct {
		name         string
		do           func(f *detached) (idempotency.Redemption, error)
		wantReplayed bool
		wantRun      bool
		wantOut      idempotency.Outcome
		wantErr      error
		advance      time.Duration // before the call
	}
	open := func(mode idempotency.Mode) func(f *detached) (idempotency.Redemption, error) {
		return func(f *detached) (idempotency.Redemption, error) {
			red, err := f.k.RedeemToken(ctx, f.svc, f.tok, "checkout", "alice", mode)
			if red.Run != nil && red.Run.Lease() != "" {
				f.lease = red.Run.Lease()
			}
			return red, err
		}
	}
	finish := func(lease func(f *detached) string, end func(r *idempotency.Run) error) func(f *detached) (idempotency.Redemption, error) {
		return func(f *detached) (idempotency.Redemption, error) {
			r, err := f.k.ResumeToken(f.svc, f.tok, lease(f))
			if err != nil {
				return idempotency.Redemption{}, err
			}
			return idempotency.Redemption{}, end(r)
		}
	}
	completeWith := func(out idempotency.Outcome) func(r *idempotency.Run) error {
		return func(r *idempotency.Run) error { return r.Complete(ctx, out) }
	}
	release := func(r *idempotency.Run) error { return r.Release(ctx) }
	renew := func(r *idempotency.Run) error { _, err := r.Renew(ctx); return err }
	itsLease := func(f *detached) string { return f.lease }
	otherLease := func(*detached) string { return strings.Repeat("0", 32) }
	anyLease := func(*detached) string { return "" }
	tests := []struct {
		name  string
		calls []call
	}{
		{"open, duplicates, complete, replay", []call{
			{name: "open", do: open(idempotency.Detached), wantRun: true},
			{name: "a duplicate", do: open(idempotency.Detached), wantErr: idempotency.ErrInProgress},
			{name: "a plain redeem sees the record", do: open(idempotency.NoRecord), wantErr: idempotency.ErrInProgress},
			{name: "complete by another lease", do: finish(otherLease, completeWith(seeOther)), wantErr: idempotency.ErrNotProcessing},
			{name: "complete", do: finish(itsLease, completeWith(seeOther))},
			{name: "complete twice", do: finish(itsLease, completeWith(seeOther)), wantErr: idempotency.ErrNotProcessing},
			{name: "release after completion", do: finish(itsLease, release), wantErr: idempotency.ErrNotProcessing},
			{name: "a plain redeem gets the outcome", do: open(idempotency.NoRecord), wantReplayed: true, wantOut: seeOther},
			{name: "a recording redeem too", do: open(idempotency.Detached), wantReplayed: true, wantOut: seeOther},
		}},
		{"release gives the token back", []call{
			{name: "open", do: open(idempotency.Detached), wantRun: true},
			{name: "release", do: finish(itsLease, release)},
			{name: "release twice", do: finish(itsLease, release), wantErr: idempotency.ErrNotProcessing},
			{name: "a plain redeem takes it", do: open(idempotency.NoRecord)},
			{name: "then it is used", do: open(idempotency.Detached), wantErr: token.ErrUsed},
		}},
		{"an empty lease ends whatever execution holds the record", []call{
			{name: "open", do: open(idempotency.Detached), wantRun: true},
			{name: "complete", do: finish(anyLease, completeWith(seeOther))},
			{name: "replayed", do: open(idempotency.NoRecord), wantReplayed: true, wantOut: seeOther},
		}},
		{"without a heartbeat the lease ends after the lock TTL and the grace", []call{
			{name: "open", do: open(idempotency.Detached), wantRun: true},
			{name: "inside the lease", do: open(idempotency.Detached), wantErr: idempotency.ErrInProgress, advance: 59 * time.Second},
			{name: "inside the grace", do: open(idempotency.Detached), wantErr: idempotency.ErrInProgress, advance: 60 * time.Second},
			{name: "complete after the grace", do: finish(itsLease, completeWith(seeOther)), wantErr: idempotency.ErrNotProcessing, advance: time.Second},
			{name: "a retry redeems", do: open(idempotency.Detached), wantRun: true},
		}},
		{"a completion inside the grace lands", []call{
			{name: "open", do: open(idempotency.Detached), wantRun: true},
			{name: "complete after the lease", do: finish(itsLease, completeWith(seeOther)), advance: 90 * time.Second},
			{name: "a duplicate is answered", do: open(idempotency.NoRecord), wantReplayed: true, wantOut: seeOther},
		}},
		{"a renewal keeps the lease", []call{
			{name: "open", do: open(idempotency.Detached), wantRun: true},
			{name: "renew", do: finish(itsLease, renew), advance: 50 * time.Second},
			{name: "renew again", do: finish(itsLease, renew), advance: 50 * time.Second},
			{name: "inside the renewed lease and grace", do: open(idempotency.Detached), wantErr: idempotency.ErrInProgress, advance: 110 * time.Second},
			{name: "complete", do: finish(itsLease, completeWith(seeOther))},
		}},
		{"a renewal after the grace is refused", []call{
			{name: "open", do: open(idempotency.Detached), wantRun: true},
			{name: "renew", do: finish(itsLease, renew), wantErr: idempotency.ErrNotProcessing, advance: 2 * time.Minute},
		}},
		{"complete with a body over the cap", []call{
			{name: "open", do: open(idempotency.Detached), wantRun: true},
			{name: "complete", do: finish(itsLease, completeWith(idempotency.Outcome{Status: 200, Body: []byte(strings.Repeat("x", 65))}))},
			{name: "duplicate", do: open(idempotency.NoRecord), wantErr: idempotency.ErrNotStored},
		}},
		{"nothing to finish for a token never opened", []call{
			{name: "complete", do: finish(otherLease, completeWith(seeOther)), wantErr: idempotency.ErrNotProcessing},
			{name: "release", do: finish(otherLease, release), wantErr: idempotency.ErrNotProcessing},
			{name: "the token is untouched", do: open(idempotency.Detached), wantRun: true},
		}},
		{"a lease never given out is refused", []call{
			{name: "not hex", do: finish(func(*detached) string { return strings.Repeat("z", 32) }, release), wantErr: idempotency.ErrBadLease},
			{name: "too short", do: finish(func(*detached) string { return "abc" }, release), wantErr: idempotency.ErrBadLease},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			st := newMemory(t, clk)
			f := &detached{svc: tokens(t, st, clk)}
			f.k = idempotency.New(st, idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute), idempotency.WithMaxBody(64))
			f.tok = issue(t, f.svc)
			for _, c := range tc.calls {
				clk.Advance(c.advance)
				red, err := c.do(f)
				if !errors.Is(err, c.wantErr) || (err == nil) != (c.wantErr == nil) || red.Replayed != c.wantReplayed ||
					(red.Run != nil) != c.wantRun || fmt.Sprint(red.Outcome) != fmt.Sprint(c.wantOut) {
					t.Fatalf("%s: = %+v, %v; want run %v, replayed %v with %+v, %v", c.name, red, err, c.wantRun, c.wantReplayed, c.wantOut, c.wantErr)
				}
				if red.Run != nil && (len(red.Run.Lease()) != 32 || !red.Run.Expires().Equal(clk.Now().Add(time.Minute))) {
					t.Fatalf("%s: lease %q expiring %v; want 32 hex digits expiring in a minute", c.name, red.Run.Lease(), red.Run.Expires())
				}
			}
		})
	}
}

// detached is the state of TestDetachedRedemption's calls.
type detached struct {
	k     *idempotency.Keeper
	svc   *token.Service
	tok   string
	lease string
}

func TestTokenStoreFailure(t *testing.T) {
	tests := []struct {
		name     string
		storeErr error
	}{
		{"an unreachable store", store.Unavailable("test", errors.New("dial tcp 127.0.0.1:1: connection refused"))},
		{"a full store", store.ErrFull},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := newMemory(t, nil)
			tok := issue(t, tokens(t, mem, nil))
			broken := brokenStore{mem, tc.storeErr}
			svc := tokens(t, broken, nil)
			k := idempotency.New(broken)
			for _, mode := range []idempotency.Mode{idempotency.NoRecord, idempotency.Record, idempotency.Detached} {
				if red, err := k.RedeemToken(context.Background(), svc, tok, "checkout", "alice", mode); red.Run != nil || !errors.Is(err, tc.storeErr) {
					t.Fatalf("mode %d: RedeemToken = %+v, %v; want no run and %v", mode, red, err, tc.storeErr)
				}
			}
			if _, err := tokens(t, mem, nil).Redeem(context.Background(), tok, "checkout", "alice"); err != nil {
				t.Fatalf("the token was touched: %v", err)
			}
		})
	}
}
