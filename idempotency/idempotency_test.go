package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newClock returns a fake clock that moves only when told to.
func newClock() *storetest.Clock {
	return storetest.NewClock(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
}

// newMemory returns a memory store on clk (time.Now when nil), closed at
// the end of the test.
func newMemory(t testing.TB, clk *storetest.Clock) *memory.Store {
	t.Helper()
	var opts []memory.Option
	if clk != nil {
		opts = append(opts, memory.WithClock(clk.Now))
	}
	st := memory.New(opts...)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// brokenStore fails every record operation with err.
type brokenStore struct {
	store.Store
	err error
}

func (b brokenStore) Acquire(context.Context, string, string, string, time.Duration) (store.Record, bool, error) {
	return store.Record{}, false, b.err
}

func (b brokenStore) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, b.err
}

// hookStore calls onRenew after every Renew.
type hookStore struct {
	store.Store
	onRenew func(ok bool, err error)
}

func (h hookStore) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	ok, err := h.Store.Renew(ctx, key, owner, lease)
	h.onRenew(ok, err)
	return ok, err
}

// manualTicker returns a ticker function for SetTicker whose ticks are
// sent on the returned channel.
func manualTicker() (chan time.Time, func(time.Duration) (<-chan time.Time, func())) {
	ch := make(chan time.Time)
	return ch, func(time.Duration) (<-chan time.Time, func()) { return ch, func() {} }
}

func ok(body string) func(context.Context) (idempotency.Outcome, error) {
	return func(context.Context) (idempotency.Outcome, error) {
		return idempotency.Outcome{Status: 201, Header: map[string][]string{"Location": {"/orders/7"}}, Body: []byte(body)}, nil
	}
}

func TestDoRunsOncePerKey(t *testing.T) {
	k := idempotency.New(newMemory(t, nil))
	ctx := context.Background()
	var runs atomic.Int32
	fn := func(ctx context.Context) (idempotency.Outcome, error) {
		runs.Add(1)
		return ok("charged")(ctx)
	}
	steps := []struct {
		name         string
		key, fp      string
		wantReplayed bool
		wantErr      error
		wantRuns     int32
	}{
		{"the first call runs", "k1", "fp", false, nil, 1},
		{"a duplicate gets the first outcome without running", "k1", "fp", true, nil, 1},
		{"another duplicate gets it too", "k1", "fp", true, nil, 1},
		{"the same key for another request is refused", "k1", "other", false, idempotency.ErrFingerprintMismatch, 1},
		{"another key runs", "k2", "fp", false, nil, 2},
		{"an empty key is refused before the store is touched", "", "fp", false, idempotency.ErrInvalidKey, 2},
		{"a key the store reserves for token records is refused", store.TokenRecordKey("1"), "fp", false, idempotency.ErrInvalidKey, 2},
		{"so is any key beginning with NUL", "\x00x", "fp", false, idempotency.ErrInvalidKey, 2},
	}
	for _, s := range steps {
		out, replayed, err := k.Do(ctx, s.key, s.fp, fn)
		if !errors.Is(err, s.wantErr) || replayed != s.wantReplayed || runs.Load() != s.wantRuns {
			t.Fatalf("%s: replayed=%v err=%v runs=%d, want %v %v %d", s.name, replayed, err, runs.Load(), s.wantReplayed, s.wantErr, s.wantRuns)
		}
		if err == nil && (out.Status != 201 || string(out.Body) != "charged" || out.Header["Location"][0] != "/orders/7") {
			t.Fatalf("%s: outcome = %+v", s.name, out)
		}
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	const n = 50
	k := idempotency.New(newMemory(t, nil))
	release := make(chan struct{})
	var runs atomic.Int32
	fn := func(context.Context) (idempotency.Outcome, error) {
		runs.Add(1)
		<-release // held until every duplicate has answered
		return idempotency.Outcome{Status: 200, Body: []byte("once")}, nil
	}
	type result struct {
		out      idempotency.Outcome
		replayed bool
		err      error
	}
	results := make(chan result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			out, replayed, err := k.Do(context.Background(), "order-7", "fp", fn)
			results <- result{out, replayed, err}
		})
	}
	close(start)
	var got []result
	for range n - 1 { // the runner is held: the others answer first
		got = append(got, <-results)
	}
	close(release)
	wg.Wait()
	got = append(got, <-results)

	var first, inProgress int
	for _, r := range got {
		switch {
		case r.err == nil && !r.replayed && string(r.out.Body) == "once":
			first++
		case errors.Is(r.err, idempotency.ErrInProgress):
			inProgress++
		default:
			t.Errorf("unexpected result %+v", r)
		}
	}
	if runs.Load() != 1 || first != 1 || inProgress != n-1 {
		t.Fatalf("runs=%d first=%d in progress=%d, want 1 1 %d", runs.Load(), first, inProgress, n-1)
	}
	if out, replayed, err := k.Do(context.Background(), "order-7", "fp", fn); err != nil || !replayed || string(out.Body) != "once" {
		t.Fatalf("after completion: %+v %v %v", out, replayed, err)
	}
}

