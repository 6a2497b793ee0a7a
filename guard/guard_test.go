package guard_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/store/storetest"
	"github.com/replayguard/replayguard/token"
)

func init() { gin.SetMode(gin.TestMode) }

// quiet discards the middleware's log lines (the panics the tests
// provoke).
var quiet = guard.WithLogger(slog.New(slog.DiscardHandler))

// newService returns a token service over a fresh memory store, closed
// with the test.
func newService(t *testing.T) *token.Service {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	svc, err := token.New(st, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(7))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

var machineIDs atomic.Uint32

// newTokenService returns a token service over st with its own machine ID,
// so that services sharing a real Redis never issue the same ID.
func newTokenService(t testing.TB, st store.Store, opts ...token.Option) *token.Service {
	t.Helper()
	svc, err := token.New(st, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}},
		append([]token.Option{token.WithMachineID(uint16(100 + machineIDs.Add(1)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// newFakeClock returns a clock that moves only when told to.
func newFakeClock() *storetest.Clock {
	return storetest.NewClock(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
}

// newRecordStore returns a memory store on clk (the real clock when nil),
// closed with the test.
func newRecordStore(t testing.TB, clk *storetest.Clock) *memory.Store {
	t.Helper()
	var opts []memory.Option
	if clk != nil {
		opts = append(opts, memory.WithClock(clk.Now))
	}
	st := memory.New(opts...)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// recordStores are the stores the record tests run on; the Redis ones
// skip (or fail, see internal/testenv) without their variables.
var recordStores = []struct {
	name string
	open func(t testing.TB) store.Store
}{
	{"memory", func(t testing.TB) store.Store { return newRecordStore(t, nil) }},
	{"redis", func(t testing.TB) store.Store {
		opt, err := goredis.ParseURL(testenv.Var(t, "REPLAYGUARD_TEST_REDIS_URL"))
		if err != nil {
			t.Fatalf("REPLAYGUARD_TEST_REDIS_URL: %v", err)
		}
		opt.ContextTimeoutEnabled = true
		opt.ReadTimeout, opt.WriteTimeout = -1, -1 // the store's timeout alone bounds a call, not go-redis's 3s
		s := redisstore.New(goredis.NewClient(opt), redisstore.WithPrefix(uniqueRedisPrefix(t)), redisstore.WithTimeout(5*time.Second))
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
	{"cluster", func(t testing.TB) store.Store {
		addrs := strings.Split(testenv.Var(t, "REPLAYGUARD_TEST_REDIS_CLUSTER_ADDRS"), ",")
		c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, ReadTimeout: -1, WriteTimeout: -1})
		s := redisstore.New(c, redisstore.WithPrefix(uniqueRedisPrefix(t)), redisstore.WithTimeout(5*time.Second))
		t.Cleanup(func() { _ = s.Close() })
		return s
	}},
}

func uniqueRedisPrefix(t testing.TB) string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "rgtest:idem:" + hex.EncodeToString(b) + ":"
}

func serve(h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// codeOf returns the code of a problem+json answer, or "".
func codeOf(w *httptest.ResponseRecorder) string {
	if w.Header().Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p problem.Problem
	_ = json.Unmarshal(w.Body.Bytes(), &p)
	return p.Code
}

// problemCode requires rec to be a problem+json answer and returns its
// code.
func problemCode(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, body %s", ct, rec.Body)
	}
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	return p.Code
}

// answer describes a recorded answer for failure messages.
func answer(w *httptest.ResponseRecorder) string {
	if w == nil {
		return "no answer"
	}
	return fmt.Sprintf("%d %q", w.Code, codeOf(w))
}

// sendHeld sends n requests at once, send(i) each, to a handler whose one
// run waits on hold: n-1 answers arrive while it waits, then hold is
// closed and the last arrives. It returns every answer.
func sendHeld(n int, hold chan struct{}, send func(i int) *httptest.ResponseRecorder) []*httptest.ResponseRecorder {
	start := make(chan struct{})
	results := make(chan *httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results <- send(i)
		})
	}
	close(start)
	var got []*httptest.ResponseRecorder
	for range n - 1 { // the one that runs is held
		got = append(got, <-results)
	}
	close(hold)
	wg.Wait()
	return append(got, <-results)
}

// wantOneRun checks sendHeld's answers: the handler ran once (runs), one
// answer is its fresh status, and every other is 409 request_in_progress
// with Retry-After: 1.
func wantOneRun(t *testing.T, got []*httptest.ResponseRecorder, status int, runs int32) {
	t.Helper()
	counts := map[string]int{}
	for _, w := range got {
		switch {
		case w.Code == status && w.Header().Get(idempotency.ReplayedHeader) == "":
			counts["ran"]++
		case w.Code == 409 && codeOf(w) == "request_in_progress" && w.Header().Get("Retry-After") == "1":
			counts["in progress"]++
		default:
			t.Errorf("unexpected answer %d %v %s", w.Code, w.Header(), w.Body)
		}
	}
	if runs != 1 || counts["ran"] != 1 || counts["in progress"] != len(got)-1 {
		t.Fatalf("runs=%d answers=%v, want 1 run, 1 first answer, %d in progress", runs, counts, len(got)-1)
	}
}
