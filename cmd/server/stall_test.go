package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/webhook"
)

// The stall tests of issue 20 (a response the app gave is never run again
// because the store stalled).
const (
	// stallLease is REPLAYGUARD_IDEMPOTENCY_LOCK_TTL; the grace is the
	// default, one lease.
	stallLease = 5 * time.Second
	// stallStoreTimeout is REPLAYGUARD_STORE_TIMEOUT, and the memory
	// store's stalled calls' (see stallingStore).
	stallStoreTimeout = time.Second
	// stallRounds is how often each store is stalled, with fresh keys.
	stallRounds = 3
	// stallPerRoute is how many requests each of the four routes has in
	// flight in every stall: 20 in all.
	stallPerRoute = 5
	// stallLater is when the second retry of every request goes out,
	// after the stall ended.
	stallLater = 10 * time.Second
	// stallBound bounds every wait: for the app to receive the requests,
	// for a store to start or take its lock, for an answer.
	stallBound = 30 * time.Second
	// stallAnswerSlack is what a loaded machine may add to the store
	// timeout between the app's answer and the client's receiving it.
	stallAnswerSlack = 3 * time.Second
	// stallCallHeader names the request header that identifies a request
	// (and its retries) to the app, which counts its executions by it.
	stallCallHeader = "X-Stall-Call"
	// stallWorkHeader says how long the app works on a request, in
	// milliseconds, once let through.
	stallWorkHeader = "X-Stall-Work"
	// stallSecretEnv names the webhook route's secret variable.
	stallSecretEnv = "STALL_WEBHOOK_SECRET"
)

// stallRoutes has one route per recorded policy: a required Idempotency-
// Key, a fingerprint route whose window (2m) outlasts the retry 10s after
// the stall, a token route (record mode: its response is replayed to a
// duplicate of the token) and a Standard Webhooks route.
const stallRoutes = `routes:
  - match: "POST /orders"
    policy: idempotency_key
    required: true
  - match: "POST /comments"
    policy: fingerprint
    window: 2m
  - match: "POST /checkout"
    policy: token
    purpose: checkout
  - match: "POST /hooks/standard"
    policy: webhook
    scheme: standard
    secret_env: ` + stallSecretEnv + `
`

// stallTarget is a store to stall, and how.
type stallTarget struct {
	name string
	// stall is how long the store stays stalled.
	stall time.Duration
	// setup starts the store; serial setups run before the parallel
	// part of the test (the memory store's, which sets testStore).
	setup  func(t *testing.T) stallSetup
	serial bool
}

// stallSetup is a started store: the server's settings for it, or a
// wrapper of the records' store (testStore), and how to stall it.
type stallSetup struct {
	env   []string
	wrap  func(store.Store) store.Store
	begin func(t *testing.T) // returns once the store is stalled
	end   func(t *testing.T)
}

// TestStoreStallDuringAppCalls runs the server in gateway mode on each
// store in front of an app that takes 1 to 2 s per call, and stalls the
// store while 20 requests (5 keyed, 5 fingerprinted, 5 with tokens, 5
// webhook deliveries) are in the app, just before their records' first
// renewal is due (the stall then leaves them the least of their lease):
// PostgreSQL by holding an ACCESS EXCLUSIVE lock on the records' table
// for 3 s, Redis and a one-node Redis Cluster by SIGSTOP for 8 s, the
// memory store by a wrapper that holds its calls for 8 s; the lease is
// 5 s, the grace the default (one lease), the store timeout 1 s. The app
// answers while the store is stalled, so the records cannot be completed
// then. Three stalls per store, with fresh keys; in each:
//
//   - every client gets the app's own answer (2xx), at most about the
//     store timeout after the app gave it, not after the stall;
//   - a retry of every request as soon as the stall ends gets 409
//     request_in_progress or the replay, never 503, and never runs the
//     app again;
//   - a retry 10 s later gets the replay (Idempotent-Replayed: true);
//   - the app ran every request exactly once;
//
// and in the end no completion was given up or is still pending.
func TestStoreStallDuringAppCalls(t *testing.T) {
	targets := []stallTarget{
		{"memory", 8 * time.Second, stallMemory, true},
		{"redis", 8 * time.Second, stallRedis, false},
		{"cluster", 8 * time.Second, stallCluster, false},
		{"postgres", 3 * time.Second, stallPostgres, false},
	}
	for _, tc := range targets {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.serial {
				t.Parallel()
			}
			st := tc.setup(t)
			app := newStallApp(t)
			base := startStallGateway(t, app, st)
			if tc.serial {
				t.Parallel()
			}
			for round := 1; round <= stallRounds; round++ {
				if !stallRound(t, base, app, st, tc.stall, round) {
					return
				}
			}
			if n := app.totalRuns(); n != stallRounds*4*stallPerRoute {
				t.Errorf("the app ran %d times in all, want %d", n, stallRounds*4*stallPerRoute)
			}
			// Every completion landed, even those whose reply was lost
			// (a stalled Redis carries out, when it comes back, the
			// commands its clients gave up on).
			if n := metric(t, base, "replayguard_idempotency_completions_given_up_total"); n != "0" {
				t.Errorf("replayguard_idempotency_completions_given_up_total = %s, want 0", n)
			}
			if n := metric(t, base, "replayguard_idempotency_completions_pending"); n != "0" {
				t.Errorf("replayguard_idempotency_completions_pending = %s, want 0", n)
			}
		})
	}
}