func TestFailurePolicy(t *testing.T) {
	errCharge := errors.New("card declined by a flaky gateway")
	tests := []struct {
		name string
		// first runs first and must fail in its own way.
		first    func(context.Context) (idempotency.Outcome, error)
		panics   bool
		wantErr  error
		maxBody  int
		wantNext error // what a duplicate after it gets
		// wantRetry: the duplicate runs again.
		wantRetry bool
	}{
		{
			name:      "an error releases the record so the retry runs",
			first:     func(context.Context) (idempotency.Outcome, error) { return idempotency.Outcome{}, errCharge },
			wantErr:   errCharge,
			wantRetry: true,
		},
		{
			name:      "a panic releases the record so the retry runs",
			first:     func(context.Context) (idempotency.Outcome, error) { panic("boom") },
			panics:    true,
			wantRetry: true,
		},
		{
			name:     "an outcome over the cap completes without its body",
			first:    ok(strings.Repeat("x", 11)),
			maxBody:  10,
			wantNext: idempotency.ErrNotStored,
		},
		{
			name:    "an outcome at the cap is stored whole",
			first:   ok(strings.Repeat("x", 10)),
			maxBody: 10,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := idempotency.New(newMemory(t, nil), idempotency.WithMaxBody(tc.maxBody))
			ctx := context.Background()
			var panicked any
			func() {
				defer func() { panicked = recover() }()
				_, _, err := k.Do(ctx, "key", "fp", tc.first)
				if !errors.Is(err, tc.wantErr) {
					t.Errorf("first: err = %v, want %v", err, tc.wantErr)
				}
			}()
			if (panicked != nil) != tc.panics {
				t.Fatalf("panicked = %v, want a panic: %v", panicked, tc.panics)
			}
			ran := false
			out, replayed, err := k.Do(ctx, "key", "fp", func(ctx context.Context) (idempotency.Outcome, error) {
				ran = true
				return ok("retried")(ctx)
			})
			if ran != tc.wantRetry || !errors.Is(err, tc.wantNext) {
				t.Fatalf("duplicate: ran=%v err=%v, want %v %v", ran, err, tc.wantRetry, tc.wantNext)
			}
			switch {
			case errors.Is(err, idempotency.ErrNotStored):
				if out.Status != 201 || !out.BodyOmitted || len(out.Body) != 0 || replayed {
					t.Fatalf("not stored: got %+v replayed=%v, want the status without a body", out, replayed)
				}
			case !tc.wantRetry:
				if !replayed || out.Status != 201 || string(out.Body) != strings.Repeat("x", 10) {
					t.Fatalf("stored: got %+v replayed=%v", out, replayed)
				}
			}
		})
	}
}

