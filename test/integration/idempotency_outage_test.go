package integration

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/idempotency"
	redisstore "github.com/replayguard/replayguard/store/redis"
)

const (
	// idemOutageTimeout is the store timeout of TestIdempotencyRedisStopped:
	// a stopped Redis refuses connections at once, so it only bounds the
	// calls, generously for a loaded machine.
	idemOutageTimeout = time.Second
	// idemOutageLockTTL is the lease of its records, long enough to
	// outlast a stop and a restart of Redis.
	idemOutageLockTTL = 4 * time.Second
	// idemRestartBound is how long after a restart the store may still
	// fail.
	idemRestartBound = 10 * time.Second
)

// durableRedis makes a disposable Redis write every command to its
// append-only file before answering, so that a restart keeps everything
// it confirmed.
var durableRedis = []string{"--appendonly", "yes", "--appendfsync", "always"}

// openRedisPort is a Redis store on 127.0.0.1:port under prefix, wired as
// cmd/server wires REPLAYGUARD_REDIS_URL with REPLAYGUARD_STORE_TIMEOUT
// set to idemOutageTimeout.
func openRedisPort(t *testing.T, port int, prefix string) *redisstore.Store {
	t.Helper()
	opt, err := goredis.ParseURL("redis://127.0.0.1:" + strconv.Itoa(port) + "/0")
	if err != nil {
		t.Fatal(err)
	}
	opt.ContextTimeoutEnabled = true
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = idemOutageTimeout, idemOutageTimeout, idemOutageTimeout, idemOutageTimeout
	opt.PoolSize = 32
	return redisstore.New(goredis.NewClient(opt), redisstore.WithPrefix(prefix), redisstore.WithTimeout(idemOutageTimeout))
}

// TestIdempotencyRedisStopped stops a disposable Redis (with an
// append-only file, so a restart keeps what it confirmed) under the
// Idempotency-Key middleware and starts it again:
//
//   - while it is down, keyed requests answer 503 store_unavailable and
//     the handler never runs, not even for a key whose response was
//     stored before (the store cannot be read);
//   - after the restart, the key refused during the outage runs exactly
//     once and its duplicates get the replay, and the key completed
//     before the outage still replays instead of running again;
//   - when Redis stops while a handler runs, so that the record cannot
//     be completed, the handler's own response still goes out, marked as
//     nothing but a first answer, after at most the store timeout, and
//     the Keeper keeps trying to complete the record in the background
//     while it renews the lease: after the restart (inside the lease and
//     its grace) duplicates get 409 until the completion lands, then the
//     replay, and the handler never runs a second time.
func TestIdempotencyRedisStopped(t *testing.T) {
	bin := redisServerBinary(t)
	dir, port := t.TempDir(), freePort(t)
	rp := startRedis(t, bin, port, dir, durableRedis...)

	beforeKey, duringKey, midKey := "before-"+randomHex(t, 6), "during-"+randomHex(t, 6), "mid-"+randomHex(t, 6)
	midStarted, midFinish := make(chan struct{}), make(chan struct{})
	var midHeld, midTimedOut atomic.Bool
	app := &orderApp{hold: func(r *http.Request) {
		if r.Header.Get(idempotency.KeyHeader) != strconv.Quote(midKey) || !midHeld.CompareAndSwap(false, true) {
			return
		}
		close(midStarted)
		select {
		case <-midFinish:
		case <-time.After(crashBound):
			midTimedOut.Store(true)
		}
	}}
	s := startIdemServer(t, openRedisPort(t, port, uniquePrefix(t)), app, nil, 16, idempotency.WithLockTTL(idemOutageLockTTL))
	defer func() {
		if t.Failed() {
			t.Logf("redis-server log:\n%s", rp.output())
		}
	}()

	beforeFirst := s.order(t, beforeKey)
	t.Run("before the outage a key runs once and its duplicate gets the replay", func(t *testing.T) {
		wantFresh(t, beforeFirst)
		wantReplayOf(t, beforeFirst, s.order(t, beforeKey))
	})

	rp.stop(t)

	t.Run("while Redis is down keyed requests get 503 and the handler never runs", func(t *testing.T) {
		for range 3 {
			start := time.Now()
			wantStoreUnavailable(t, s.order(t, duringKey))
			if took := time.Since(start); took >= outageBound {
				t.Errorf("took %v, want under %v", took, outageBound)
			}
		}
		for i, a := range s.orders(duringKey, 10) {
			if a.err != nil {
				t.Fatalf("request %d: %v", i, a.err)
			}
			wantStoreUnavailable(t, a.reply)
		}
		if got := app.runs(strconv.Quote(duringKey)); got != 0 {
			t.Errorf("the handler ran %d times during the outage, want 0", got)
		}
	})
	t.Run("while Redis is down a stored key is not replayed either", func(t *testing.T) {
		wantStoreUnavailable(t, s.order(t, beforeKey))
		if got := app.runs(strconv.Quote(beforeKey)); got != 1 {
			t.Errorf("the handler ran %d times for the stored key, want 1", got)
		}
	})

	rp = startRedis(t, bin, port, dir, durableRedis...)
	duringFirst, _ := firstRunAfterRestart(t, s, app, duringKey, 0)

	t.Run("after the restart the refused key runs exactly once", func(t *testing.T) {
		wantFresh(t, duringFirst)
		for i, a := range s.orders(duringKey, 10) {
			if a.err != nil {
				t.Fatalf("duplicate %d: %v", i, a.err)
			}
			wantReplayOf(t, duringFirst, a.reply)
		}
		if got := app.runs(strconv.Quote(duringKey)); got != 1 {
			t.Errorf("the handler ran %d times, want 1", got)
		}
	})
	t.Run("after the restart the key stored before the outage still replays", func(t *testing.T) {
		wantReplayOf(t, beforeFirst, s.order(t, beforeKey))
		if got := app.runs(strconv.Quote(beforeKey)); got != 1 {
			t.Errorf("the handler ran %d times, want 1", got)
		}
	})

	// Redis stops between Acquire and Complete.
	midReply := make(chan reply, 1)
	midErr := make(chan error, 1)
	midSent := time.Now()
	go func() {
		req, err := orderRequest(s.URL, midKey)
		if err != nil {
			midErr <- err
			return
		}
		r, err := send(s.Client, req)
		if err != nil {
			midErr <- err
			return
		}
		midReply <- r
	}()
	select {
	case <-midStarted:
	case err := <-midErr:
		t.Fatalf("POST /orders with key %q: %v", midKey, err)
	case r := <-midReply:
		t.Fatalf("POST /orders with key %q answered %d before its handler started: %s", midKey, r.Status, r.Body)
	case <-time.After(crashBound):
		t.Fatalf("the handler for key %q did not start within %v", midKey, crashBound)
	}
	rp.stop(t)
	close(midFinish)
	var midFirst reply
	select {
	case midFirst = <-midReply:
	case err := <-midErr:
		t.Fatalf("POST /orders with key %q: %v", midKey, err)
	}
	if midTimedOut.Load() {
		t.Fatalf("the handler for key %q was held %v", midKey, crashBound)
	}

	t.Run("a response whose record Redis could not complete still goes out, as a first answer", func(t *testing.T) {
		wantFresh(t, midFirst)
		if got := app.runs(strconv.Quote(midKey)); got != 1 {
			t.Errorf("the handler ran %d times, want 1", got)
		}
	})
	t.Run("its duplicate while Redis is down gets 503", func(t *testing.T) {
		wantStoreUnavailable(t, s.order(t, midKey))
	})

	rp = startRedis(t, bin, port, dir, durableRedis...)
	t.Logf("Redis is back %v after the request with key %q was sent", time.Since(midSent), midKey)
	midReplayed := replayAfterRestart(t, s, app, midKey, midFirst)

	t.Run("after the restart the pending completion lands: duplicates get 409 until then, the replay after, and the handler never runs again", func(t *testing.T) {
		wantReplayOf(t, midFirst, midReplayed)
		wantReplayOf(t, midFirst, s.order(t, midKey))
		if got := app.runs(strconv.Quote(midKey)); got != 1 {
			t.Errorf("the handler ran %d times, want 1", got)
		}
	})
}