// stallMemory wraps the memory store's records in a stallingStore.
func stallMemory(*testing.T) stallSetup {
	s := &stallingStore{timeout: stallStoreTimeout}
	return stallSetup{
		wrap:  func(st store.Store) store.Store { s.Store = st; return s },
		begin: func(*testing.T) { s.pause() },
		end:   func(*testing.T) { s.resume() },
	}
}

// stallRedis starts a private Redis and stalls it with SIGSTOP.
func stallRedis(t *testing.T) stallSetup {
	p := testenv.StartRedis(t, testenv.RedisServer(t))
	return stallSetup{
		env:   []string{"REPLAYGUARD_REDIS_URL=redis://" + p.Addr() + "/0"},
		begin: func(*testing.T) { p.Pause() },
		end:   func(*testing.T) { p.Continue() },
	}
}

// stallCluster starts a private one-node Redis Cluster and stalls it with
// SIGSTOP. Its node timeout (30 s) outlasts the stall, so the node is
// not marked failed meanwhile.
func stallCluster(t *testing.T) stallSetup {
	p := testenv.StartRedis(t, testenv.RedisServer(t), "--cluster-enabled", "yes",
		"--cluster-port", strconv.Itoa(testenv.FreePort(t)), "--cluster-node-timeout", "30000")
	node := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
	defer node.Close()
	ctx, cancel := context.WithTimeout(context.Background(), stallBound)
	defer cancel()
	if err := node.ClusterAddSlotsRange(ctx, 0, 16383).Err(); err != nil {
		t.Fatal(err)
	}
	for {
		info, err := node.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the one-node cluster on %s is not ok within %v: %v %s", p.Addr(), stallBound, err, info)
		}
		time.Sleep(20 * time.Millisecond) // polling another process
	}
	return stallSetup{
		env:   []string{"REPLAYGUARD_REDIS_CLUSTER_ADDRS=" + p.Addr()},
		begin: func(*testing.T) { p.Pause() },
		end:   func(*testing.T) { p.Continue() },
	}
}

// stallPostgres starts a private PostgreSQL and stalls the records' table
// with an ACCESS EXCLUSIVE lock held in another session.
func stallPostgres(t *testing.T) stallSetup {
	pg := testenv.StartPostgres(t)
	var tx pgx.Tx
	return stallSetup{
		env: []string{"REPLAYGUARD_POSTGRES_URL=" + pg.URL()},
		begin: func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), stallBound)
			defer cancel()
			conn, err := pgx.Connect(ctx, pg.URL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			if tx, err = conn.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE replayguard_records IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
		},
		end: func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), stallBound)
			defer cancel()
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			_ = tx.Conn().Close(ctx)
		},
	}
}

// startStallGateway runs the server in this process in front of app on
// st's store, with the stall tests' routes and settings.
func startStallGateway(t *testing.T, app *stallApp, st stallSetup) string {
	t.Helper()
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte(stallRoutes), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append([]string{
		"REPLAYGUARD_UPSTREAM=" + app.url,
		"REPLAYGUARD_ROUTES=" + routes,
		"REPLAYGUARD_IDEMPOTENCY_LOCK_TTL=" + stallLease.String(),
		"REPLAYGUARD_STORE_TIMEOUT=" + stallStoreTimeout.String(),
		stallSecretEnv + "=" + app.secret,
	}, st.env...)
	if st.wrap != nil {
		// run reads testStore before it listens, and no other server
		// starts meanwhile: this runs before the parallel part.
		identity := testStore
		testStore = st.wrap
		defer func() { testStore = identity }()
	}
	return startGateway(t, env...)
}

