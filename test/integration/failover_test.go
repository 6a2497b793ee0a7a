package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/replayguard/replayguard/internal/testenv"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/token"
)

// Shape of a failover run. The load redeems fresh tokens at
// failoverRate a second from failoverWorkers goroutines, each token
// once; failoverTokens is more than a run uses.
const (
	failoverWorkers      = 16
	failoverRate         = 200
	failoverTokens       = 2500
	failoverStoreTimeout = redisstore.DefaultTimeout // as the server runs by default
	// successesBeforeKill redemptions succeed before the master dies, and
	// successesAfterRecovery after the first success that follows.
	successesBeforeKill    = 100
	successesAfterRecovery = 50
	// cutOffWrites redemptions are made on the master while no replica
	// can follow, in the runs that cut the replica off before the kill.
	cutOffWrites = 20
	// failoverDeadline bounds one run, from the Sentinel setup to the
	// last check.
	failoverDeadline = 50 * time.Second
)

// TestFailoverLosesNoRedemption runs the server on a Sentinel deployment
// (one master, one replica, three sentinels, see testenv.StartSentinel)
// through a FailoverClient, as REPLAYGUARD_REDIS_SENTINEL_ADDRS wires it,
// redeems tokens under concurrent load, SIGKILLs the master mid-load,
// restarts it as a replica of the master the sentinels promote, and then
// redeems again every token that was redeemed: none may succeed twice.
//
// With REPLAYGUARD_REDIS_MIN_REPLICAS=1 that is required, and no
// redemption may succeed between the kill and the old master's restart,
// since the new master has no replica to confirm it until then. With 0
// the double redemptions are only counted: on loopback the replica is
// rarely more than a write behind, so the window a kill can hit is tiny,
// and 0 observed doubles proves nothing about a real network.
//
// The "replica cut off" runs open that window wide and on purpose: the
// master refuses its replica's PSYNC and drops its link, takes
// cutOffWrites redemptions alone, and dies. With 0 replicas the test
// requires that those redemptions come back (the test can see a loss);
// with 1 they were never answered 200 (WAIT found no replica), so
// nothing is redeemed twice.
func TestFailoverLosesNoRedemption(t *testing.T) {
	bin := testenv.RedisServer(t)
	tests := []struct {
		name        string
		minReplicas int
		cutOff      bool
	}{
		{"min replicas 1", 1, false},
		{"min replicas 0", 0, false},
		{"min replicas 1, replica cut off before the kill", 1, true},
		{"min replicas 0, replica cut off before the kill", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runFailover(t, bin, tc.minReplicas, tc.cutOff)
			t.Logf("MIN_REPLICAS=%d cut off=%v: %s", tc.minReplicas, tc.cutOff, r)
			switch {
			case tc.minReplicas > 0 && len(r.doubles) > 0:
				t.Errorf("%d tokens were redeemed twice across the failover: %v", len(r.doubles), r.doubles[:min(len(r.doubles), 10)])
			case tc.minReplicas > 0 && r.earlySuccesses > 0:
				t.Errorf("%d redemptions succeeded after the kill and before any replica could confirm them", r.earlySuccesses)
			case tc.minReplicas == 0 && tc.cutOff && len(r.doubles) == 0:
				t.Errorf("no token redeemed twice, though %d redemptions were made on the master alone before it died: the test cannot see a loss", r.cutOffOK)
			}
		})
	}
}

// failoverResult is what one run observed.
type failoverResult struct {
	presented, ok, used, unavailable, other int
	cutOffOK                                int           // 200s answered while the replica was cut off
	promoted                                time.Duration // kill to the sentinels agreeing on a new master
	restarted                               time.Duration // kill to the old master answering again, as a replica
	recovered                               time.Duration // kill to the first 200 of a request sent after it
	earlySuccesses                          int           // 200s sent after the kill, answered before the restart
	doubles                                 []string      // tokens redeemed again after the failover
}

func (r failoverResult) String() string {
	return fmt.Sprintf("%d redemptions under load: %d ok, %d token_used, %d store_unavailable, %d other; "+
		"%d ok while the replica was cut off; kill to promotion %v, to restart %v, to first success %v; %d redeemed twice",
		r.presented, r.ok, r.used, r.unavailable, r.other, r.cutOffOK,
		r.promoted.Round(time.Millisecond), r.restarted.Round(time.Millisecond), r.recovered.Round(time.Millisecond), len(r.doubles))
}

// attempt is one redemption under load.
type attempt struct {
	token      int // index into the issued tokens
	status     int
	code       string
	sent, done time.Time
}

