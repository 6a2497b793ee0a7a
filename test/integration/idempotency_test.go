package integration

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store"
)

// orderBody is the body of every keyed request in the idempotency tests.
const orderBody = `{"item":"book","qty":2}`

// orderApp is the application behind the Idempotency-Key middleware: it
// counts its executions, per key and in all, and answers 201 with a
// body naming the execution, headers worth replaying (one of them
// multi-valued) and a cookie that is not.
type orderApp struct {
	// hold, when set, runs at the start of every execution, before the
	// answer: the tests block it there.
	hold func(r *http.Request)

	total atomic.Int32
	mu    sync.Mutex
	byKey map[string]int
}

func (a *orderApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.total.Add(1)
	key := r.Header.Get(idempotency.KeyHeader)
	a.mu.Lock()
	if a.byKey == nil {
		a.byKey = map[string]int{}
	}
	a.byKey[key]++
	a.mu.Unlock()
	if a.hold != nil {
		a.hold(r)
	}
	body, _ := io.ReadAll(r.Body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/orders/"+strconv.Itoa(int(n)))
	h.Add("X-Order-Tag", "first")
	h.Add("X-Order-Tag", "second")
	h.Set("Set-Cookie", "session=first-caller; Path=/; HttpOnly")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"run":%d,"order":%s}`, n, body)
}

// runs returns how many times the application ran for the Idempotency-Key
// header value key.
func (a *orderApp) runs(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byKey[key]
}

// idemServer serves POST /orders through the Idempotency-Key middleware
// (guard.Idempotent over an idempotency.Keeper) on a real HTTP
// listener.
type idemServer struct {
	URL    string
	Client *http.Client
}

// startIdemServer serves app behind NewIdempotencyGuard(idempotency.New(st,
// opts...)) until the test ends; wrap, when not nil, wraps the whole
// server (it sees every request before the middleware does). It takes
// ownership of st: the store is closed after the listener.
func startIdemServer(t *testing.T, st store.Store, app http.Handler, wrap func(http.Handler) http.Handler, conns int, opts ...idempotency.Option) *idemServer {
	t.Helper()
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	idempotent := guard.Idempotent(idempotency.New(st, opts...), guard.WithLogger(slog.New(slog.DiscardHandler)))
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idempotent(app))
	var h http.Handler = mux
	if wrap != nil {
		h = wrap(mux)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return &idemServer{URL: ts.URL, Client: newClient(t, conns)}
}

// orderRequest builds POST /orders with orderBody and Idempotency-Key:
// "key" for a server at base. It never fails the test, so goroutines may
// call it.
func orderRequest(base, key string) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(orderBody))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idempotency.KeyHeader, strconv.Quote(key))
	return req, nil
}

// order sends one keyed POST /orders and reads the whole answer.
func (s *idemServer) order(t *testing.T, key string) reply {
	t.Helper()
	req, err := orderRequest(s.URL, key)
	if err != nil {
		t.Fatal(err)
	}
	r, err := send(s.Client, req)
	if err != nil {
		t.Fatalf("POST /orders with key %q: %v", key, err)
	}
	return r
}

// answer is one of several answers to requests sent at once.
type answer struct {
	reply
	err error     // in place of the reply
	at  time.Time // when it was read in full
}

// orders sends n keyed POST /orders at once (released together) and
// returns every answer.
func (s *idemServer) orders(key string, n int) []answer {
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		req, err := orderRequest(s.URL, key)
		if err != nil {
			answers[i].err = err
			continue
		}
		wg.Go(func() {
			<-start
			r, err := send(s.Client, req)
			answers[i] = answer{reply: r, err: err, at: time.Now()}
		})
	}
	close(start)
	wg.Wait()
	return answers
}

// isReplay reports whether r says it is a stored response.
func isReplay(r reply) bool { return r.Header.Get(idempotency.ReplayedHeader) == "true" }

// isFresh reports whether r is an execution's own 201, not a replay.
func isFresh(r reply) bool { return r.Status == http.StatusCreated && !isReplay(r) }

// wantFresh requires r to be the application's own answer: 201, with its
// cookie, without Idempotent-Replayed.
func wantFresh(t *testing.T, r reply) {
	t.Helper()
	if r.Status != http.StatusCreated {
		t.Fatalf("status %d, want the handler's 201: %s", r.Status, r.Body)
	}
	if isReplay(r) {
		t.Errorf("the first execution's answer carries %s: %q", idempotency.ReplayedHeader, r.Header.Get(idempotency.ReplayedHeader))
	}
	if r.Header.Get("Set-Cookie") == "" {
		t.Errorf("the first execution's answer lost its Set-Cookie")
	}
}

// notReplayed are the headers a replay may not repeat (Set-Cookie), must
// add (Idempotent-Replayed) or has its own of (Date).
var notReplayed = map[string]bool{"Date": true, "Set-Cookie": true, idempotency.ReplayedHeader: true}

// wantReplayOf requires r to be first served again: the same status and
// body byte for byte, the same headers except Date, no Set-Cookie, and
// Idempotent-Replayed: true.
func wantReplayOf(t *testing.T, first, r reply) {
	t.Helper()
	if r.Status != first.Status {
		t.Errorf("replay status %d, want %d: %s", r.Status, first.Status, r.Body)
	}
	if !bytes.Equal(r.Body, first.Body) {
		t.Errorf("replay body %q, want the first answer's %q", r.Body, first.Body)
	}
	if got := r.Header.Values(idempotency.ReplayedHeader); !slices.Equal(got, []string{"true"}) {
		t.Errorf("replay %s = %q, want [true]", idempotency.ReplayedHeader, got)
	}
	if got := r.Header.Values("Set-Cookie"); len(got) > 0 {
		t.Errorf("replay repeats the first caller's Set-Cookie %q", got)
	}
	names := map[string]bool{}
	for name := range first.Header {
		names[name] = true
	}
	for name := range r.Header {
		names[name] = true
	}
	for name := range names {
		if notReplayed[name] {
			continue
		}
		if got, want := r.Header.Values(name), first.Header.Values(name); !slices.Equal(got, want) {
			t.Errorf("replay header %s = %q, want the first answer's %q", name, got, want)
		}
	}
}

// wantInProgress requires r to be 409 request_in_progress with a
// Retry-After of whole seconds.
func wantInProgress(t *testing.T, r reply) {
	t.Helper()
	wantProblem(t, r, http.StatusConflict, "request_in_progress")
	if n, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || n < 1 {
		t.Errorf("409 request_in_progress with Retry-After %q, want whole seconds >= 1", r.Header.Get("Retry-After"))
	}
}

// wantStoreUnavailable requires r to be 503 store_unavailable with a
// Retry-After.
func wantStoreUnavailable(t *testing.T, r reply) {
	t.Helper()
	wantProblem(t, r, http.StatusServiceUnavailable, "store_unavailable")
	if r.Header.Get("Retry-After") == "" {
		t.Errorf("503 store_unavailable without Retry-After")
	}
	if isReplay(r) {
		t.Errorf("503 with %s", idempotency.ReplayedHeader)
	}
}

// describeOrder names an answer for a tally: "fresh 201", "replay 201",
// "409 request_in_progress", "error: ...".
func describeOrder(r reply, err error) string {
	switch {
	case err != nil:
		return "error: " + err.Error()
	case isFresh(r):
		return "fresh 201"
	case isReplay(r):
		return "replay " + strconv.Itoa(r.Status)
	}
	return strconv.Itoa(r.Status) + " " + problemCode(r.Body)
}

// Shape of TestIdempotencyConcurrentKey.
const (
	sameKeyRequests = 50
	// heldUntilAnswered is how many duplicates must have been answered
	// (each with 409, since the one execution is held) before the held
	// execution may finish; the rest race with its completion.
	heldUntilAnswered = (sameKeyRequests - 1) / 2
	// holdBound ends the hold if the gate never opens, so that a broken
	// run fails instead of hanging.
	holdBound = time.Minute
)

// holdGate opens once all sameKeyRequests requests have reached the
// server and heldUntilAnswered of them have been answered.
type holdGate struct {
	arrived, answered atomic.Int32
	open              chan struct{}
	once              sync.Once
}

func (g *holdGate) check() {
	if g.arrived.Load() == sameKeyRequests && g.answered.Load() >= heldUntilAnswered {
		g.once.Do(func() { close(g.open) })
	}
}

// wrap counts the requests that reach the server and those answered.
func (g *holdGate) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.arrived.Add(1)
		g.check()
		next.ServeHTTP(w, r)
		g.answered.Add(1)
		g.check()
	})
}

// TestIdempotencyConcurrentKey sends fifty requests with one
// Idempotency-Key and one body at once through a real HTTP server, on
// every store: the handler runs exactly once, and every other request
// gets either its stored response (byte-identical, with
// Idempotent-Replayed: true) or 409 request_in_progress with
// Retry-After. The one execution is held until all fifty have reached
// the server and half of the duplicates were answered, so some
// duplicates must see it processing and the rest race with its
// completion; a duplicate sent afterwards gets the replay.
func TestIdempotencyConcurrentKey(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			gate := &holdGate{open: make(chan struct{})}
			var timedOut atomic.Bool
			app := &orderApp{hold: func(*http.Request) {
				select {
				case <-gate.open:
				case <-time.After(holdBound):
					timedOut.Store(true)
				}
			}}
			s := startIdemServer(t, b.open(t, uniquePrefix(t)), app, gate.wrap, sameKeyRequests+1)
			key := "order-" + randomHex(t, 8)

			answers := s.orders(key, sameKeyRequests)
			if timedOut.Load() {
				t.Fatalf("the execution was held %v: %d of %d requests arrived, %d answered",
					holdBound, gate.arrived.Load(), sameKeyRequests, gate.answered.Load())
			}

			counts := map[string]int{}
			var first reply
			for _, a := range answers {
				counts[describeOrder(a.reply, a.err)]++
				if a.err == nil && isFresh(a.reply) {
					first = a.reply
				}
			}
			t.Logf("answers to %d requests with one key:\n%s", sameKeyRequests, formatCounts(counts))
			if got := app.runs(strconv.Quote(key)); got != 1 {
				t.Fatalf("the handler ran %d times, want exactly once", got)
			}
			if counts["fresh 201"] != 1 {
				t.Fatalf("%d answers are the execution's own, want exactly 1", counts["fresh 201"])
			}
			wantFresh(t, first)
			inProgress := 0
			for i, a := range answers {
				switch {
				case a.err != nil:
					t.Errorf("request %d: %v", i, a.err)
				case isFresh(a.reply):
				case isReplay(a.reply):
					wantReplayOf(t, first, a.reply)
				default:
					wantInProgress(t, a.reply)
					inProgress++
				}
			}
			if inProgress < heldUntilAnswered {
				t.Errorf("%d duplicates got 409 while the execution was held, want at least %d", inProgress, heldUntilAnswered)
			}

			t.Run("a duplicate after the execution gets the replay", func(t *testing.T) {
				wantReplayOf(t, first, s.order(t, key))
				if got := app.total.Load(); got != 1 {
					t.Errorf("the handler ran %d times, want 1", got)
				}
			})
		})
	}
}
