package redis_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/store/storetest"
)

// Environment variables naming the shared Sentinel deployment of CI.
const (
	envSentinelAddrs  = "REPLAYGUARD_TEST_REDIS_SENTINEL_ADDRS"  // host:port,host:port,...
	envSentinelMaster = "REPLAYGUARD_TEST_REDIS_SENTINEL_MASTER" // the master's name
)

// noMaintNotifications is the setting WithMinReplicas asks of a client
// (see its documentation).
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// setupTimeout bounds how long a test waits for its private servers to
// link up.
const setupTimeout = 30 * time.Second

// stallTimeout is the store timeout of the calls that must fail because
// no replica acknowledges them: each waits it out, less waitMargin,
// with WAIT. What the test waits for first is the change's own script,
// which must finish inside it for the failure to be ErrNotReplicated
// rather than a plain timeout: on a loaded two-core machine under -race
// a script's round trip has been seen to take 300ms, so a few hundred
// milliseconds would be a race with the machine's load. Calls that must
// succeed get loadedTimeout instead.
const stallTimeout = 2 * time.Second

func newFailoverClient(t testing.TB) *goredis.Client {
	t.Helper()
	return goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:            server(t, envSentinelMaster),
		SentinelAddrs:         strings.Split(server(t, envSentinelAddrs), ","),
		ContextTimeoutEnabled: true,
		ReadTimeout:           contextOnly,
		WriteTimeout:          contextOnly,
	})
}

// TestConformanceSentinel runs the conformance suite on a FailoverClient,
// as the server's REPLAYGUARD_REDIS_SENTINEL_ADDRS wires it: once as
// usual, and once with WithMinReplicas(1), so that every change the suite
// makes is confirmed with WAIT by the deployment's replica.
func TestConformanceSentinel(t *testing.T) {
	server(t, envSentinelAddrs)
	server(t, envSentinelMaster)
	for _, tc := range []struct {
		name string
		opts []redis.Option
	}{
		{"acknowledged by the master", nil},
		{"acknowledged by a replica", []redis.Option{redis.WithMinReplicas(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Instance {
				_, in := realInstance(t, newFailoverClient(t), tc.opts...)
				return in
			})
		})
	}
}

// node is a client to one private server, for setting it up.
func node(t testing.TB, p *testenv.RedisProcess) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pollUntil calls check until it returns nil, every 20ms, and fails t with
// its last error when setupTimeout passes first.
func pollUntil(t testing.TB, what string, check func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within %v: %v", what, setupTimeout, err)
		case <-time.After(20 * time.Millisecond): // polling other processes
		}
	}
}

// waitLinked waits until the replica behind c reports its link to the
// master up.
func waitLinked(t testing.TB, c *goredis.Client) {
	t.Helper()
	pollUntil(t, "replica "+c.Options().Addr+" linked", func(ctx context.Context) error {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return errors.New("master_link_status is not up")
		}
		return nil
	})
}

// waitOnline waits until the master behind c counts a replica as
// online: after a full sync the master counts it only once it has
// acknowledged the end of the sync, up to a second after the replica
// reports its link up. WAIT on a connection that has written nothing
// waits for exactly that (and needs no key, so it works on a Cluster
// node before the cluster is ok).
func waitOnline(t testing.TB, c *goredis.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if n, err := c.Wait(ctx, 1, setupTimeout-time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1 on %s = %d, %v: no replica online", c.Options().Addr, n, err)
	}
}