func TestStoreFailureRunsNothing(t *testing.T) {
	tests := []struct {
		name     string
		storeErr error
		want     error
	}{
		{"an unreachable store", store.Unavailable("test", errors.New("dial tcp 127.0.0.1:1: connection refused")), store.ErrUnavailable},
		{"a closed store", store.ErrClosed, store.ErrUnavailable},
		{"a full store", store.ErrFull, store.ErrFull},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := idempotency.New(brokenStore{newMemory(t, nil), tc.storeErr})
			ran := false
			_, _, err := k.Do(context.Background(), "key", "fp", func(ctx context.Context) (idempotency.Outcome, error) {
				ran = true
				return ok("x")(ctx)
			})
			if ran || !errors.Is(err, tc.want) || !errors.Is(err, tc.storeErr) {
				t.Fatalf("ran=%v err=%v, want no run and %v wrapping %v", ran, err, tc.want, tc.storeErr)
			}
		})
	}
}

func TestLeaseExpiryLetsOneRetryRun(t *testing.T) {
	clk := newClock()
	k := idempotency.New(newMemory(t, clk), idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
	ctx := context.Background()
	crashed, _, err := k.Start(ctx, "key", "fp") // never finishes: a crash
	if err != nil || crashed == nil {
		t.Fatalf("Start = %v, %v", crashed, err)
	}
	if _, _, err := k.Start(ctx, "key", "fp"); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("inside the lease: err = %v, want ErrInProgress", err)
	}
	clk.Advance(time.Minute)
	if _, _, err := k.Start(ctx, "key", "fp"); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("inside the grace after the lease: err = %v, want ErrInProgress", err)
	}
	clk.Advance(time.Minute) // the lease and the grace (one lease by default)

	const n = 10
	runs := make(chan *idempotency.Run, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			run, _, err := k.Start(ctx, "key", "fp")
			if run != nil {
				runs <- run
			}
			errs <- err
		})
	}
	wg.Wait()
	close(runs)
	close(errs)
	var retries []*idempotency.Run
	for r := range runs {
		retries = append(retries, r)
	}
	inProgress := 0
	for err := range errs {
		if errors.Is(err, idempotency.ErrInProgress) {
			inProgress++
		}
	}
	if len(retries) != 1 || inProgress != n-1 {
		t.Fatalf("after the lease: %d retries and %d in progress, want 1 and %d", len(retries), inProgress, n-1)
	}
	if err := retries[0].Complete(ctx, idempotency.Outcome{Status: 200}); err != nil {
		t.Fatalf("retry Complete = %v", err)
	}
	if err := crashed.Complete(ctx, idempotency.Outcome{Status: 500}); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("the crashed run's late Complete = %v, want ErrLeaseLost", err)
	}
	if _, out, err := k.Start(ctx, "key", "fp"); err != nil || out.Status != 200 {
		t.Fatalf("the retry's outcome is kept: %+v %v", out, err)
	}
}

func TestHeartbeatRenewsTheLease(t *testing.T) {
	clk := newClock()
	renewed := make(chan bool)
	st := hookStore{newMemory(t, clk), func(ok bool, _ error) { renewed <- ok }}
	k := idempotency.New(st, idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
	ticks, ticker := manualTicker()
	idempotency.SetTicker(k, ticker)
	ctx := context.Background()

	run, _, err := k.Start(ctx, "key", "fp")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // three minutes in all, each tick before its lease ends
		clk.Advance(40 * time.Second)
		ticks <- clk.Now()
		if !<-renewed {
			t.Fatalf("renewal %d failed", i)
		}
	}
	clk.Advance(40 * time.Second) // 2m40s after Start, 40s after the last renewal
	if _, _, err := k.Start(ctx, "key", "fp"); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("renewed lease: err = %v, want ErrInProgress", err)
	}
	if err := run.Complete(ctx, idempotency.Outcome{Status: 204}); err != nil {
		t.Fatalf("Complete = %v", err)
	}
}