// replayAfterRestart sends key to s until it gets the replay of first,
// after Redis restarted, and returns that answer: until then every answer
// must be 503 store_unavailable (the client's connections to the old
// server fail) or 409 request_in_progress (the record is processing while
// its completion is retried), and the handler never runs again.
func replayAfterRestart(t *testing.T, s *idemServer, app *orderApp, key string, first reply) reply {
	t.Helper()
	start := time.Now()
	counts := map[string]int{}
	for {
		r := s.order(t, key)
		if r.Status == first.Status && r.Header.Get(idempotency.ReplayedHeader) == "true" {
			t.Logf("key %q replayed %v after the restart; before that:\n%s", key, time.Since(start), formatCounts(counts))
			return r
		}
		counts[describeOrder(r, nil)]++
		switch r.Status {
		case http.StatusServiceUnavailable:
			wantStoreUnavailable(t, r)
		default:
			wantInProgress(t, r)
		}
		if got := app.runs(strconv.Quote(key)); got != 1 {
			t.Fatalf("the handler ran %d times for key %q on a %d answer, want 1", got, key, r.Status)
		}
		if time.Since(start) > 2*idemOutageLockTTL+idemRestartBound {
			t.Fatalf("key %q still not replayed %v after the restart:\n%s", key, time.Since(start), formatCounts(counts))
		}
		time.Sleep(50 * time.Millisecond) // waiting on another process, or the background completion in this one
	}
}

// firstRunAfterRestart sends key to s until the handler runs for it,
// after Redis restarted, and returns that answer and when it arrived:
// until then every answer
// must be 503 store_unavailable (the client's connections to the old
// server fail) or 409 request_in_progress (a record left processing),
// with the handler's runs for key staying at ran.
func firstRunAfterRestart(t *testing.T, s *idemServer, app *orderApp, key string, ran int) (reply, time.Time) {
	t.Helper()
	start := time.Now()
	counts := map[string]int{}
	for {
		r := s.order(t, key)
		if isFresh(r) {
			at := time.Now()
			t.Logf("key %q ran %v after the restart; before that:\n%s", key, at.Sub(start), formatCounts(counts))
			return r, at
		}
		counts[describeOrder(r, nil)]++
		switch r.Status {
		case http.StatusServiceUnavailable:
			wantStoreUnavailable(t, r)
		default:
			wantInProgress(t, r)
		}
		if got := app.runs(strconv.Quote(key)); got != ran {
			t.Fatalf("the handler ran %d times for key %q on a %d answer, want %d", got, key, r.Status, ran)
		}
		if time.Since(start) > idemOutageLockTTL+idemRestartBound {
			t.Fatalf("key %q still not run %v after the restart:\n%s", key, time.Since(start), formatCounts(counts))
		}
		time.Sleep(50 * time.Millisecond) // waiting on another process, or the lease in it
	}
}
