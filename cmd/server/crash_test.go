package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
)

// TestHolderKilledMidCall kills, with SIGKILL, the server whose request
// holds a key's record while the app runs it, on a private Redis, with a
// 2 s lease and the default grace (one lease): a second server on the
// same Redis answers retries with 409 request_in_progress until the
// record's lease and grace have run out since it was opened (not sooner:
// the dead holder's heartbeat renewed it until the kill), then exactly
// one retry runs the app again, and every later one gets its replay.
func TestHolderKilledMidCall(t *testing.T) {
	const (
		lease = 2 * time.Second
		grace = lease // the default
		// retries is how many retries are sent at once, in every round.
		retries = 5
	)
	p := testenv.StartRedis(t, testenv.RedisServer(t))
	app := newKillApp(t)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"REPLAYGUARD_REDIS_URL=redis://" + p.Addr() + "/0",
		"REPLAYGUARD_UPSTREAM=" + app.url,
		"REPLAYGUARD_ROUTES=" + routes,
		"REPLAYGUARD_IDEMPOTENCY_LOCK_TTL=" + lease.String(),
		"REPLAYGUARD_STORE_TIMEOUT=" + stallStoreTimeout.String(),
	}
	holder, holderAddr, _ := server(t, env...)
	// The server that takes over starts first, so that its start-up
	// does not use up the lease.
	_, takerAddr, takerLogs := server(t, env...)
	key := strconv.Quote("killed-" + randomHex(t))
	order := func(addr string) *http.Request {
		return newReq(t, "POST", "http://"+addr+"/orders", `{"item":"book"}`, "Idempotency-Key", key, "Content-Type", "application/json")
	}

	// The first request: the app holds it until the holder is gone.
	firstReq := order(holderAddr)
	firstSent := time.Now()
	first := make(chan result, 1)
	go func() { first <- try(firstReq) }()
	select {
	case <-app.started:
	case r := <-first:
		t.Fatalf("the holder answered before the app had the request: %d %s %v", r.status, r.body, r.err)
	case <-time.After(stallBound):
		t.Fatalf("the app did not receive the request within %v", stallBound)
	}
	started := time.Now()
	if err := holder.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = holder.Wait()
	killed := time.Now()
	if ws, ok := holder.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the holder ended with %v, want killed by SIGKILL", holder.ProcessState)
	}
	if r := <-first; r.err == nil {
		t.Fatalf("the killed holder answered: %d %s", r.status, r.body)
	}
	t.Logf("the app had the request %v after it was sent; the holder was killed %v after that",
		started.Sub(firstSent).Round(time.Millisecond), killed.Sub(started).Round(time.Millisecond))

	// Rounds of retries at once to the other server, until one runs.
	var ran result
	var ranAt time.Time
	inProgress := 0
	for ran.status == 0 {
		answers := make([]stallAnswer, retries)
		var wg sync.WaitGroup
		for i := range answers {
			req := order(takerAddr)
			wg.Go(func() {
				sent := time.Now()
				r := try(req)
				answers[i] = stallAnswer{r, sent, time.Now()}
			})
		}
		wg.Wait()
		for i, a := range answers {
			switch {
			case a.err != nil:
				t.Fatalf("retry %d: %v", i, a.err)
			case a.status == http.StatusConflict && a.code() == "request_in_progress":
				inProgress++
			case a.status == http.StatusCreated && a.header.Get("Idempotent-Replayed") == "":
				if ran.status != 0 {
					t.Fatalf("two retries at once ran the app: %s and %s", ran.body, a.body)
				}
				ran, ranAt = a.result, a.got
			case a.status == http.StatusCreated && a.header.Get("Idempotent-Replayed") == "true" && ran.status != 0:
				// the replay of the run beside it
			default:
				t.Fatalf("retry %d = %d %v %s; want 409 request_in_progress, or the app's answer", i, a.status, a.header, a.body)
			}
		}
		if ran.status != 0 {
			break
		}
		if n := app.runsOf(key); n != 1 {
			t.Fatalf("the app ran the key %d times while retries got 409, want 1", n)
		}
		if time.Since(killed) > lease+grace+stallBound {
			t.Fatalf("retries still get 409 %v after the kill; the lease and grace are %v", time.Since(killed), lease+grace)
		}
		time.Sleep(100 * time.Millisecond) // the lease and grace end on Redis's clock: polling it
	}
	t.Logf("%d retries got 409 request_in_progress; one ran the app %v after the first request was sent, %v after the kill",
		inProgress, ranAt.Sub(firstSent).Round(time.Millisecond), ranAt.Sub(killed).Round(time.Millisecond))
	// The record was opened after the first request was sent, and lives
	// the lease and the grace from its last renewal at least (a little
	// slack for Redis's millisecond clock).
	if d := ranAt.Sub(firstSent); d < lease+grace-10*time.Millisecond {
		t.Errorf("a retry ran the app %v after the first request was sent, inside the lease and grace (%v)", d, lease+grace)
	}
	if inProgress == 0 {
		t.Error("no retry got 409 request_in_progress before one ran the app")
	}
	if n := app.runsOf(key); n != 2 {
		t.Fatalf("the app ran the key %d times, want 2: the killed holder's and one retry's", n)
	}

	for i := range 3 {
		r := try(order(takerAddr))
		if r.status != ran.status || r.header.Get("Idempotent-Replayed") != "true" || r.body != ran.body {
			t.Errorf("later retry %d = %d %v %s, want the replay of %d %s", i, r.status, r.header, r.body, ran.status, ran.body)
		}
	}
	if n := app.runsOf(key); n != 2 {
		t.Errorf("the app ran the key %d times in all, want 2", n)
	}
	if t.Failed() {
		t.Logf("the second server's logs:\n%s", takerLogs.String())
	}
}

// killApp is TestHolderKilledMidCall's app: it counts its executions by
// Idempotency-Key and holds the first until its request is canceled (the
// holder died) or the test ends; the others answer 201 at once.
type killApp struct {
	url     string
	started chan struct{} // closed when the first execution starts

	mu   sync.Mutex
	runs map[string]int
}

func newKillApp(t *testing.T) *killApp {
	t.Helper()
	a := &killApp{started: make(chan struct{}), runs: map[string]int{}}
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		a.mu.Lock()
		a.runs[key]++
		run := a.runs[key]
		a.mu.Unlock()
		if run == 1 {
			close(a.started)
			select {
			case <-r.Context().Done():
			case <-done:
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%s,"run":%d}`, strconv.Quote(strings.Trim(key, `"`)), run)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) }) // runs first: lets a held execution go
	a.url = srv.URL
	return a
}

func (a *killApp) runsOf(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[key]
}
