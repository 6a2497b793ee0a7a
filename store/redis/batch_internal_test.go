package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
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

	mu    sync.Mutex
	sends [][]string // command names and first args, per send
	piped []bool     // whether each send was a pipeline
	entry chan struct{}
}

func newHeldPipe() *heldPipe {
	return &heldPipe{release: make(chan struct{}), entry: make(chan struct{}, 100)}
}

func (h *heldPipe) run(cmds []goredis.Cmder, piped bool) {
	h.entry <- struct{}{}
	<-h.release
	h.mu.Lock()
	defer h.mu.Unlock()
	var names []string
	for _, c := range cmds {
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

func (h *heldPipe) Process(_ context.Context, cmd goredis.Cmder) error {
	h.run([]goredis.Cmder{cmd}, false)
	return cmd.Err()
}

func (h *heldPipe) Pipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	var cmds []goredis.Cmder
	_ = fn(&recordingPipeliner{cmds: &cmds})
	h.run(cmds, true)
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
	t.Run("a lone command is sent at once, on its own", func(t *testing.T) {
		h := newHeldPipe()
		close(h.release)
		b := newBatch(h, 1)
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
		b := newBatch(h, 1)
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
	})

	t.Run("a call that gives up before its command is taken never sends it", func(t *testing.T) {
		h := newHeldPipe()
		b := newBatch(h, 1)
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
		b := newBatch(h, 1)
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

	t.Run("a pipeline runs until the latest deadline among its commands", func(t *testing.T) {
		var got time.Time
		p := deadlinePipe(func(ctx context.Context) { got, _ = ctx.Deadline() })
		b := newBatch(p, 1)
		late := time.Now().Add(time.Hour)
		w1 := &waiter{cmd: goredis.NewStatusCmd(context.Background(), "set", "a"), deadline: late.Add(-time.Minute), done: make(chan struct{})}
		w2 := &waiter{cmd: goredis.NewStatusCmd(context.Background(), "set", "b"), deadline: late, done: make(chan struct{})}
		b.send([]*waiter{w1, w2})
		if !got.Equal(late) {
			t.Fatalf("pipeline deadline %v, want %v", got, late)
		}
	})
}

// deadlinePipe is a pipeliner that reports the context of each send.
type deadlinePipe func(ctx context.Context)

func (d deadlinePipe) Process(ctx context.Context, _ goredis.Cmder) error { d(ctx); return nil }
func (d deadlinePipe) Pipelined(ctx context.Context, _ func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	d(ctx)
	return nil, nil
}