// stallingStore is a store whose calls can be held, as a stalled Redis or
// PostgreSQL holds them: while paused, a call waits until resume, then
// goes through, or until its context ends or the store timeout passes,
// and then fails with store.ErrUnavailable without having reached the
// store (the harsher case: a stalled Redis carries out, when it comes
// back, the commands its clients gave up on).
type stallingStore struct {
	store.Store
	timeout time.Duration

	mu      sync.Mutex
	stalled chan struct{} // non-nil while paused; closed by resume
}

var errStalled = errors.New("the store is stalled")

func (s *stallingStore) pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled = make(chan struct{})
}

func (s *stallingStore) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.stalled)
	s.stalled = nil
}

// wait holds a call while the store is paused.
func (s *stallingStore) wait(ctx context.Context, op string) error {
	s.mu.Lock()
	stalled := s.stalled
	s.mu.Unlock()
	if stalled == nil {
		return nil
	}
	timer := time.NewTimer(s.timeout)
	defer timer.Stop()
	select {
	case <-stalled:
		return nil
	case <-ctx.Done():
		return store.Unavailable(op, ctx.Err())
	case <-timer.C:
		return store.Unavailable(op, errStalled)
	}
}

func (s *stallingStore) Put(ctx context.Context, key string, tok store.Token, ttl time.Duration) (bool, error) {
	if err := s.wait(ctx, "put"); err != nil {
		return false, err
	}
	return s.Store.Put(ctx, key, tok, ttl)
}

func (s *stallingStore) Redeem(ctx context.Context, id string, want store.Token, owner string, lease time.Duration) (store.RedeemResult, store.Record, error) {
	if err := s.wait(ctx, "redeem"); err != nil {
		return 0, store.Record{}, err
	}
	return s.Store.Redeem(ctx, id, want, owner, lease)
}

func (s *stallingStore) Acquire(ctx context.Context, key, fingerprint, owner string, lease time.Duration) (store.Record, bool, error) {
	if err := s.wait(ctx, "acquire"); err != nil {
		return store.Record{}, false, err
	}
	return s.Store.Acquire(ctx, key, fingerprint, owner, lease)
}

func (s *stallingStore) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	if err := s.wait(ctx, "renew"); err != nil {
		return false, err
	}
	return s.Store.Renew(ctx, key, owner, lease)
}

func (s *stallingStore) Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (bool, error) {
	if err := s.wait(ctx, "complete"); err != nil {
		return false, err
	}
	return s.Store.Complete(ctx, key, owner, response, keep)
}

func (s *stallingStore) Release(ctx context.Context, key, owner string) (bool, error) {
	if err := s.wait(ctx, "release"); err != nil {
		return false, err
	}
	return s.Store.Release(ctx, key, owner)
}

func (s *stallingStore) Lookup(ctx context.Context, key string) (store.Record, bool, error) {
	if err := s.wait(ctx, "lookup"); err != nil {
		return store.Record{}, false, err
	}
	return s.Store.Lookup(ctx, key)
}

func (s *stallingStore) Ping(ctx context.Context) error {
	if err := s.wait(ctx, "ping"); err != nil {
		return err
	}
	return s.Store.Ping(ctx)
}

// stallApp is the app behind the gateway: it counts its executions by
// stallCallHeader, holds a call's first execution until its round's gate
// opens, then works for stallWorkHeader milliseconds and answers 201 with
// the call and the execution's number.
type stallApp struct {
	url    string
	secret string // the webhook route's
	signer *webhook.Signer

	arrived chan string // every execution's call, as it starts

	mu       sync.Mutex
	runs     map[string]int
	answered map[string]time.Time // when a call's first execution answered
	gate     chan struct{}
}

