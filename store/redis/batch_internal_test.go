package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// heldPipe is a pipeliner whose sends wait until release is closed. It
// records the commands of every send and answers each with its own
// first argument after the command name, or fails them all with fail.
type heldPipe struct {
	release chan struct{}
	fail    error

	mu        sync.Mutex
	sends     [][]string  // command names and first args, per send
	piped     []bool      // whether each send was a pipeline
	deadlines []time.Time // each send's context's deadline (zero: none)
	retryable int         // pipelined commands go-redis would send again after a failure
	panicPipe bool        // pipelined sends panic
	entry     chan struct{}
}

func newHeldPipe() *heldPipe {
	return &heldPipe{release: make(chan struct{}), entry: make(chan struct{}, 100)}
}

func (h *heldPipe) run(ctx context.Context, cmds []goredis.Cmder, piped bool) {
	h.entry <- struct{}{}
	<-h.release
	h.mu.Lock()
	defer h.mu.Unlock()
	if piped && h.panicPipe {
		panic("a client bug")
	}
	d, _ := ctx.Deadline()
	h.deadlines = append(h.deadlines, d)
	var names []string
	for _, c := range cmds {
		if piped && !c.NoRetry() {
			h.retryable++
		}
		if once, ok := c.(sentOnce); ok {
			c = once.Cmder
		}
		names = append(names, fmt.Sprint(c.Args()[1]))
		switch {
		case h.fail != nil:
			c.SetErr(h.fail)
		default:
			c.(*goredis.StatusCmd).SetVal(fmt.Sprint(c.Args()[1]))
		}
	}
	h.sends = append(h.sends, names)
	h.piped = append(h.piped, piped)
}

func (h *heldPipe) Process(ctx context.Context, cmd goredis.Cmder) error {
	h.run(ctx, []goredis.Cmder{cmd}, false)
	return cmd.Err()
}

func (h *heldPipe) Pipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	var cmds []goredis.Cmder
	_ = fn(&recordingPipeliner{cmds: &cmds})
	h.run(ctx, cmds, true)
	return cmds, nil
}

// recordingPipeliner collects the commands Process is given.
type recordingPipeliner struct {
	goredis.Pipeliner
	cmds *[]goredis.Cmder
}

func (r *recordingPipeliner) Process(_ context.Context, cmd goredis.Cmder) error {
	*r.cmds = append(*r.cmds, cmd)
	return nil
}

// waitQueued waits until b holds n queued commands.
func waitQueued(t *testing.T, b *batch, n int) {
	t.Helper()
	for i := 0; ; i++ {
		b.mu.Lock()
		l := len(b.queue)
		b.mu.Unlock()
		if l == n {
			return
		}
		if i > 1e6 {
			t.Fatalf("queue holds %d commands, want %d", l, n)
		}
		// Yield to the callers' goroutines; no sleep stands in for a signal.
		runtime.Gosched()
	}
}

func call(ctx context.Context, b *batch, name string) (string, error) {
	cmd := goredis.NewStatusCmd(ctx, "set", name)
	if err := b.do(ctx, cmd); err != nil {
		return "", err
	}
	return cmd.Val(), cmd.Err()
}

