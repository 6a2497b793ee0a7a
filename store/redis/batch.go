package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// pipeliner is the part of a client that batch sends commands with.
// *goredis.Client, *goredis.ClusterClient (which splits a pipeline by
// node and sends each part to its node) and *goredis.Ring have it.
type pipeliner interface {
	Process(ctx context.Context, cmd goredis.Cmder) error
	Pipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error)
}

// batch coalesces the commands that concurrent calls send at the same
// moment into one pipeline: one write and one read on each side for all
// of them instead of one each. Nothing waits for more commands to come:
// a call that finds no command queued and fewer than flushers sends in
// flight sends its own at once, as Process would, and a lone call pays
// nothing. Otherwise it queues its command, and starts a flush when
// fewer than flushers sends are in flight; a flush takes every command
// queued by then, sends them as one pipeline, and goes on with whatever
// was queued meanwhile until the queue is empty. So under load the calls
// that arrive while a send is in flight share the next one.
//
// Each call keeps its own error: a pipeline that fails sets the error on
// every command whose reply it did not read (go-redis does), so each of
// those calls fails closed; a reply read is that command's own outcome,
// never another's. A command whose call gave up before any pipeline took
// it is never sent.
//
// Each call keeps its own deadline without a context of its own (a
// context.WithTimeout per call costs a timer and, under a request's
// context, registering with it; issue 13). A call's deadline (see
// deadlineOf) is either its context's own, which releases it by
// ctx.Done as it always did, or the store's, now + the timeout at the
// call's start, which nothing but the sends bound:
//
//   - a pipeline runs under the earliest store deadline among its
//     commands (pipelineDeadline), so each such command's outcome is read
//     or failed by its own deadline. A command taken with others that
//     started a little earlier can be cut short by that spread (it fails
//     closed, a little early); never run late. The client must bound a
//     send's I/O by its context's deadline (ContextTimeoutEnabled); when
//     it may not, the batch is strict (below).
//   - a queued call waits for no pipeline that outlasts its deadline.
//     The first send to start after it was queued takes its command (a
//     flush takes the whole queue, and no lone call sends while anything
//     is queued), under a deadline no later than the call's. That send
//     starts as soon as one of the running senders is free, which each
//     is by the deadline of the send it is running (ends). So a call
//     queued while a sender is free, or while some send in flight ends by
//     the call's deadline, has its outcome in time and needs no timer.
//     That is the usual case: the commands of a send in flight were
//     queued before this call's, by calls that started before it, with
//     the same timeout. Only a call whose deadline comes before the end
//     of every send in flight (it spent long between its start and its
//     queueing: preempted, or a script's EVAL after a NOSCRIPT reply)
//     arms a timer of its own, and gives up at its deadline.
//   - a lone call sends its command under WithDeadline(WithoutCancel(ctx),
//     deadline): the deadline, without registering with ctx (or under
//     ctx itself, when the deadline is ctx's own). The caller's
//     cancellation is then not seen while its command is in flight. It
//     hardly was before: go-redis bounds socket reads and writes by the
//     deadline alone, and watches ctx.Done only while it waits for a
//     pooled connection, dials, or pauses between retries. A redemption
//     cancelled in flight has an unknown outcome either way, and the
//     call still ends by its deadline.
type batch struct {
	client   pipeliner
	flushers int
	// strict makes every queued call bound by the store's deadline arm a
	// timer of its own: for a client that may not bound a send by its
	// context's deadline (ContextTimeoutEnabled unset, or not known).
	strict bool

	mu      sync.Mutex
	queue   []*waiter
	spare   []*waiter // the queue's previous array, reused
	running int
	// ends holds, for each of the running senders, the time by which its
	// send in flight ends, or its last one ended (its deadline; the zero
	// time: none). A sender about to take the queue may hold any time.
	ends []time.Time

	timers atomic.Int64 // queued calls that armed a timer, for tests
}

// waiter is one call's command in a batch.
type waiter struct {
	cmd      goredis.Cmder
	deadline time.Time    // the call's (deadlineOf); zero: none
	byCtx    bool         // deadline is the call's context's own
	state    atomic.Int32 // queued, taken or abandoned
	done     chan struct{}
}