func newStallApp(t *testing.T) *stallApp {
	t.Helper()
	key := make([]byte, 24)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	a := &stallApp{
		secret:   "whsec_" + base64.StdEncoding.EncodeToString(key),
		arrived:  make(chan string, 4*stallRounds*4*stallPerRoute), // room for every execution, and more
		runs:     map[string]int{},
		answered: map[string]time.Time{},
		gate:     make(chan struct{}),
	}
	signer, err := webhook.NewSigner([]string{a.secret})
	if err != nil {
		t.Fatal(err)
	}
	a.signer = signer
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		call := r.Header.Get(stallCallHeader)
		work, _ := strconv.Atoi(r.Header.Get(stallWorkHeader))
		a.mu.Lock()
		a.runs[call]++
		run, gate := a.runs[call], a.gate
		a.mu.Unlock()
		select {
		case a.arrived <- call:
		default: // the test has failed already: far more executions than calls
		}
		if run == 1 { // a second execution (a bug) answers without waiting for a round
			select {
			case <-gate:
			case <-done:
			}
		}
		time.Sleep(time.Duration(work) * time.Millisecond) // the app's own work
		a.mu.Lock()
		if run == 1 {
			a.answered[call] = time.Now()
		}
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"call":%q,"run":%d}`, call, run)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) }) // runs first: lets held executions go
	a.url = srv.URL
	return a
}

// open lets the executions held at the gate work and answer, and gives
// the next round a new gate.
func (a *stallApp) open() {
	a.mu.Lock()
	defer a.mu.Unlock()
	close(a.gate)
	a.gate = make(chan struct{})
}

func (a *stallApp) runsOf(call string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[call]
}

func (a *stallApp) answeredAt(call string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.answered[call]
}

func (a *stallApp) totalRuns() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, r := range a.runs {
		n += r
	}
	return n
}

// stallCall is one request of a round, which is sent three times: first,
// at once after the stall, and stallLater after it.
type stallCall struct {
	id, route string
	req       func() *http.Request // a new copy of the request
}

// stallCalls builds a round's requests: stallPerRoute per route, each
// with its own key, body, token or delivery ID, the app working 1 to 2 s
// on each.
func stallCalls(t *testing.T, base string, app *stallApp, round int) []stallCall {
	t.Helper()
	prefix := fmt.Sprintf("r%d-%s", round, randomHex(t))
	var calls []stallCall
	add := func(route, method, path, body string, headers ...string) {
		id := fmt.Sprintf("%s-%d", prefix, len(calls))
		work := 1000 + 50*len(calls) // ms: 1 to 2 s
		headers = append(headers, stallCallHeader, id, stallWorkHeader, strconv.Itoa(work))
		calls = append(calls, stallCall{id: id, route: route, req: func() *http.Request {
			return newReq(t, method, base+path, body, headers...)
		}})
	}
	for i := range stallPerRoute {
		key := fmt.Sprintf("%s-order-%d", prefix, i)
		add("idempotency_key", "POST", "/orders", `{"item":"book","n":`+strconv.Itoa(i)+`}`,
			"Idempotency-Key", strconv.Quote(key), "Content-Type", "application/json")
	}
	for i := range stallPerRoute {
		add("fingerprint", "POST", "/comments", fmt.Sprintf("text=%s-comment-%d", prefix, i),
			"Content-Type", "application/x-www-form-urlencoded")
	}
	for range stallPerRoute {
		tok, _ := issueToken(t, base, "checkout")
		add("token", "POST", "/checkout", `{"cart":1}`, "Idempotency-Token", tok, "Content-Type", "application/json")
	}
	for i := range stallPerRoute {
		delivery := fmt.Sprintf("msg_%s_%d", strings.ReplaceAll(prefix, "-", "_"), i)
		body := `{"type":"invoice.paid","n":` + strconv.Itoa(i) + `}`
		signed := newReq(t, "POST", base+"/hooks/standard", body)
		if err := app.signer.SignRequest(signed, delivery); err != nil {
			t.Fatal(err)
		}
		var headers []string
		for name, vs := range signed.Header {
			headers = append(headers, name, vs[0])
		}
		add("webhook", "POST", "/hooks/standard", body, append(headers, "Content-Type", "application/json")...)
	}
	return calls
}

// stallAnswer is one answer, with when it was sent and received.
type stallAnswer struct {
	result
	sent, got time.Time
}

// sendAll sends one copy of every call at once and returns the answers,
// in the calls' order, once all have arrived (each bounded by try's
// client timeout).
func sendAll(calls []stallCall) []stallAnswer {
	answers := make([]stallAnswer, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		req := c.req()
		wg.Go(func() {
			sent := time.Now()
			r := try(req)
			answers[i] = stallAnswer{r, sent, time.Now()}
		})
	}
	wg.Wait()
	return answers
}

// stallRound runs one stall of d on st (see TestStoreStallDuringAppCalls)
// and reports whether the test may go on.
func stallRound(t *testing.T, base string, app *stallApp, st stallSetup, d time.Duration, round int) bool {
	calls := stallCalls(t, base, app, round)
	want := map[string]bool{}
	for _, c := range calls {
		want[c.id] = true
	}

	// The first requests, all held by the app.
	var firsts []stallAnswer
	firstsDone := make(chan struct{})
	go func() {
		defer close(firstsDone)
		firsts = sendAll(calls)
	}()
	deadline := time.After(stallBound)
	var firstArrived time.Time
	for seen := map[string]bool{}; len(seen) < len(calls); {
		select {
		case call := <-app.arrived:
			if !want[call] {
				t.Errorf("round %d: the app ran %q, which is not this round's, while waiting for its requests", round, call)
			}
			seen[call] = true
			if firstArrived.IsZero() {
				firstArrived = time.Now()
			}
		case <-firstsDone:
			t.Errorf("round %d: the requests were answered before the app had them all", round)
			for i, a := range firsts {
				t.Logf("%s %s: %d %s %v", calls[i].route, calls[i].id, a.status, a.body, a.err)
			}
			return false
		case <-deadline:
			t.Fatalf("round %d: the app did not receive all %d requests within %v", round, len(calls), stallBound)
		}
	}

	// The store stalls just before the records' first renewal is due
	// (their heartbeats tick every quarter lease from their opening,
	// which came just before the app had them): the worst moment, as
	// the stall then leaves each record the least of its lease.
	time.Sleep(time.Until(firstArrived.Add(stallLease/4 - 50*time.Millisecond))) // a moment on the lease's clock
	st.begin(t)
	stalled := time.Now()
	app.open()
	time.Sleep(time.Until(stalled.Add(d))) // the stall's length
	st.end(t)
	resumed := time.Now()

	// A retry of every request at once: 409 or the replay.
	atOnce := sendAll(calls)
	<-firstsDone
	ok := true
	var slowest time.Duration
	during := 0
	for i, c := range calls {
		first := firsts[i]
		answered := app.answeredAt(c.id)
		switch {
		case first.err != nil:
			t.Errorf("round %d, %s %s: the first request failed: %v", round, c.route, c.id, first.err)
			ok = false
			continue
		case first.status/100 != 2 || first.header.Get("Idempotent-Replayed") != "" || !strings.Contains(first.body, `"run":1}`):
			t.Errorf("round %d, %s %s: the first answer = %d %v %s, want the app's own 2xx", round, c.route, c.id, first.status, first.header, first.body)
			ok = false
			continue
		}
		waited := first.got.Sub(answered)
		slowest = max(slowest, waited)
		if waited > stallStoreTimeout+stallAnswerSlack {
			t.Errorf("round %d, %s %s: the client got the app's answer %v after the app gave it; want at most about the store timeout (%v)",
				round, c.route, c.id, waited, stallStoreTimeout)
		}
		if first.got.Before(resumed) {
			during++
		}
	}
	t.Logf("round %d: %d of %d first answers arrived while the store was stalled; the slowest %v after the app answered",
		round, during, len(calls), slowest.Round(time.Millisecond))
	if !ok {
		return false
	}
	counts := map[string]int{}
	for i, c := range calls {
		a := atOnce[i]
		switch {
		case a.err != nil:
			t.Errorf("round %d, %s %s: the retry at once failed: %v", round, c.route, c.id, a.err)
		case a.status == http.StatusConflict && a.code() == "request_in_progress":
			counts["409 request_in_progress"]++
		case isStallReplay(a.result, firsts[i].result):
			counts["replay"]++
		default:
			t.Errorf("round %d, %s %s: the retry at once after the stall = %d %v %s; want 409 request_in_progress or the replay of %d %s",
				round, c.route, c.id, a.status, a.header, a.body, firsts[i].status, firsts[i].body)
		}
	}
	t.Logf("round %d: retries at once after the stall: %v", round, counts)
	wantRunOnce(t, app, calls, round, "after the retries at once")

	// A retry of every request stallLater after the stall: the replay.
	time.Sleep(time.Until(resumed.Add(stallLater))) // the acceptance's interval
	for i, a := range sendAll(calls) {
		c := calls[i]
		if a.err != nil || !isStallReplay(a.result, firsts[i].result) {
			t.Errorf("round %d, %s %s: the retry %v after the stall = %d %v %s %v; want the replay of %d %s",
				round, c.route, c.id, stallLater, a.status, a.header, a.body, a.err, firsts[i].status, firsts[i].body)
		}
	}
	wantRunOnce(t, app, calls, round, fmt.Sprintf("after the retries %v later", stallLater))
	return !t.Failed()
}

// isStallReplay reports whether r is the replay of first.
func isStallReplay(r, first result) bool {
	return r.status == first.status && r.header.Get("Idempotent-Replayed") == "true" && r.body == first.body
}

// wantRunOnce checks that the app ran every call exactly once.
func wantRunOnce(t *testing.T, app *stallApp, calls []stallCall, round int, when string) {
	t.Helper()
	for _, c := range calls {
		if n := app.runsOf(c.id); n != 1 {
			t.Errorf("round %d, %s %s: the app ran it %d times %s, want exactly once", round, c.route, c.id, n, when)
		}
	}
}