func TestBatch(t *testing.T) {
	t.Run("a panic in a pipelined send fails its calls, and the batch goes on", func(t *testing.T) {
		h := newHeldPipe()
		h.panicPipe = true
		b := newBatch(h, 1, false)
		first := make(chan error, 1)
		go func() { _, err := call(context.Background(), b, "first"); first <- err }()
		<-h.entry // the first send (alone, not piped) is in flight, held
		results := make(chan error, 2)
		for _, name := range []string{"a", "b"} {
			go func() { _, err := call(context.Background(), b, name); results <- err }()
		}
		waitQueued(t, b, 2)
		close(h.release)
		if err := <-first; err != nil {
			t.Fatalf("first: %v", err)
		}
		for range 2 {
			if err := <-results; err == nil || !strings.Contains(err.Error(), "panicked") {
				t.Errorf("a call of the panicking pipeline got %v, want its error", err)
			}
		}
		if got, err := call(context.Background(), b, "after"); err != nil || got != "after" {
			t.Fatalf("a call after the panic: %q, %v", got, err)
		}
	})
	t.Run("a lone command is sent at once, on its own", func(t *testing.T) {
		h := newHeldPipe()
		close(h.release)
		b := newBatch(h, 1, false)
		got, err := call(context.Background(), b, "a")
		if err != nil || got != "a" {
			t.Fatalf("got %q, %v", got, err)
		}
		if len(h.sends) != 1 || h.piped[0] {
			t.Fatalf("sends %v piped %v, want one unpipelined send", h.sends, h.piped)
		}
	})

	t.Run("commands queued while a pipeline is in flight share the next one, and each gets its own reply", func(t *testing.T) {
		h := newHeldPipe()
		b := newBatch(h, 1, false)
		type result struct {
			name, got string
			err       error
		}
		results := make(chan result, 11)
		go func() { got, err := call(context.Background(), b, "first"); results <- result{"first", got, err} }()
		<-h.entry // the first send is in flight, held
		for i := range 10 {
			name := fmt.Sprint("k", i)
			go func() { got, err := call(context.Background(), b, name); results <- result{name, got, err} }()
		}
		waitQueued(t, b, 10)
		close(h.release)
		for range 11 {
			r := <-results
			if r.err != nil || r.got != r.name {
				t.Errorf("%s: got %q, %v", r.name, r.got, r.err)
			}
		}
		if len(h.sends) != 2 || len(h.sends[1]) != 10 || !h.piped[1] {
			t.Fatalf("sends %v piped %v, want the first alone then one pipeline of 10", h.sends, h.piped)
		}
		// A pipeline that failed partway must fail its calls, never be
		// sent again (running again commands whose replies were read).
		if h.retryable != 0 {
			t.Errorf("%d pipelined commands go-redis may send again", h.retryable)
		}
	})

	t.Run("a call that gives up before its command is taken never sends it", func(t *testing.T) {
		h := newHeldPipe()
		b := newBatch(h, 1, false)
		done := make(chan error, 2)
		go func() { _, err := call(context.Background(), b, "first"); done <- err }()
		<-h.entry
		ctx, cancel := context.WithCancel(context.Background())
		go func() { _, err := call(ctx, b, "gives-up"); done <- err }()
		waitQueued(t, b, 1)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("the call that gave up returned %v, want context.Canceled", err)
		}
		close(h.release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// The flusher takes the queue (one abandoned command) and sends nothing.
		b.mu.Lock()
		for b.running > 0 {
			b.mu.Unlock()
			runtime.Gosched()
			b.mu.Lock()
		}
		b.mu.Unlock()
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.sends) != 1 {
			t.Fatalf("sends %v, want only the first", h.sends)
		}
	})

	t.Run("a failed pipeline fails every call in it", func(t *testing.T) {
		h := newHeldPipe()
		h.fail = errors.New("connection reset")
		b := newBatch(h, 1, false)
		errs := make(chan error, 6)
		go func() { _, err := call(context.Background(), b, "first"); errs <- err }()
		<-h.entry
		for i := range 5 {
			go func() { _, err := call(context.Background(), b, fmt.Sprint(i)); errs <- err }()
		}
		waitQueued(t, b, 5)
		close(h.release)
		for range 6 {
			if err := <-errs; err == nil || err.Error() != "connection reset" {
				t.Errorf("got %v, want the pipeline's error", err)
			}
		}
	})

}

// idle waits until b has no sender running.
func idle(t *testing.T, b *batch) {
	t.Helper()
	for i := 0; ; i++ {
		b.mu.Lock()
		n := b.running
		b.mu.Unlock()
		if n == 0 {
			return
		}
		if i > 1e6 {
			t.Fatalf("%d senders still running", n)
		}
		runtime.Gosched()
	}
}

// storeCtx is the context of a store call under parent whose store
// deadline is d, as Store.begin makes it.
func storeCtx(parent context.Context, d time.Time) context.Context {
	return &callContext{Context: parent, deadline: d}
}