// runFailover runs one failover as TestFailoverLosesNoRedemption says.
func runFailover(t *testing.T, bin string, minReplicas int, cutOff bool) failoverResult {
	ctx, cancel := context.WithTimeout(context.Background(), failoverDeadline)
	defer cancel()
	setup := time.Now()
	s := testenv.StartSentinel(t, bin)
	t.Logf("sentinel setup in %v", time.Since(setup).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", s.Logs())
		}
	})
	// Wired as cmd/server wires REPLAYGUARD_REDIS_SENTINEL_ADDRS.
	client := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:            s.MasterName,
		SentinelAddrs:         s.SentinelAddrs(),
		ContextTimeoutEnabled: true,
		DialTimeout:           failoverStoreTimeout,
		ReadTimeout:           failoverStoreTimeout,
		WriteTimeout:          failoverStoreTimeout,
		PoolTimeout:           failoverStoreTimeout,
		PoolSize:              4 * failoverWorkers,
	})
	st := redisstore.New(client, redisstore.WithPrefix(uniquePrefix(t)),
		redisstore.WithTimeout(failoverStoreTimeout), redisstore.WithMinReplicas(minReplicas))
	srv := startServer(t, st, serverConfig{conns: failoverWorkers})
	// The master counts its replica once it has acknowledged the end of
	// its first sync, up to a second after the replica says it is linked.
	waitReplicated(t, ctx, s.Master().Addr())
	toks := issueMany(t, srv.Tokens, failoverTokens)
	// Every token is on the replica before the load starts (a WAIT after
	// a write of this connection's own covers every earlier write), so
	// that a token that comes back can only be a lost redemption.
	waitReplicated(t, ctx, s.Master().Addr())

	var (
		next      atomic.Int64 // next token to present
		successes atomic.Int64
		mu        sync.Mutex
		attempts  []attempt
		stop      = make(chan struct{})
		workers   sync.WaitGroup
	)
	pace := time.NewTicker(time.Second / failoverRate)
	defer pace.Stop()
	for range failoverWorkers {
		workers.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-pace.C:
				}
				i := int(next.Add(1) - 1)
				if i >= len(toks) {
					return // reported below: the run needed more tokens
				}
				a := attempt{token: i, sent: time.Now()}
				res, err := redeemOnce(srv, toks[i].Token)
				a.done = time.Now()
				if err != nil {
					a.code = err.Error()
				} else {
					a.status, a.code = res.Status, problemCode(res.Body)
				}
				if a.status == http.StatusOK {
					successes.Add(1)
				}
				mu.Lock()
				attempts = append(attempts, a)
				mu.Unlock()
			}
		})
	}
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			close(stop)
			workers.Wait()
		}
	}
	defer stopLoad()
	// since returns the attempts sent after from that are done.
	since := func(from time.Time) []attempt {
		mu.Lock()
		defer mu.Unlock()
		var out []attempt
		for _, a := range attempts {
			if !a.sent.Before(from) {
				out = append(out, a)
			}
		}
		return out
	}
	// waitFor polls the load until cond holds; a run that uses up its
	// tokens or its deadline first fails.
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if next.Load() >= int64(len(toks)) {
				t.Fatalf("waiting for %s: the load used all %d tokens", what, len(toks))
			}
			select {
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			case <-time.After(10 * time.Millisecond): // polling the load
			}
		}
	}

	waitFor(fmt.Sprintf("%d successes before the kill", successesBeforeKill), func() bool {
		return successes.Load() >= successesBeforeKill
	})
	var cutAt time.Time
	if cutOff {
		cutAt = cutOffReplica(t, ctx, s.Master().Addr())
		waitFor(fmt.Sprintf("%d redemptions made while the replica is cut off", cutOffWrites), func() bool {
			return len(since(cutAt)) >= cutOffWrites
		})
	}
	old := s.Master().Addr()
	killedAt := time.Now()
	s.Master().Kill()
	newMaster, err := s.WaitForNewMaster(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(killedAt)
	host, port, _ := net.SplitHostPort(newMaster)
	restartAt := time.Now()
	s.Master().Restart("--replicaof", host, port)
	restarted := time.Since(killedAt)
	var recoveredAt time.Time
	waitFor("the first success after the kill", func() bool {
		for _, a := range since(killedAt) {
			if a.status == http.StatusOK && (recoveredAt.IsZero() || a.done.Before(recoveredAt)) {
				recoveredAt = a.done
			}
		}
		return !recoveredAt.IsZero()
	})
	waitFor(fmt.Sprintf("%d more successes", successesAfterRecovery), func() bool {
		n := 0
		for _, a := range since(recoveredAt) {
			if a.status == http.StatusOK {
				n++
			}
		}
		return n >= successesAfterRecovery
	})
	stopLoad()

	r := failoverResult{promoted: promoted, restarted: restarted, recovered: recoveredAt.Sub(killedAt), presented: len(attempts)}
	var redeemed []int
	for _, a := range attempts {
		switch {
		case a.status == http.StatusOK:
			r.ok++
			redeemed = append(redeemed, a.token)
			if cutOff && !a.sent.Before(cutAt) && a.sent.Before(killedAt) {
				r.cutOffOK++
			}
			if !a.sent.Before(killedAt) && a.done.Before(restartAt) {
				r.earlySuccesses++
			}
		case a.code == "token_used":
			r.used++
		case a.code == "store_unavailable":
			r.unavailable++
		default:
			r.other++
			t.Logf("unexpected answer under load: %d %s", a.status, a.code)
		}
	}
	r.doubles = redeemAgain(t, ctx, srv, toks, redeemed)
	return r
}