func TestLostLeaseCancelsTheWork(t *testing.T) {
	clk := newClock()
	renewed := make(chan bool, 1)
	st := hookStore{newMemory(t, clk), func(ok bool, _ error) { renewed <- ok }}
	k := idempotency.New(st, idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
	ticks, ticker := manualTicker()
	idempotency.SetTicker(k, ticker)

	_, _, err := k.Do(context.Background(), "key", "fp", func(ctx context.Context) (idempotency.Outcome, error) {
		clk.Advance(2 * time.Minute) // the process stalled past its lease
		ticks <- clk.Now()
		if <-renewed {
			t.Error("a renewal after the lease ended succeeded")
		}
		<-ctx.Done()
		if cause := context.Cause(ctx); !errors.Is(cause, idempotency.ErrLeaseLost) {
			t.Errorf("cause = %v, want ErrLeaseLost", cause)
		}
		return idempotency.Outcome{Status: 200}, nil
	})
	if !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}
}

func TestRetentionEndsTheRecord(t *testing.T) {
	clk := newClock()
	k := idempotency.New(newMemory(t, clk), idempotency.WithClock(clk.Now), idempotency.WithRetention(time.Hour))
	ctx := context.Background()
	runs := 0
	fn := func(ctx context.Context) (idempotency.Outcome, error) { runs++; return ok("x")(ctx) }
	steps := []struct {
		name    string
		advance time.Duration
		want    int
	}{
		{"first run", 0, 1},
		{"replayed inside the retention", time.Hour - time.Second, 1},
		{"runs again once the retention is over", time.Second, 2},
	}
	for _, s := range steps {
		clk.Advance(s.advance)
		if _, _, err := k.Do(ctx, "key", "fp", fn); err != nil || runs != s.want {
			t.Fatalf("%s: err=%v runs=%d, want %d", s.name, err, runs, s.want)
		}
	}
}

func TestWithKeepsTheStoreAndOverrides(t *testing.T) {
	base := idempotency.New(newMemory(t, nil), idempotency.WithMaxBody(10))
	k := base.With(idempotency.WithLockTTL(time.Second), idempotency.WithRetention(2*time.Second))
	if k.MaxBody() != 10 || k.LockTTL() != time.Second || k.Retention() != 2*time.Second {
		t.Fatalf("With: %d %v %v", k.MaxBody(), k.LockTTL(), k.Retention())
	}
	if base.LockTTL() != idempotency.DefaultLockTTL || base.Retention() != idempotency.DefaultRetention {
		t.Fatalf("With changed its receiver: %v %v", base.LockTTL(), base.Retention())
	}
	zero := idempotency.New(nil, idempotency.WithLockTTL(0), idempotency.WithRetention(-1), idempotency.WithMaxBody(0), idempotency.WithClock(nil))
	if zero.LockTTL() != idempotency.DefaultLockTTL || zero.Retention() != idempotency.DefaultRetention || zero.MaxBody() != idempotency.DefaultMaxBody {
		t.Fatalf("zero options do not keep the defaults")
	}
}

func TestOutcomeRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		out  idempotency.Outcome
	}{
		{"empty", idempotency.Outcome{}},
		{"status only", idempotency.Outcome{Status: 204}},
		{"headers and body", idempotency.Outcome{Status: 201, Header: map[string][]string{
			"Location": {"/orders/7"}, "Vary": {"Accept", "Origin"}, "X-Empty": {""}, "X-None": {},
		}, Body: []byte("{\"id\":7}\n")}},
		{"body omitted", idempotency.Outcome{Status: 200, BodyOmitted: true}},
		{"binary body", idempotency.Outcome{Status: 200, Body: bytes.Repeat([]byte{0, 1, 0xff}, 1000)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idempotency.DecodeOutcome(idempotency.EncodeOutcome(tc.out))
			if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.out) {
				t.Fatalf("round trip = %+v, %v; want %+v", got, err, tc.out)
			}
		})
	}
	good := idempotency.EncodeOutcome(tests[2].out)
	for _, bad := range [][]byte{nil, {1}, {2, 0, 200}, {1, 0, 0x80}, {1, 0, 200, 1, 50, 'L'}, good[:12]} {
		if _, err := idempotency.DecodeOutcome(bad); !errors.Is(err, idempotency.ErrCorrupt) {
			t.Errorf("DecodeOutcome(%q) = %v, want ErrCorrupt", bad, err)
		}
	}
}