// until is a context whose own deadline is d, canceled when t ends.
func until(t *testing.T, d time.Time) context.Context {
	ctx, cancel := context.WithDeadline(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestDeadlineOf(t *testing.T) {
	now := time.Now()
	early, late := now.Add(time.Minute), now.Add(time.Hour)
	type key struct{}
	tests := []struct {
		name  string
		ctx   func(t *testing.T) context.Context
		want  time.Time
		byCtx bool
	}{
		{"none", func(*testing.T) context.Context { return context.Background() }, time.Time{}, false},
		{"the context's own", func(t *testing.T) context.Context { return until(t, early) }, early, true},
		{"the store's", func(*testing.T) context.Context { return storeCtx(context.Background(), early) }, early, false},
		{"the store's, before the context's", func(t *testing.T) context.Context { return storeCtx(until(t, late), early) }, early, false},
		{"the context's, before the store's", func(t *testing.T) context.Context { return storeCtx(until(t, early), late) }, early, true},
		{"the store's, under a context derived from the call's", func(t *testing.T) context.Context {
			return context.WithValue(storeCtx(until(t, late), early), key{}, 1)
		}, early, false},
		{"a derived context's own, before the store's", func(t *testing.T) context.Context {
			ctx, cancel := context.WithDeadline(storeCtx(context.Background(), late), early)
			t.Cleanup(cancel)
			return ctx
		}, early, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, byCtx := deadlineOf(tc.ctx(t))
			if !d.Equal(tc.want) || byCtx != tc.byCtx {
				t.Fatalf("deadlineOf = %v, %v; want %v, %v", d, byCtx, tc.want, tc.byCtx)
			}
		})
	}
}

func TestPipelineDeadline(t *testing.T) {
	now := time.Now()
	at := func(m int) time.Time { return now.Add(time.Duration(m) * time.Minute) }
	byStore := func(m int) *waiter { return &waiter{deadline: at(m)} }
	byCtx := func(m int) *waiter { return &waiter{deadline: at(m), byCtx: true} }
	none := &waiter{}
	tests := []struct {
		name string
		ws   []*waiter
		want time.Time
	}{
		{"the earliest of the store's deadlines", []*waiter{byStore(3), byStore(1), byStore(2)}, at(1)},
		{"not cut short by a context's earlier deadline, which releases its own call", []*waiter{byStore(2), byCtx(1), byStore(3)}, at(2)},
		{"the store's before a context's later one", []*waiter{byCtx(5), byStore(2)}, at(2)},
		{"the store's, with a command that has none", []*waiter{none, byStore(2)}, at(2)},
		{"only contexts' deadlines: the latest", []*waiter{byCtx(1), byCtx(3), byCtx(2)}, at(3)},
		{"contexts' deadlines and a command that has none: none", []*waiter{byCtx(1), none}, time.Time{}},
		{"none", []*waiter{none}, time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := pipelineDeadline(tc.ws); !got.Equal(tc.want) {
				t.Fatalf("pipelineDeadline = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestBatchDeadlines checks how each call's deadline is kept without a
// context of its own: which sends run under which deadline, and which
// queued calls arm a timer.
func TestBatchDeadlines(t *testing.T) {
	t.Run("a lone call's send has its store deadline and does not end with its caller's context", func(t *testing.T) {
		d := time.Now().Add(time.Hour)
		parent, cancel := context.WithCancel(context.Background())
		defer cancel()
		type key struct{}
		parent = context.WithValue(parent, key{}, "v")
		var sctx context.Context
		var errAfterCancel error
		p := processFunc(func(ctx context.Context) {
			sctx = ctx
			cancel()
			errAfterCancel = ctx.Err()
		})
		if err := newBatch(p, 1, false).do(storeCtx(parent, d), goredis.NewStatusCmd(parent, "set", "a")); err != nil {
			t.Fatal(err)
		}
		if got, ok := sctx.Deadline(); !ok || !got.Equal(d) {
			t.Errorf("send deadline = %v, %v; want %v", got, ok, d)
		}
		if errAfterCancel != nil || sctx.Value(key{}) != "v" {
			t.Errorf("send context: err %v after the caller's was canceled (want nil: not seen), value %v (want the caller's)", errAfterCancel, sctx.Value(key{}))
		}
	})

	t.Run("a lone call whose context's deadline comes first sends under that context", func(t *testing.T) {
		d := time.Now().Add(time.Minute)
		ctx := storeCtx(until(t, d), d.Add(time.Hour))
		var sctx context.Context
		p := processFunc(func(ctx context.Context) { sctx = ctx })
		if err := newBatch(p, 1, false).do(ctx, goredis.NewStatusCmd(ctx, "set", "a")); err != nil {
			t.Fatal(err)
		}
		if sctx != ctx {
			t.Errorf("sent under %v, want the call's own context", sctx)
		}
	})

	t.Run("a pipeline runs until the earliest store deadline among its commands", func(t *testing.T) {
		h := newHeldPipe()
		b := newBatch(h, 1, false)
		base := time.Now().Add(time.Hour)
		done := make(chan error, 4)
		go func() {
			done <- b.do(storeCtx(context.Background(), base), goredis.NewStatusCmd(context.Background(), "set", "first"))
		}()
		<-h.entry
		for i, m := range []int{3, 1, 2} {
			ctx := storeCtx(context.Background(), base.Add(time.Duration(m)*time.Minute))
			go func() { done <- b.do(ctx, goredis.NewStatusCmd(ctx, "set", fmt.Sprint(i))) }()
		}
		waitQueued(t, b, 3)
		close(h.release)
		for range 4 {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		if len(h.deadlines) != 2 || !h.deadlines[1].Equal(base.Add(time.Minute)) {
			t.Fatalf("send deadlines %v, want the lone call's then %v", h.deadlines, base.Add(time.Minute))
		}
		if n := b.timers.Load(); n != 0 {
			t.Fatalf("%d queued calls armed a timer, want none: the send ahead ends first", n)
		}
	})

	now := time.Now()
	at := func(h int) time.Time { return now.Add(time.Duration(h) * time.Hour) }
	tests := []struct {
		name     string
		strict   bool
		inFlight time.Time // the store deadline of the lone call in flight
		// the queued call's context's own deadline and its store deadline
		// (zero: none)
		ctxDeadline, storeDeadline time.Time
		timer                      bool
	}{
		{"queued behind a send that ends by its deadline: no timer", false, at(1), time.Time{}, at(2), false},
		{"queued behind a send that may end after its deadline: a timer", false, at(2), time.Time{}, at(1), true},
		{"its context's own deadline releases it: no timer", false, at(2), at(1), at(3), false},
		{"no deadline: no timer", false, at(1), time.Time{}, time.Time{}, false},
		{"strict (a client that may not bound a send by its deadline): a timer", true, at(1), time.Time{}, at(2), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHeldPipe()
			b := newBatch(h, 1, tc.strict)
			done := make(chan error, 2)
			go func() {
				done <- b.do(storeCtx(context.Background(), tc.inFlight), goredis.NewStatusCmd(context.Background(), "set", "first"))
			}()
			<-h.entry
			parent := context.Background()
			if !tc.ctxDeadline.IsZero() {
				parent = until(t, tc.ctxDeadline)
			}
			parent, cancel := context.WithCancel(parent)
			ctx := parent
			if !tc.storeDeadline.IsZero() {
				ctx = storeCtx(parent, tc.storeDeadline)
			}
			go func() { done <- b.do(ctx, goredis.NewStatusCmd(ctx, "set", "queued")) }()
			waitQueued(t, b, 1)
			cancel() // releases the queued call
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("queued call = %v, want context.Canceled", err)
			}
			if got := b.timers.Load() == 1; got != tc.timer {
				t.Errorf("armed a timer: %v, want %v", got, tc.timer)
			}
			close(h.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}

	t.Run("a timer gives up at the call's deadline, and its command is never sent", func(t *testing.T) {
		h := newHeldPipe()
		b := newBatch(h, 1, false)
		done := make(chan error, 1)
		go func() {
			done <- b.do(storeCtx(context.Background(), time.Now().Add(time.Hour)), goredis.NewStatusCmd(context.Background(), "set", "first"))
		}()
		<-h.entry
		ctx := storeCtx(context.Background(), time.Now().Add(20*time.Millisecond))
		if err := b.do(ctx, goredis.NewStatusCmd(ctx, "set", "late")); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("queued call = %v, want context.DeadlineExceeded", err)
		}
		close(h.release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		idle(t, b)
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.sends) != 1 {
			t.Fatalf("sends %v, want only the first", h.sends)
		}
	})
}

// processFunc is a pipeliner whose sends report their context and
// succeed at once.
type processFunc func(ctx context.Context)

func (f processFunc) Process(ctx context.Context, _ goredis.Cmder) error { f(ctx); return nil }
func (f processFunc) Pipelined(ctx context.Context, _ func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	f(ctx)
	return nil, nil
}
