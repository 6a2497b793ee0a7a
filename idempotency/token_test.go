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
)

var checkout = store.Token{Purpose: "checkout", Subject: "alice"}

// putToken stores a token under id that lives an hour from now, as
// token.Service.Issue would.
func putToken(t *testing.T, st store.Store, now time.Time, id string) {
	t.Helper()
	if ok, err := st.PutToken(context.Background(), id, checkout, now.Add(time.Hour)); err != nil || !ok {
		t.Fatalf("PutToken(%s) = %v, %v", id, ok, err)
	}
}

func TestStartToken(t *testing.T) {
	ctx := context.Background()
	seeOther := idempotency.Outcome{Status: 303, Header: map[string][]string{"Location": {"/orders/7"}}}
	// Each step runs StartToken for the token "1" (unless id is set) and
	// then, when it got a run, ends it with finish.
	type step struct {
		name      string
		id        string
		want      store.Token
		wantRes   store.RedeemResult
		wantErr   error
		wantRun   bool
		wantOut   idempotency.Outcome
		finish    func(run *idempotency.Run) error
		finishErr error
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
			{name: "first redeems and runs", wantRes: store.Redeemed, wantRun: true, finish: complete(seeOther)},
			{name: "duplicate gets the outcome", wantRes: store.Recorded, wantOut: seeOther},
			{name: "and again", wantRes: store.Recorded, wantOut: seeOther},
		}},
		{"a duplicate while running is in progress", nil, []step{
			{name: "first holds its run", wantRes: store.Redeemed, wantRun: true, finish: hold},
			{name: "duplicate", wantRes: store.Recorded, wantErr: idempotency.ErrInProgress},
		}},
		{"a released run gives the token back once", nil, []step{
			{name: "first releases", wantRes: store.Redeemed, wantRun: true, finish: release},
			{name: "retry runs", wantRes: store.Redeemed, wantRun: true, finish: complete(seeOther)},
			{name: "then it is recorded", wantRes: store.Recorded, wantOut: seeOther},
		}},
		{"an outcome over the cap is recorded without its body", []idempotency.Option{idempotency.WithMaxBody(4)}, []step{
			{name: "first", wantRes: store.Redeemed, wantRun: true, finish: complete(idempotency.Outcome{Status: 200, Body: []byte("too long")})},
			{name: "duplicate", wantRes: store.Recorded, wantErr: idempotency.ErrNotStored, wantOut: idempotency.Outcome{Status: 200, BodyOmitted: true}},
		}},
		{"the token's own refusals come back as results", nil, []step{
			{name: "another purpose", want: store.Token{Purpose: "login", Subject: "alice"}, wantRes: store.PurposeMismatch},
			{name: "another subject", want: store.Token{Purpose: "checkout", Subject: "bob"}, wantRes: store.SubjectMismatch},
			{name: "a token never issued", id: "2", wantRes: store.Absent},
			{name: "an empty ID", id: "-", wantErr: idempotency.ErrInvalidKey},
			{name: "the token stayed valid", wantRes: store.Redeemed, wantRun: true, finish: complete(seeOther)},
			{name: "a mismatch on the record", want: store.Token{Purpose: "checkout"}, wantRes: store.SubjectMismatch},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			st := newMemory(t, clk)
			k := idempotency.New(st, append([]idempotency.Option{idempotency.WithClock(clk.Now)}, tc.opts...)...)
			putToken(t, st, clk.Now(), "1")
			var held []*idempotency.Run
			for _, s := range tc.steps {
				id, want := s.id, s.want
				switch id {
				case "":
					id = "1"
				case "-":
					id = ""
				}
				if want == (store.Token{}) {
					want = checkout
				}
				run, out, res, err := k.StartToken(ctx, id, want)
				if res != s.wantRes || !errors.Is(err, s.wantErr) || (err == nil) != (s.wantErr == nil) || (run != nil) != s.wantRun ||
					fmt.Sprint(out) != fmt.Sprint(s.wantOut) {
					t.Fatalf("%s: StartToken = run %v, %+v, %v, %v; want run %v, %+v, %v, %v", s.name, run != nil, out, res, err, s.wantRun, s.wantOut, s.wantRes, s.wantErr)
				}
				if run != nil {
					if err := s.finish(run); !errors.Is(err, s.finishErr) {
						t.Fatalf("%s: finishing = %v, want %v", s.name, err, s.finishErr)
					}
					held = append(held, run)
				}
			}
			for _, r := range held {
				_ = r.Release(ctx) // stop the heartbeats of held runs
			}
		})
	}
}