const (
	queued int32 = iota
	taken
	abandoned
)

func newBatch(c pipeliner, flushers int, strict bool) *batch {
	return &batch{client: c, flushers: max(flushers, 1), strict: strict}
}

// callContext is the context of a store call on the batched path (see
// Store.begin): the caller's ctx, whose values, cancellation and
// deadline it keeps unchanged, and the store's deadline for the call,
// now + the store's timeout at its start, which only deadlineOf reads.
// It makes no context of its own, so that it costs no timer and no
// registration with ctx.
type callContext struct {
	context.Context
	deadline time.Time
}

// callKey is the key under which a callContext's Value is itself.
type callKey struct{}

// Value implements context.Context.
func (c *callContext) Value(key any) any {
	if key == (callKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// deadlineOf is the deadline of a command sent under ctx: the earlier of
// ctx's own deadline (byCtx: ctx.Done releases its call at it) and the
// store's deadline of the call ctx belongs to, if any. Zero: none.
func deadlineOf(ctx context.Context) (d time.Time, byCtx bool) {
	d, byCtx = ctx.Deadline()
	c, ok := ctx.(*callContext)
	if !ok {
		c, ok = ctx.Value(callKey{}).(*callContext)
	}
	if ok && (!byCtx || c.deadline.Before(d)) {
		return c.deadline, false
	}
	return d, byCtx
}

// exact returns ctx bounded by its deadline (deadlineOf) as a context of
// its own, for a command that leaves through the client rather than the
// batch, and so needs its deadline in its context.
func exact(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, byCtx := deadlineOf(ctx); !byCtx && !d.IsZero() {
		return context.WithDeadline(ctx, d)
	}
	return ctx, nop
}

func nop() {}

// do sends cmd and waits until its reply has been read, or its deadline
// (deadlineOf) has passed or ctx has ended. In the latter cases it
// returns the error of the context (context.DeadlineExceeded for the
// store's deadline) and never touches cmd again (a pipeline may still be
// writing it): the command was then either never sent or its outcome is
// unknown. Otherwise cmd holds its reply or the error of its send.
//
// A call that finds nothing queued and a sender free sends its command
// itself, under its deadline, as Process would; the others queue theirs
// for the pipelines.
func (b *batch) do(ctx context.Context, cmd goredis.Cmder) error {
	d, byCtx := deadlineOf(ctx)
	b.mu.Lock()
	if len(b.queue) == 0 && b.running < b.flushers {
		b.running++
		b.ends = append(b.ends, d)
		b.mu.Unlock()
		// Deferred, so that even a panic (recovered by the caller's
		// handler) gives the send back instead of leaving every later
		// call queued behind it.
		defer func() {
			b.mu.Lock()
			b.handOn(d)
		}()
		sctx := ctx
		if !byCtx && !d.IsZero() {
			// Without registering with ctx (see batch).
			var cancel context.CancelFunc
			sctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), d)
			defer cancel()
		}
		_ = b.client.Process(sctx, cmd) // its outcome is cmd's
		return nil
	}
	w := &waiter{cmd: cmd, deadline: d, byCtx: byCtx, done: make(chan struct{})}
	b.queue = append(b.queue, w)
	start := b.running < b.flushers
	if start {
		b.running++
		b.ends = append(b.ends, d) // the new flush takes the queue at once
	}
	// ctx.Done releases a call at a deadline of its ctx's own; a call
	// queued while a sender is free, or while a send in flight ends by its
	// deadline, is sent by then (see batch).
	arm := !byCtx && !d.IsZero() && (b.strict || !start && !b.endsBy(d))
	b.mu.Unlock()
	if start {
		go b.flush(d)
	}
	var expired <-chan time.Time
	if arm {
		b.timers.Add(1)
		t := time.NewTimer(time.Until(d))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		w.state.CompareAndSwap(queued, abandoned) // if not yet taken, it never will be
		return ctx.Err()
	case <-expired:
		w.state.CompareAndSwap(queued, abandoned)
		return context.DeadlineExceeded
	}
}

