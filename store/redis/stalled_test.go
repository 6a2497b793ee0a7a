package redis_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/store/storetest"
)

// TestStalledRedis checks that a pipelined call ends, with an error
// wrapping store.ErrUnavailable, within its deadline (plus a generous
// margin) when Redis stops answering on connections that stay open,
// whether it sent its command itself or queued it for a pipeline: the
// queued calls make no context of their own, and only the deadline of
// the pipeline's context, which go-redis applies to its reads and
// writes (ContextTimeoutEnabled), can end them. The client's own
// timeouts are a minute, far beyond the bound checked. Redis is a
// private server (or one-node cluster), SIGSTOPped.
func TestStalledRedis(t *testing.T) {
	t.Parallel() // private servers
	bin := testenv.RedisServer(t)
	const long = time.Minute // the client's own timeouts
	tests := []struct {
		name  string
		start func(t *testing.T) (client goredis.UniversalClient, stop *goredis.Client)
	}{
		{"redis", func(t *testing.T) (goredis.UniversalClient, *goredis.Client) {
			p := testenv.StartRedis(t, bin)
			return goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true,
				DialTimeout: long, ReadTimeout: long, WriteTimeout: long, PoolTimeout: long}), node(t, p)
		}},
		{"cluster", func(t *testing.T) (goredis.UniversalClient, *goredis.Client) {
			p := testenv.StartRedis(t, bin, "--cluster-enabled", "yes",
				"--cluster-port", strconv.Itoa(testenv.FreePort(t)), "--cluster-node-timeout", "5000")
			n := node(t, p)
			if err := n.ClusterAddSlotsRange(context.Background(), 0, 16383).Err(); err != nil {
				t.Fatal(err)
			}
			pollUntil(t, p.Addr()+" cluster_state:ok", func(ctx context.Context) error {
				info, err := n.ClusterInfo(ctx).Result()
				if err != nil {
					return err
				}
				if !strings.Contains(info, "cluster_state:ok") {
					return errors.New("cluster_state is not ok")
				}
				return nil
			})
			return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{p.Addr()}, ContextTimeoutEnabled: true,
				DialTimeout: long, ReadTimeout: long, WriteTimeout: long, PoolTimeout: long}), n
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const (
				timeout = 2 * time.Second // the store's
				short   = timeout / 4     // one caller's own deadline
				margin  = 2 * time.Second // generous: the bound is what matters
			)
			client, stop := tc.start(t)
			pipelines := &pipelineCounter{}
			client.AddHook(pipelines)
			s := redis.New(client, redis.WithPrefix(uniquePrefix(t)), redis.WithTimeout(timeout), redis.WithPipelining(2))
			defer s.Close()
			// A request's context: cancelable, and never canceled here.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tok := store.Token{Purpose: "p"}
			id, key := storetest.ID(), storetest.ID()
			ops := map[string]func(ctx context.Context) error{
				"Put": func(ctx context.Context) error { _, err := s.Put(ctx, storetest.ID(), tok, time.Minute); return err },
				"Redeem": func(ctx context.Context) error {
					_, _, err := s.Redeem(ctx, id, tok, "o", time.Minute)
					return err
				},
				"Acquire": func(ctx context.Context) error {
					_, _, err := s.Acquire(ctx, key, "fp", "o", time.Minute)
					return err
				},
				"Renew": func(ctx context.Context) error { _, err := s.Renew(ctx, key, "o", time.Minute); return err },
				"Complete": func(ctx context.Context) error {
					_, err := s.Complete(ctx, key, "o", []byte("r"), time.Minute)
					return err
				},
				"Release": func(ctx context.Context) error { _, err := s.Release(ctx, key, "o"); return err },
				"Lookup": func(ctx context.Context) error {
					_, _, err := s.Lookup(ctx, key)
					return err
				},
				"Allow": func(ctx context.Context) error {
					_, _, err := s.Allow(ctx, key, store.Limit{Rate: 1, Burst: 1, Period: time.Second})
					return err
				},
			}
			for name, op := range ops { // loads every script, and the cluster's slots
				if err := op(ctx); err != nil {
					t.Fatalf("%s before Redis stalled: %v", name, err)
				}
			}
			stopped(t, stop)

			type result struct {
				name  string
				err   error
				took  time.Duration
				bound time.Duration
			}
			results := make(chan result, len(ops)+3)
			run := func(name string, ctx context.Context, bound time.Duration, op func(context.Context) error) {
				go func() {
					start := time.Now()
					err := op(ctx)
					results <- result{name, err, time.Since(start), bound}
				}()
			}
			// Two calls take both senders and send their commands
			// themselves; the server never answers them.
			// staged waits until cond holds, and reports false if a call
			// ends first: the two below then did not stay in flight while
			// the others queued (a machine stalled for the whole timeout).
			staged := func(cond func(running, queued int) bool) bool {
				for {
					if running, queued, _ := s.BatchState(); cond(running, queued) {
						return true
					}
					if len(results) > 0 {
						return false
					}
					// Yield to the callers' goroutines; no sleep stands in for a signal.
					runtime.Gosched()
				}
			}
			run("lone Redeem", ctx, timeout, ops["Redeem"])
			run("lone Put", ctx, timeout, ops["Put"])
			ok := staged(func(running, _ int) bool { return running == 2 })
			// The others queue behind them, with later deadlines: no
			// timers, only the pipeline's deadline ends them. One has a
			// deadline of its context's own, which ends it sooner.
			for name, op := range ops {
				run("queued "+name, ctx, timeout, op)
			}
			shortCtx, cancelShort := context.WithTimeout(ctx, short)
			defer cancelShort()
			run("queued Redeem with a deadline of its own", shortCtx, short, ops["Redeem"])
			ok = ok && staged(func(_, queued int) bool { return queued == len(ops)+1 })
			for range len(ops) + 3 {
				r := <-results
				if !errors.Is(r.err, store.ErrUnavailable) {
					t.Errorf("%s on a stalled Redis = %v, want an error wrapping store.ErrUnavailable", r.name, r.err)
				}
				if r.took > r.bound+margin {
					t.Errorf("%s took %v: its deadline (%v) did not bound it", r.name, r.took, r.bound)
				}
			}
			if !ok {
				t.Log("the two first calls ended before the others had queued behind them: which path each took is not checked")
				return
			}
			if _, _, timers := s.BatchState(); timers != 0 {
				t.Errorf("%d queued calls armed a timer; want none (the sends ahead of them end first)", timers)
			}
			if pipelines.n.Load() == 0 {
				t.Error("no pipeline was sent: the queued calls must have been")
			}
		})
	}
}

// pipelineCounter is a go-redis hook that counts the pipelines a client
// sends.
type pipelineCounter struct{ n atomic.Int64 }

func (h *pipelineCounter) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *pipelineCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *pipelineCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}