func TestStartTokenHeartbeatRenewsTheRecord(t *testing.T) {
	clk := newClock()
	renewed := make(chan bool)
	mem := newMemory(t, clk)
	st := hookStore{mem, func(ok bool, _ error) { renewed <- ok }}
	k := idempotency.New(st, idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
	ticks, ticker := manualTicker()
	idempotency.SetTicker(k, ticker)
	ctx := context.Background()
	putToken(t, mem, clk.Now(), "1")
	run, _, _, err := k.StartToken(ctx, "1", checkout)
	if err != nil || run == nil {
		t.Fatalf("StartToken = %v, %v", run, err)
	}
	for i := range 3 {
		clk.Advance(40 * time.Second)
		ticks <- clk.Now()
		if !<-renewed {
			t.Fatalf("renewal %d failed", i)
		}
	}
	clk.Advance(40 * time.Second) // 2m40s after the redemption
	if _, _, res, err := k.StartToken(ctx, "1", checkout); res != store.Recorded || !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("renewed lease: %v, %v; want Recorded, ErrInProgress", res, err)
	}
	if err := run.Complete(ctx, idempotency.Outcome{Status: 204}); err != nil {
		t.Fatalf("Complete = %v", err)
	}
}

func TestStartTokenConcurrentDuplicatesRunOnce(t *testing.T) {
	const n = 50
	st := newMemory(t, nil)
	k := idempotency.New(st)
	ctx := context.Background()
	putToken(t, st, time.Now(), "1")
	type result struct {
		run *idempotency.Run
		res store.RedeemResult
		err error
	}
	results := make(chan result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			run, _, res, err := k.StartToken(ctx, "1", checkout)
			results <- result{run, res, err}
		})
	}
	close(start)
	wg.Wait()
	close(results)
	var runs []*idempotency.Run
	inProgress := 0
	for r := range results {
		switch {
		case r.run != nil && r.res == store.Redeemed && r.err == nil:
			runs = append(runs, r.run)
		case r.res == store.Recorded && errors.Is(r.err, idempotency.ErrInProgress):
			inProgress++
		default:
			t.Errorf("unexpected result %v, %v", r.res, r.err)
		}
	}
	if len(runs) != 1 || inProgress != n-1 {
		t.Fatalf("%d runs, %d in progress; want 1 and %d", len(runs), inProgress, n-1)
	}
	if err := runs[0].Complete(ctx, idempotency.Outcome{Status: 201}); err != nil {
		t.Fatal(err)
	}
}