func TestParseKey(t *testing.T) {
	tests := []struct {
		name, value, want string
		wantErr           bool
	}{
		{"an sf-string", `"abc"`, "abc", false},
		{"an sf-string with escapes", `"a\"b\\c"`, `a"b\c`, false},
		{"an sf-string with parameters", `"abc";v=1`, "abc", false},
		{"surrounding spaces", `  "abc" `, "abc", false},
		{"a bare UUID", "8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324", false},
		{"a bare token", "abc", "abc", false},
		{"255 characters", `"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255), false},
		{"empty", "", "", true},
		{"an empty sf-string", `""`, "", true},
		{"256 characters", `"` + strings.Repeat("k", 256) + `"`, "", true},
		{"256 bare characters", strings.Repeat("k", 256), "", true},
		{"an unterminated sf-string", `"abc`, "", true},
		{"a non-ASCII sf-string", `"ä"`, "", true},
		{"trailing garbage after an sf-string", `"abc" x`, "", true},
		{"a bare value with a quote", `ab"c`, "", true},
		{"a bare value with a space", "ab c", "", true},
		{"a list", `"a", "b"`, "", true},
		{"a byte sequence", ":YWJj:", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idempotency.ParseKey(tc.value)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q, error %v", tc.value, got, err, tc.want, tc.wantErr)
			}
			if err != nil && !errors.Is(err, idempotency.ErrInvalidKey) {
				t.Fatalf("err = %v, want ErrInvalidKey", err)
			}
		})
	}
}

func ExampleKeeper_Do() {
	st := memory.New()
	defer st.Close()
	keeper := idempotency.New(st)
	charge := func(ctx context.Context) (idempotency.Outcome, error) {
		fmt.Println("charging the card")
		return idempotency.Outcome{Body: []byte("receipt 42")}, nil
	}
	for range 3 { // one message delivered three times
		out, replayed, err := keeper.Do(context.Background(), "msg-1", "fp", charge)
		fmt.Printf("%s replayed=%v err=%v\n", out.Body, replayed, err)
	}
	// Output:
	// charging the card
	// receipt 42 replayed=false err=<nil>
	// receipt 42 replayed=true err=<nil>
	// receipt 42 replayed=true err=<nil>
}

func TestTinyLeaseStillHeartbeats(t *testing.T) {
	k := idempotency.New(newMemory(t, nil), idempotency.WithLockTTL(time.Nanosecond))
	_, _, err := k.Do(context.Background(), "key", "fp", ok("x"))
	if err != nil && !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("Do = %v", err)
	}
}

// TestCompleteInAFullStoreOmitsTheBody: when a bounded store has no room
// for the response, the record still completes, without it, so that a
// duplicate gets ErrNotStored instead of running again after the lease.
func TestCompleteInAFullStoreOmitsTheBody(t *testing.T) {
	st := memory.New(memory.WithMaxBytes(64 << 10)) // records: 32 KiB
	t.Cleanup(func() { _ = st.Close() })
	k := idempotency.New(st)
	ctx := context.Background()
	big := strings.Repeat("x", 48<<10)
	out, replayed, err := k.Do(ctx, "k", "fp", func(context.Context) (idempotency.Outcome, error) {
		return idempotency.Outcome{Status: 201, Header: map[string][]string{"Location": {"/orders/7"}}, Body: []byte(big)}, nil
	})
	if err != nil || replayed || len(out.Body) != len(big) {
		t.Fatalf("first = %d bytes, %v, %v; want the whole outcome", len(out.Body), replayed, err)
	}
	out, _, err = k.Do(ctx, "k", "fp", func(context.Context) (idempotency.Outcome, error) {
		t.Fatal("the duplicate ran")
		return idempotency.Outcome{}, nil
	})
	if !errors.Is(err, idempotency.ErrNotStored) || out.Status != 201 {
		t.Fatalf("duplicate = %+v, %v; want status 201 with ErrNotStored", out, err)
	}
}