// endsBy reports, with b.mu held, whether some running sender is free by
// d: its send in flight, if any, ends by then.
func (b *batch) endsBy(d time.Time) bool {
	for _, e := range b.ends {
		if !e.IsZero() && !e.After(d) {
			return true
		}
	}
	return false
}

// setEnd replaces, with b.mu held, a running sender's end from with to.
func (b *batch) setEnd(from, to time.Time) {
	for i, e := range b.ends {
		if e.Equal(from) {
			b.ends[i] = to
			return
		}
	}
}

// stop ends, with b.mu held, a running sender whose end is end.
func (b *batch) stop(end time.Time) {
	b.running--
	for i, e := range b.ends {
		if e.Equal(end) {
			last := len(b.ends) - 1
			b.ends[i] = b.ends[last]
			b.ends = b.ends[:last]
			return
		}
	}
}

// handOn ends a lone send, whose end is end, with b.mu held, and unlocks
// it: what was queued meanwhile goes on in a flush of its own.
func (b *batch) handOn(end time.Time) {
	if len(b.queue) > 0 {
		b.mu.Unlock()
		go b.flush(end)
		return
	}
	b.stop(end)
	b.mu.Unlock()
}

// flush sends pipelines until the queue is empty. end is the sender's
// entry in b.ends.
func (b *batch) flush(end time.Time) {
	b.mu.Lock()
	for len(b.queue) > 0 {
		q := b.queue
		b.queue, b.spare = b.spare[:0], nil
		live, d := take(q)
		if len(live) > 0 {
			b.setEnd(end, d)
			end = d
			b.mu.Unlock()
			b.send(live, d)
		} else {
			b.mu.Unlock()
		}
		clear(q)
		b.mu.Lock()
		if b.spare == nil {
			b.spare = q[:0]
		}
	}
	b.stop(end)
	b.mu.Unlock()
}

// take marks the commands of q whose calls still wait as taken, and
// returns them (in q's array) with the deadline of the pipeline that
// sends them: pipelineDeadline.
func take(q []*waiter) ([]*waiter, time.Time) {
	live := q[:0]
	for _, w := range q {
		if w.state.CompareAndSwap(queued, taken) {
			live = append(live, w)
		} // else its call gave up: never sent
	}
	return live, pipelineDeadline(live)
}

// pipelineDeadline is the deadline of a pipeline of ws: the earliest
// store deadline among them, so that each of those calls has its
// command's outcome by its own deadline. The calls whose deadline is
// their context's own are released by it: they need not cut the others
// short, and bound the pipeline only when none is bound by the store,
// with the latest of their deadlines, so that as many outcomes as
// possible are read (the zero time, none, if one has no deadline).
func pipelineDeadline(ws []*waiter) time.Time {
	var first, last time.Time
	unbounded := false
	for _, w := range ws {
		switch {
		case w.deadline.IsZero():
			unbounded = true
		case !w.byCtx:
			if first.IsZero() || w.deadline.Before(first) {
				first = w.deadline
			}
		case w.deadline.After(last):
			last = w.deadline
		}
	}
	switch {
	case !first.IsZero():
		return first
	case unbounded:
		return time.Time{}
	}
	return last
}

// send sends the commands of live as one pipeline under the deadline d
// (the zero time: none) and wakes their calls.
func (b *batch) send(live []*waiter, d time.Time) {
	// Not under any one call's context: the pipeline is all of theirs.
	// context.Background has no Done: WithDeadline registers with nothing.
	ctx, cancel := context.Background(), context.CancelFunc(nop)
	if !d.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, d)
	}
	defer func() {
		cancel()
		// A panic in the client (go-redis's own, or a hook's) happens on
		// this goroutine, where no handler would recover it and the whole
		// process would end: it fails this send's calls instead, whose
		// commands' outcomes are then unknown, and the batch goes on.
		if v := recover(); v != nil {
			err := fmt.Errorf("pipeline send panicked: %v", v)
			for _, w := range live {
				w.cmd.SetErr(err)
			}
		}
		for _, w := range live {
			close(w.done)
		}
	}()
	if len(live) == 1 {
		_ = b.client.Process(ctx, live[0].cmd)
		return
	}
	_, _ = b.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		for _, w := range live {
			_ = p.Process(ctx, sentOnce{w.cmd})
		}
		return nil
	})
}