func TestOpenToken(t *testing.T) {
	ctx := context.Background()
	const owner = "api:1"
	seeOther := idempotency.Outcome{Status: 303, Header: map[string][]string{"Location": {"/orders/7"}}, Body: []byte("see other")}
	type call struct {
		name    string
		do      func(k *idempotency.Keeper) (idempotency.Outcome, store.RedeemResult, error)
		wantRes store.RedeemResult
		wantOut idempotency.Outcome
		wantErr error
		advance time.Duration // before the call
	}
	open := func(owner string) func(k *idempotency.Keeper) (idempotency.Outcome, store.RedeemResult, error) {
		return func(k *idempotency.Keeper) (idempotency.Outcome, store.RedeemResult, error) {
			return k.OpenToken(ctx, "1", checkout, owner)
		}
	}
	completeAs := func(owner string, out idempotency.Outcome) func(k *idempotency.Keeper) (idempotency.Outcome, store.RedeemResult, error) {
		return func(k *idempotency.Keeper) (idempotency.Outcome, store.RedeemResult, error) {
			return idempotency.Outcome{}, 0, k.CompleteToken(ctx, "1", owner, out)
		}
	}
	releaseAs := func(owner string) func(k *idempotency.Keeper) (idempotency.Outcome, store.RedeemResult, error) {
		return func(k *idempotency.Keeper) (idempotency.Outcome, store.RedeemResult, error) {
			return idempotency.Outcome{}, 0, k.ReleaseToken(ctx, "1", owner)
		}
	}
	tests := []struct {
		name  string
		calls []call
	}{
		{"open, duplicates, complete, replay", []call{
			{name: "open", do: open(owner), wantRes: store.Redeemed},
			{name: "the same owner again is a duplicate", do: open(owner), wantRes: store.Recorded, wantErr: idempotency.ErrInProgress},
			{name: "a plain redeem sees the record", do: open(""), wantRes: store.Recorded, wantErr: idempotency.ErrInProgress},
			{name: "complete by another owner", do: completeAs("api:2", seeOther), wantErr: idempotency.ErrNotProcessing},
			{name: "complete", do: completeAs(owner, seeOther)},
			{name: "complete twice", do: completeAs(owner, seeOther), wantErr: idempotency.ErrNotProcessing},
			{name: "release after completion", do: releaseAs(owner), wantErr: idempotency.ErrNotProcessing},
			{name: "a plain redeem gets the outcome", do: open(""), wantRes: store.Recorded, wantOut: seeOther},
			{name: "a recording redeem too", do: open(owner), wantRes: store.Recorded, wantOut: seeOther},
		}},
		{"release gives the token back", []call{
			{name: "open", do: open(owner), wantRes: store.Redeemed},
			{name: "release", do: releaseAs(owner)},
			{name: "release twice", do: releaseAs(owner), wantErr: idempotency.ErrNotProcessing},
			{name: "a plain redeem takes it", do: open(""), wantRes: store.Redeemed},
			{name: "then it is gone", do: open(owner), wantRes: store.Absent},
		}},
		{"without a heartbeat the lease ends after the lock TTL", []call{
			{name: "open", do: open(owner), wantRes: store.Redeemed},
			{name: "inside the lease", do: open(owner), wantRes: store.Recorded, wantErr: idempotency.ErrInProgress, advance: 59 * time.Second},
			{name: "complete after the lease", do: completeAs(owner, seeOther), wantErr: idempotency.ErrNotProcessing, advance: time.Second},
			{name: "a retry redeems", do: open(owner), wantRes: store.Redeemed},
		}},
		{"complete with a body over the cap", []call{
			{name: "open", do: open(owner), wantRes: store.Redeemed},
			{name: "complete", do: completeAs(owner, idempotency.Outcome{Status: 200, Body: []byte(strings.Repeat("x", 65))})},
			{name: "duplicate", do: open(""), wantRes: store.Recorded, wantErr: idempotency.ErrNotStored, wantOut: idempotency.Outcome{Status: 200, BodyOmitted: true}},
		}},
		{"nothing to finish for a token never opened", []call{
			{name: "complete", do: completeAs(owner, seeOther), wantErr: idempotency.ErrNotProcessing},
			{name: "release", do: releaseAs(owner), wantErr: idempotency.ErrNotProcessing},
			{name: "the token is untouched", do: open(owner), wantRes: store.Redeemed},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			st := newMemory(t, clk)
			k := idempotency.New(st, idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute), idempotency.WithMaxBody(64))
			putToken(t, st, clk.Now(), "1")
			for _, c := range tc.calls {
				clk.Advance(c.advance)
				out, res, err := c.do(k)
				if res != c.wantRes || !errors.Is(err, c.wantErr) || (err == nil) != (c.wantErr == nil) || fmt.Sprint(out) != fmt.Sprint(c.wantOut) {
					t.Fatalf("%s: = %+v, %v, %v; want %+v, %v, %v", c.name, out, res, err, c.wantOut, c.wantRes, c.wantErr)
				}
			}
		})
	}
}

func TestTokenStoreFailure(t *testing.T) {
	tests := []struct {
		name     string
		storeErr error
		want     error
	}{
		{"an unreachable store", errors.New("dial tcp 127.0.0.1:1: connection refused"), idempotency.ErrUnavailable},
		{"a full store", store.ErrFull, idempotency.ErrStoreFull},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := newMemory(t, nil)
			putToken(t, mem, time.Now(), "1")
			k := idempotency.New(brokenStore{mem, tc.storeErr})
			run, _, _, err := k.StartToken(context.Background(), "1", checkout)
			if run != nil || !errors.Is(err, tc.want) || !errors.Is(err, tc.storeErr) {
				t.Fatalf("StartToken = run %v, %v; want none and %v", run != nil, err, tc.want)
			}
			if _, _, err := k.OpenToken(context.Background(), "1", checkout, "api:1"); !errors.Is(err, tc.want) {
				t.Fatalf("OpenToken = %v, want %v", err, tc.want)
			}
			if res, err := mem.RedeemToken(context.Background(), "1", checkout); res != store.Redeemed || err != nil {
				t.Fatalf("the token was touched: %v, %v", res, err)
			}
		})
	}
}
