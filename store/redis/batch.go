package redis

import (
	"context"
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
// of them instead of one each. There is no timer. A call that finds no
// command queued and fewer than flushers sends in flight sends its own at
// once, as Process would: a lone call pays nothing. Otherwise it queues
// its command, and starts a flush when fewer than flushers sends are in
// flight; a flush takes every command queued by then, sends them as one
// pipeline, and goes on with whatever was queued meanwhile until the
// queue is empty. So under load the calls that arrive while a send is
// in flight share the next one.
//
// Each call keeps its own deadline and its own error: it waits for its
// command or for its context, whichever ends first. A command whose call
// gave up before any pipeline took it is never sent. A pipeline runs
// until the latest deadline among its commands. A pipeline that fails
// sets the error on every command whose reply it did not read (go-redis
// does), so each of those calls fails closed; a reply read is that
// command's own outcome, never another's.
type batch struct {
	client   pipeliner
	flushers int

	mu      sync.Mutex
	queue   []*waiter
	spare   []*waiter // the queue's previous array, reused
	running int
}

// waiter is one call's command in a batch.
type waiter struct {
	cmd      goredis.Cmder
	deadline time.Time
	state    atomic.Int32 // queued, taken or abandoned
	done     chan struct{}
}

const (
	queued int32 = iota
	taken
	abandoned
)

func newBatch(c pipeliner, flushers int) *batch {
	return &batch{client: c, flushers: max(flushers, 1)}
}

// do sends cmd and waits until its reply has been read or ctx ends. In
// the latter case it returns ctx's error and never touches cmd again (a
// pipeline may still be writing it): the command was then either never
// sent or its outcome is unknown.
//
// A call that finds nothing queued and a pipeline free sends its command
// itself, under its own context, as Process would; the others queue
// theirs for the pipelines.
func (b *batch) do(ctx context.Context, cmd goredis.Cmder) error {
	b.mu.Lock()
	if len(b.queue) == 0 && b.running < b.flushers {
		b.running++
		b.mu.Unlock()
		// Deferred, so that even a panic (recovered by the caller's
		// handler) gives the send back instead of leaving every later
		// call queued behind it.
		defer func() {
			b.mu.Lock()
			b.handOn()
		}()
		_ = b.client.Process(ctx, cmd) // its outcome is cmd's
		return nil
	}
	w := &waiter{cmd: cmd, done: make(chan struct{})}
	w.deadline, _ = ctx.Deadline()
	b.queue = append(b.queue, w)
	start := b.running < b.flushers
	if start {
		b.running++
	}
	b.mu.Unlock()
	if start {
		go b.flush()
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		w.state.CompareAndSwap(queued, abandoned) // if not yet taken, it never will be
		return ctx.Err()
	}
}

// handOn ends a send, with b.mu held, and unlocks it: what was queued
// meanwhile goes on in a flush of its own.
func (b *batch) handOn() {
	if len(b.queue) > 0 {
		b.mu.Unlock()
		go b.flush()
		return
	}
	b.running--
	b.mu.Unlock()
}

// flush sends pipelines until the queue is empty.
func (b *batch) flush() {
	b.mu.Lock()
	for len(b.queue) > 0 {
		q := b.queue
		b.queue, b.spare = b.spare[:0], nil
		b.mu.Unlock()
		b.send(q)
		clear(q)
		b.mu.Lock()
		if b.spare == nil {
			b.spare = q[:0]
		}
	}
	b.running--
	b.mu.Unlock()
}

// send sends the live commands of q as one pipeline and wakes their calls.
func (b *batch) send(q []*waiter) {
	live := q[:0]
	var deadline time.Time
	for _, w := range q {
		if !w.state.CompareAndSwap(queued, taken) {
			continue // its call gave up: never sent
		}
		live = append(live, w)
		if w.deadline.After(deadline) {
			deadline = w.deadline
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	}
	if len(live) == 1 {
		_ = b.client.Process(ctx, live[0].cmd)
	} else {
		_, _ = b.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for _, w := range live {
				_ = p.Process(ctx, w.cmd)
			}
			return nil
		})
	}
	cancel()
	for _, w := range live {
		close(w.done)
	}
}

// batchWriter is the writer (and redis_rate's client) that sends its
// commands through a batch. Each method builds the command exactly as
// go-redis's own method of that name does.
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
	return bw.client.ScriptExists(ctx, hashes...)
}

// ScriptLoad implements goredis.Scripter, unbatched.
func (bw batchWriter) ScriptLoad(ctx context.Context, script string) *goredis.StringCmd {
	return bw.client.ScriptLoad(ctx, script)
}

// Del is for redis_rate's client interface, unbatched.
func (bw batchWriter) Del(ctx context.Context, keys ...string) *goredis.IntCmd {
	return bw.client.Del(ctx, keys...)
}

// SetArgs sends SET key value with the options the store uses (PX and a
// mode such as NX); the others are sent unbatched.
func (bw batchWriter) SetArgs(ctx context.Context, key string, value any, a goredis.SetArgs) *goredis.StatusCmd {
	if a.KeepTTL || !a.ExpireAt.IsZero() || a.Get || a.TTL%time.Millisecond != 0 {
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