// batchWriter is the writer (and redis_rate's client) that sends its
// commands through a batch. Each method builds the command exactly as
// go-redis's own method of that name does. The few it sends through the
// client instead run under exact(ctx), their call's deadline.
type batchWriter struct {
	b      *batch
	client Client // for the calls that are not batched
}

var _ writer = batchWriter{}

func (bw batchWriter) eval(ctx context.Context, name, payload string, keys []string, args []any) *goredis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, payload, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := goredis.NewCmd(ctx, a...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	if err := bw.b.do(ctx, cmd); err != nil {
		cmd = goredis.NewCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd
}

// Eval implements goredis.Scripter.
func (bw batchWriter) Eval(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return bw.eval(ctx, "eval", script, keys, args)
}

// EvalSha implements goredis.Scripter.
func (bw batchWriter) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return bw.eval(ctx, "evalsha", sha1, keys, args)
}

// EvalRO implements goredis.Scripter.
func (bw batchWriter) EvalRO(ctx context.Context, script string, keys []string, args ...any) *goredis.Cmd {
	return bw.eval(ctx, "eval_ro", script, keys, args)
}

// EvalShaRO implements goredis.Scripter.
func (bw batchWriter) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *goredis.Cmd {
	return bw.eval(ctx, "evalsha_ro", sha1, keys, args)
}

// ScriptExists implements goredis.Scripter, unbatched.
func (bw batchWriter) ScriptExists(ctx context.Context, hashes ...string) *goredis.BoolSliceCmd {
	ctx, cancel := exact(ctx)
	defer cancel()
	return bw.client.ScriptExists(ctx, hashes...)
}

// ScriptLoad implements goredis.Scripter, unbatched.
func (bw batchWriter) ScriptLoad(ctx context.Context, script string) *goredis.StringCmd {
	ctx, cancel := exact(ctx)
	defer cancel()
	return bw.client.ScriptLoad(ctx, script)
}

// Del is for redis_rate's client interface, unbatched.
func (bw batchWriter) Del(ctx context.Context, keys ...string) *goredis.IntCmd {
	ctx, cancel := exact(ctx)
	defer cancel()
	return bw.client.Del(ctx, keys...)
}

// SetArgs sends SET key value with the options the store uses (PX and a
// mode such as NX); the others are sent unbatched.
func (bw batchWriter) SetArgs(ctx context.Context, key string, value any, a goredis.SetArgs) *goredis.StatusCmd {
	if a.KeepTTL || !a.ExpireAt.IsZero() || a.Get || a.TTL%time.Millisecond != 0 {
		ctx, cancel := exact(ctx)
		defer cancel()
		return bw.client.SetArgs(ctx, key, value, a)
	}
	args := make([]any, 3, 6)
	args[0], args[1], args[2] = "set", key, value
	if a.TTL > 0 {
		args = append(args, "px", int64(a.TTL/time.Millisecond))
	}
	if a.Mode != "" {
		args = append(args, a.Mode)
	}
	cmd := goredis.NewStatusCmd(ctx, args...)
	if err := bw.b.do(ctx, cmd); err != nil {
		cmd = goredis.NewStatusCmd(ctx)
		cmd.SetErr(err)
	}
	return cmd
}

// sentOnce is a pipelined command go-redis must not send again. When a
// pipeline fails partway (a connection reset after some replies), go-redis
// re-sends the whole pipeline on a new connection, by default: the
// commands of other calls whose replies it had read would run a second
// time and their replies be replaced by the second run's (a redeemed
// token answering Absent, a fresh nonce answering replayed). go-redis
// never re-sends a pipeline that holds a command whose NoRetry is true
// (cmdsContainNoRetry in its redis.go and osscluster.go): the pipeline's
// calls then fail closed with its error instead.
type sentOnce struct{ goredis.Cmder }

// NoRetry implements goredis.Cmder.
func (sentOnce) NoRetry() bool { return true }