// stopped SIGSTOPs the server behind c, as a replica that stops reading
// its master's stream, and returns the function that resumes it (also
// called when the test ends). Its connections stay open: WAIT still
// counts it among the connected replicas, and waits for its
// acknowledgement.
func stopped(t *testing.T, c *goredis.Client) (resume func()) {
	t.Helper()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(info, "\nprocess_id:")
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]))
	if err != nil || pid <= 0 {
		t.Fatalf("no process_id in INFO server of %s", c.Options().Addr)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "replica stopped", func(context.Context) error {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return nil // no /proc: SIGSTOP takes effect at once anyway
		}
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) == 0 || f[0] != "T" {
			return fmt.Errorf("process %d state %v", pid, f)
		}
		return nil
	})
	done := false
	resume = func() {
		if !done {
			done = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// outcome is how one call went.
type outcome struct {
	err  error
	took time.Duration
}

// changes makes one of each change on s, every one of which must succeed
// and alter something, under keys of its own unique to tag; and Allow.
// An outcome's error is non-nil when the call failed or changed nothing.
// Calls on different keys run concurrently, those on one key in order:
// a change that waits out its WAIT delays only the changes after it on
// its key.
func changes(ctx context.Context, s *redis.Store, tag string) map[string]outcome {
	tok := store.Token{Purpose: "p"}
	id, rec, key := "c-"+tag, "r-"+tag, "k-"+tag
	var mu sync.Mutex
	out := map[string]outcome{}
	call := func(name string, f func() (bool, error)) {
		start := time.Now()
		ok, err := f()
		if err == nil && !ok {
			err = errors.New("changed nothing")
		}
		mu.Lock()
		out[name] = outcome{err, time.Since(start)}
		mu.Unlock()
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		call("Put", func() (bool, error) { return s.Put(ctx, id, tok, time.Minute) })
		call("Redeem", func() (bool, error) {
			res, _, err := s.Redeem(ctx, id, tok, "", 0)
			return res == store.Redeemed, err
		})
	})
	wg.Go(func() {
		call("Put nonce", func() (bool, error) { return s.Put(ctx, store.NonceKey("k", tag), store.Token{}, time.Minute) })
	})
	wg.Go(func() {
		call("Put the record's token", func() (bool, error) { return s.Put(ctx, rec, tok, time.Minute) })
		call("Redeem with a record", func() (bool, error) {
			res, _, err := s.Redeem(ctx, rec, tok, "o", time.Minute)
			return res == store.Redeemed, err
		})
		call("Complete a token's record", func() (bool, error) {
			return s.Complete(ctx, store.TokenRecordKey(rec), "o", []byte("done"), time.Minute)
		})
	})
	wg.Go(func() {
		call("Acquire", func() (bool, error) {
			_, ok, err := s.Acquire(ctx, key, "fp", "o", time.Minute)
			return ok, err
		})
		call("Renew", func() (bool, error) { return s.Renew(ctx, key, "o", time.Minute) })
		call("Release", func() (bool, error) { return s.Release(ctx, key, "o") })
	})
	wg.Go(func() {
		call("Allow", func() (bool, error) {
			ok, _, err := s.Allow(ctx, "a-"+tag, store.Limit{Rate: 10, Burst: 10, Period: time.Second})
			return ok, err
		})
	})
	wg.Wait()
	return out
}

// changeKeys maps each change that changes makes for tag to the Redis
// key whose hash slot it writes.
func changeKeys(s *redis.Store, tag string) map[string]string {
	id, rec, key := s.TokenKey("c-"+tag), s.TokenKey("r-"+tag), s.RecordKey("k-"+tag)
	return map[string]string{
		"Put": id, "Put nonce": s.PutKey(store.NonceKey("k", tag)), "Put the record's token": rec,
		"Redeem": id, "Redeem with a record": rec, "Complete a token's record": rec,
		"Acquire": key, "Renew": key, "Release": key,
	}
}

// TestMinReplicas runs a store with WithMinReplicas on a private master
// with one replica: the conformance suite, as a Redis user with
// ACLCommands and +wait only; then, with the replica stopped, every
// change fails with ErrNotReplicated within the timeout while calls that
// change nothing answer at once; and a change needing two replicas never
// succeeds.
func TestMinReplicas(t *testing.T) {
	t.Parallel() // private servers
	bin := testenv.RedisServer(t)
	master := testenv.StartRedis(t, bin)
	replica := testenv.StartRedis(t, bin, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port()))
	admin, rc := node(t, master), node(t, replica)
	waitLinked(t, rc)
	waitOnline(t, admin)
	ctx := context.Background()
	const user, pass = "rgtest-wait", "rgtest-wait-pw"
	args := []any{"ACL", "SETUSER", user, "reset", "on", ">" + pass, "~rgtest:*", "~rate:rgtest:*", "+wait"}
	for _, c := range strings.Fields(redis.ACLCommands) {
		args = append(args, c)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	// newStore returns a store under prefix (the test's own when empty),
	// whose client's commands hook counts.
	newStore := func(t *testing.T, prefix string, hook *commandCounter, opts ...redis.Option) *redis.Store {
		client := goredis.NewClient(&goredis.Options{Addr: master.Addr(), Username: user, Password: pass, ContextTimeoutEnabled: true,
			ReadTimeout: contextOnly, WriteTimeout: contextOnly, MaintNotificationsConfig: noMaintNotifications()})
		if hook != nil {
			client.AddHook(hook)
		}
		if prefix == "" {
			prefix = uniquePrefix(t)
		}
		s := redis.New(client, append([]redis.Option{redis.WithPrefix(prefix)}, opts...)...)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}

	t.Run("conformance, every change acknowledged by the replica", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Instance {
			s := newStore(t, "", nil, redis.WithTimeout(loadedTimeout), redis.WithMinReplicas(1))
			return storetest.Instance{
				Store: s, Limiter: s, Now: time.Now, Advance: time.Sleep,
				TTL: pttl(t, admin, s.TokenKey), RecordTTL: pttl(t, admin, s.RecordKey),
			}
		})
	})

	t.Run("with the replica stopped a change fails, a refusal does not wait", func(t *testing.T) {
		t.Parallel() // with the next: each waits out its WAITs
		prefix := uniquePrefix(t)
		hook := &commandCounter{}
		s := newStore(t, prefix, hook, redis.WithTimeout(stallTimeout), redis.WithMinReplicas(1))
		// For the calls that must succeed: the same keys, time enough.
		plain := newStore(t, prefix, nil, redis.WithTimeout(loadedTimeout))
		confirmed := newStore(t, prefix, nil, redis.WithTimeout(loadedTimeout), redis.WithMinReplicas(1))
		tok := store.Token{Purpose: "p"}
		// Prepared while the replica runs: what the calls below refuse.
		if ok, err := confirmed.Put(ctx, "taken", tok, time.Minute); err != nil || !ok {
			t.Fatalf("put = %v, %v", ok, err)
		}
		if _, ok, err := confirmed.Acquire(ctx, "held", "fp", "owner", time.Minute); err != nil || !ok {
			t.Fatalf("acquire = %v, %v", ok, err)
		}
		changes(ctx, s, "warm") // s's pool has written, and its scripts are loaded
		// Every connection in the pool has written by now, so a WAIT on
		// any connection but the change's own would return at once.
		resume := stopped(t, rc)
		for name, o := range changes(ctx, s, "stopped") {
			switch {
			case name == "Allow":
				if o.err != nil {
					t.Errorf("Allow (never waits) = %v", o.err)
				}
			case !errors.Is(o.err, redis.ErrNotReplicated) || !errors.Is(o.err, store.ErrUnavailable):
				t.Errorf("%s with the replica stopped = %v; want ErrNotReplicated, which wraps store.ErrUnavailable", name, o.err)
			case o.took > stallTimeout+loadedTimeout:
				// Bounded by the store's timeout, not WAIT 0's forever;
				// the slack is for the machine's load.
				t.Errorf("%s took %v, want the store timeout (%v), plus slack", name, o.took, stallTimeout)
			}
		}
		refusals := []struct {
			name string
			call func() error
		}{
			{"put on a live id", func() error {
				ok, err := s.Put(ctx, "taken", tok, time.Minute)
				return want(!ok, err)
			}},
			{"redeem of an absent token", func() error {
				res, _, err := s.Redeem(ctx, "absent", tok, "", 0)
				return want(res == store.Absent, err)
			}},
			{"redeem with the wrong purpose", func() error {
				res, _, err := s.Redeem(ctx, "taken", store.Token{Purpose: "other"}, "", 0)
				return want(res == store.PurposeMismatch, err)
			}},
			{"acquire of a held key", func() error {
				_, ok, err := s.Acquire(ctx, "held", "fp", "other", time.Minute)
				return want(!ok, err)
			}},
			{"renew by another owner", func() error {
				ok, err := s.Renew(ctx, "held", "other", time.Minute)
				return want(!ok, err)
			}},
			{"lookup of a held key", func() error {
				rec, found, err := s.Lookup(ctx, "held")
				return want(found && rec.Owner == "owner", err)
			}},
		}
		for _, r := range refusals {
			// A refusal that waited would send WAIT: counted, not timed.
			hook.reset()
			if err := r.call(); err != nil {
				t.Errorf("%s with the replica stopped: %v", r.name, err)
			}
			if sent, waited := hook.counts(); sent == 0 || waited != 0 {
				t.Errorf("%s sent %d commands, %d of them WAIT: a call that changes nothing must not wait", r.name, sent, waited)
			}
		}
		// The unconfirmed changes were made on the master all the same:
		// the token redeemed above is used up.
		if res, _, err := plain.Redeem(ctx, "c-stopped", tok, "", 0); err != nil || res != store.Absent {
			t.Errorf("redeem of the unconfirmed redemption's token = %v, %v; want absent", res, err)
		}
		resume()
		waitLinked(t, rc)
		waitOnline(t, admin)
		for name, o := range changes(ctx, confirmed, "resumed") {
			if o.err != nil {
				t.Errorf("%s after the replica resumed: %v", name, o.err)
			}
		}
	})

	t.Run("two replicas asked, one connected", func(t *testing.T) {
		t.Parallel() // with the previous: each waits out its WAITs
		s := newStore(t, "", nil, redis.WithTimeout(stallTimeout), redis.WithMinReplicas(2))
		for name, o := range changes(ctx, s, "two") {
			if name != "Allow" && !errors.Is(o.err, redis.ErrNotReplicated) {
				t.Errorf("%s = %v, want ErrNotReplicated", name, o.err)
			}
		}
	})
}