// redeemOnce presents tok to srv's redeem endpoint. It never fails the
// test, so goroutines may call it.
func redeemOnce(srv *server, tok string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/tokens/redeem", nil)
	if err != nil {
		return reply{}, err
	}
	req.Header.Set(token.Header, tok)
	return send(srv.Client, req)
}

// issueMany issues n tokens through svc, from a few goroutines. Issuing
// is not under test: a call the store could not confirm in time (a
// loaded machine) is tried again, up to three times.
func issueMany(t *testing.T, svc *token.Service, n int) []token.Issued {
	t.Helper()
	toks := make([]token.Issued, n)
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				for range 3 {
					if toks[i], errs[i] = svc.Issue(context.Background(), token.IssueRequest{TTL: 10 * time.Minute}); errs[i] == nil {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("issuing token %d of %d: %v", i, n, err)
		}
	}
	return toks
}

// admin returns a plain client to one server of the deployment.
func admin(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitReplicated writes a marker on the master at addr and waits, with
// WAIT on the same connection, until the replica has it, and with it
// every write before.
func waitReplicated(t *testing.T, ctx context.Context, addr string) {
	t.Helper()
	conn := admin(t, addr).Conn()
	defer conn.Close()
	if err := conn.Set(ctx, "rgit:failover:marker", "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n < 1 {
		t.Fatalf("WAIT 1 on %s = %d, %v: the replica did not catch up", addr, n, err)
	}
}

// cutOffReplica makes the master at addr refuse its replica's PSYNC (an
// ACL rule on the default user, which the replica connects as) and drops
// the replica's link, so that from now on the master's writes reach no
// replica: the replica keeps reconnecting and is refused. It returns the
// time the link was dropped.
func cutOffReplica(t *testing.T, ctx context.Context, addr string) time.Time {
	t.Helper()
	c := admin(t, addr)
	if err := c.Do(ctx, "ACL", "SETUSER", "default", "-psync", "-sync").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil || !strings.Contains(info, "connected_slaves:0") {
		t.Fatalf("after cutting the replica off, the master reports %q, %v", info, err)
	}
	return at
}

// redeemAgain presents every token of redeemed once more and returns the
// IDs of those that redeemed again. An answer of 503 is retried until
// the run's deadline.
func redeemAgain(t *testing.T, ctx context.Context, srv *server, toks []token.Issued, redeemed []int) []string {
	t.Helper()
	var (
		mu      sync.Mutex
		doubles []string
		failure error
		next    atomic.Int64
		wg      sync.WaitGroup
	)
	for range failoverWorkers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(redeemed); i = int(next.Add(1) - 1) {
				tok := toks[redeemed[i]]
				for {
					res, err := redeemOnce(srv, tok.Token)
					if err == nil && res.Status == http.StatusOK {
						mu.Lock()
						doubles = append(doubles, tok.ID)
						mu.Unlock()
					}
					if err == nil && res.Status != http.StatusServiceUnavailable {
						if res.Status != http.StatusOK && problemCode(res.Body) != "token_used" {
							mu.Lock()
							failure = fmt.Errorf("token %s: %d %s", tok.ID, res.Status, res.Body)
							mu.Unlock()
						}
						break
					}
					select {
					case <-ctx.Done():
						mu.Lock()
						failure = fmt.Errorf("token %s: still unavailable at the deadline: %v", tok.ID, err)
						mu.Unlock()
						return
					case <-time.After(20 * time.Millisecond): // polling the store's recovery
					}
				}
			}
		})
	}
	wg.Wait()
	if failure != nil {
		t.Fatalf("redeeming again: %v", failure)
	}
	slices.Sort(doubles)
	return doubles
}