// want is nil when ok and err is nil, else an error saying which.
func want(ok bool, err error) error {
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("unexpected result")
	}
	return nil
}

// TestMinReplicasCluster runs WithMinReplicas on a private Redis Cluster of
// two masters with a replica each: the conformance suite, with every
// change confirmed; then, with one master's replica stopped, changes to
// that master's slots fail with ErrNotReplicated and changes to the
// other's succeed, which shows WAIT reaches the node that took the write.
func TestMinReplicasCluster(t *testing.T) {
	t.Parallel() // private servers
	bin := testenv.RedisServer(t)
	masters, replicas := startCluster(t, bin)
	client := func() *goredis.ClusterClient {
		addrs := []string{masters[0].Options().Addr, masters[1].Options().Addr}
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
			ReadTimeout: contextOnly, WriteTimeout: contextOnly, MaintNotificationsConfig: noMaintNotifications()})
	}

	t.Run("conformance, every change acknowledged by a replica", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) storetest.Instance {
			_, in := realInstance(t, client(), redis.WithMinReplicas(1))
			return in
		})
	})

	t.Run("WAIT goes to the master that took the write", func(t *testing.T) {
		c := client()
		t.Cleanup(func() { _ = c.Close() })
		ctx := context.Background()
		master := func(key string) string {
			m, err := c.MasterForKey(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return m.Options().Addr
		}
		stoppedMaster := masters[1].Options().Addr
		// Two tags under one prefix: every key of one on the master whose
		// replica will stop, every key of the other on the other master.
		// CRC16 is linear, so whether a tag's keys can share a master
		// depends on the tag's length and, for the nonce key, which
		// hashes whole, on the prefix: some prefixes have no such tag,
		// and another is tried.
		onOne := func(keys *redis.Store, tag string) (string, bool) {
			var on string
			for _, key := range changeKeys(keys, tag) {
				if m := master(key); on == "" {
					on = m
				} else if m != on {
					return "", false
				}
			}
			return on, true
		}
		var prefix, running, stalled string
		for attempt := 0; running == "" || stalled == ""; attempt++ {
			if attempt == 100 {
				t.Fatal("no prefix of 100 has a tag whose keys are all on either master")
			}
			prefix, running, stalled = uniquePrefix(t), "", ""
			keys := redis.New(c, redis.WithPrefix(prefix)) // names keys only: never called, nor closed (that would close c)
			for i := 0; i < 200 && (running == "" || stalled == ""); i++ {
				tag := "tag" + strconv.Itoa(i)
				if on, one := onOne(keys, tag); one && on == stoppedMaster && stalled == "" {
					stalled = tag
				} else if one && on != stoppedMaster && running == "" {
					running = tag
				}
			}
		}
		newStore := func(timeout time.Duration) *redis.Store {
			s := redis.New(client(), redis.WithPrefix(prefix), redis.WithTimeout(timeout), redis.WithMinReplicas(1))
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
		// Changes that must be confirmed get time enough; changes that
		// must not wait out stallTimeout each.
		ok, stall := newStore(loadedTimeout), newStore(stallTimeout)
		// Both clients have loaded COMMAND and the scripts, and their
		// pooled connections have written, while both replicas run.
		changes(ctx, ok, "warm")
		changes(ctx, stall, "warm")
		stopped(t, replicas[1])
		for name, o := range changes(ctx, ok, running) {
			if o.err != nil {
				t.Errorf("%s on %s, whose replica runs: %v", name, master(changeKeys(ok, running)[name]), o.err)
			}
		}
		for name, o := range changes(ctx, stall, stalled) {
			if name != "Allow" && !errors.Is(o.err, redis.ErrNotReplicated) { // Allow never waits
				t.Errorf("%s on %s, whose replica is stopped = %v, want ErrNotReplicated", name, stoppedMaster, o.err)
			}
		}
	})
}

// startCluster starts a Redis Cluster of two masters, each with half the
// slots and one replica, and returns clients to the masters and to their
// replicas (replicas[i] replicates masters[i]) once both replicas are
// linked and every node reports the cluster ok.
func startCluster(t *testing.T, bin string) (masters, replicas []*goredis.Client) {
	t.Helper()
	var all []*goredis.Client
	var bus []int // cluster bus ports: port+10000 may not be free, or even exist
	for range 4 {
		bus = append(bus, testenv.FreePort(t))
		p := testenv.StartRedis(t, bin, "--cluster-enabled", "yes",
			"--cluster-port", strconv.Itoa(bus[len(bus)-1]), "--cluster-node-timeout", "5000")
		all = append(all, node(t, p))
	}
	masters, replicas = all[:2], all[2:]

	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := masters[0].ClusterAddSlotsRange(ctx, 0, 8191).Err(); err != nil {
		t.Fatal(err)
	}
	if err := masters[1].ClusterAddSlotsRange(ctx, 8192, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(all[0].Options().Addr, ":")
	for _, c := range all[1:] {
		if err := c.Do(ctx, "CLUSTER", "MEET", host, port, bus[0]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ids := make([]string, len(masters))
	for i, m := range masters {
		id, err := m.ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	for i, r := range replicas {
		// A replica can follow a master once it has heard of it.
		pollUntil(t, "replica "+r.Options().Addr+" follows "+ids[i], func(ctx context.Context) error {
			return r.Do(ctx, "CLUSTER", "REPLICATE", ids[i]).Err()
		})
		waitLinked(t, r)
		waitOnline(t, masters[i])
	}
	for _, c := range all {
		pollUntil(t, c.Options().Addr+" cluster_state:ok", func(ctx context.Context) error {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return errors.New("cluster_state is not ok")
			}
			return nil
		})
	}
	return masters, replicas
}

// TestMinReplicasNeedsAClientThatPins: a Ring has no way to pin one
// connection to the node that takes a key, so every change fails rather
// than go unconfirmed.
func TestMinReplicasNeedsAClientThatPins(t *testing.T) {
	mr := miniredis.RunT(t)
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"one": mr.Addr()}, ContextTimeoutEnabled: true})
	s := redis.New(ring, redis.WithMinReplicas(1))
	defer s.Close()
	for name, o := range changes(context.Background(), s, "ring") {
		if name != "Allow" && (!errors.Is(o.err, store.ErrUnavailable) || !strings.Contains(fmt.Sprint(o.err), "WithMinReplicas needs")) {
			t.Errorf("%s on a Ring = %v; want an error naming WithMinReplicas", name, o.err)
		}
	}
}

// TestNoReplicasSendsNoWait: without WithMinReplicas (and with
// WithMinReplicas(0)) a change is the one command it always was; with
// WithMinReplicas(1), a change is followed by one WAIT, and a refusal is
// not.
func TestNoReplicasSendsNoWait(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []redis.Option
		sent   int64 // by changes: ten calls, of which Allow never waits
		waited int64 // WAITs among them
	}{
		{"default", nil, 10, 0},
		{"WithMinReplicas(0)", []redis.Option{redis.WithMinReplicas(0)}, 10, 0},
		{"WithMinReplicas(1)", []redis.Option{redis.WithMinReplicas(1)}, 19, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mr := miniredis.RunT(t)
			client := goredis.NewClient(&goredis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true,
				MaintNotificationsConfig: noMaintNotifications()})
			hook := &commandCounter{}
			client.AddHook(hook)
			s := redis.New(client, tc.opts...)
			defer s.Close()
			ctx := context.Background()
			changes(ctx, s, "warm") // loads the scripts (NOSCRIPT, then EVAL)
			hook.reset()
			changes(ctx, s, "counted") // miniredis has no replicas: ignore the outcome
			if sent, waited := hook.counts(); sent != tc.sent || waited != tc.waited {
				t.Errorf("sent %d commands, %d of them WAIT; want %d and %d", sent, waited, tc.sent, tc.waited)
			}
			hook.reset()
			if res, _, err := s.Redeem(ctx, "absent", store.Token{Purpose: "p"}, "", 0); err != nil || res != store.Absent {
				t.Fatalf("redeem = %v, %v", res, err)
			}
			if sent, waited := hook.counts(); sent != 1 || waited != 0 {
				t.Errorf("a refusal sent %d commands, %d of them WAIT; want 1 and 0", sent, waited)
			}
		})
	}
}

// commandCounter is a go-redis hook that counts the commands a client
// (and every Conn taken from it) sends, and the WAITs among them; not
// those that set up a new connection, which changes opens as many as
// it runs calls at once.
type commandCounter struct {
	mu           sync.Mutex
	sent, waited int64
}

// connectionSetup are the commands go-redis sends on a new connection.
var connectionSetup = map[string]bool{"hello": true, "auth": true, "client": true, "select": true}

func (h *commandCounter) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sent, h.waited = 0, 0
}

func (h *commandCounter) counts() (sent, waited int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sent, h.waited
}

func (h *commandCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *commandCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if connectionSetup[cmd.Name()] {
			return next(ctx, cmd)
		}
		h.mu.Lock()
		h.sent++
		if cmd.Name() == "wait" {
			h.waited++
		}
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *commandCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.mu.Lock()
		for _, c := range cmds {
			if !connectionSetup[c.Name()] {
				h.sent++
			}
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}
