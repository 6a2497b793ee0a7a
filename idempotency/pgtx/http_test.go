package pgtx_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/idempotency/pgtx"
	"github.com/replayguard/replayguard/problem"
)

// orderHandler inserts an order on the request's transaction, then
// answers as the body says: "ok" 201, "refuse" 409, "fail" 500, "panic",
// "swallow" (an SQL error it ignores, then 201), "deferred" (a deferred
// constraint that fails at commit, then 201).
func orderHandler(t *testing.T) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := pgtx.From(r.Context())
		if !ok {
			t.Error("no transaction in the request context")
			return
		}
		var body struct{ Item string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		ctx := r.Context()
		if err := tx.Exec(ctx, `INSERT INTO orders (item) VALUES ($1)`, body.Item); err != nil {
			t.Errorf("insert: %v", err)
		}
		switch body.Item {
		case "refuse":
			w.WriteHeader(http.StatusConflict)
		case "fail":
			w.WriteHeader(http.StatusInternalServerError)
		case "panic":
			panic("boom")
		case "swallow":
			_ = tx.Exec(ctx, `SELECT 1/0`)
			w.WriteHeader(http.StatusCreated)
		case "deferred":
			_ = tx.Exec(ctx, `INSERT INTO once (v) VALUES (1), (1)`)
			w.WriteHeader(http.StatusCreated)
		default:
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = w.Write([]byte(`{"item":"` + body.Item + `"}`))
	})
}

func TestIdempotentMiddleware(t *testing.T) {
	f := newFixture(t)
	if _, err := f.pool.Exec(context.Background(), `CREATE TABLE once (v int UNIQUE DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	for name, db := range f.dbs() {
		t.Run(name, func(t *testing.T) {
			h := pgtx.Idempotent(db)(orderHandler(t))
			send := func(key, item string) *httptest.ResponseRecorder {
				defer func() { _ = recover() }() // the panicking handler
				r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"`+item+`"}`))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set(idempotency.KeyHeader, `"`+name+key+`"`)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return w
			}
			before := f.orders(t)
			steps := []struct {
				name, key, item string
				wantStatus      int
				wantReplayed    bool
				wantCode        string
				wantOrders      int
			}{
				{"a 201 commits the order and the response", "a", "ok", 201, false, "", 1},
				{"its duplicate is replayed", "a", "ok", 201, true, "", 1},
				{"the key with another body is refused", "a", "other", 422, false, "idempotency_key_reused", 1},
				{"a 409 undoes the order and stores the answer", "b", "refuse", 409, false, "", 1},
				{"its retry gets the same 409", "b", "refuse", 409, true, "", 1},
				{"a 500 undoes everything", "c", "fail", 500, false, "", 1},
				{"its retry runs again", "c", "fail", 500, false, "", 1},
				{"a retry with another body after a 500 runs as a first request, not 422", "c", "ok", 201, false, "", 2},
				{"a panic undoes everything", "d", "panic", 500, false, "internal_error", 2},
				{"an SQL error the handler swallowed is no success", "e", "swallow", 503, false, "store_unavailable", 2},
				{"nor is a commit that fails", "f", "deferred", 503, false, "store_unavailable", 2},
				{"which frees the key", "f", "deferred", 503, false, "store_unavailable", 2},
			}
			for _, s := range steps {
				w := send(s.key, s.item)
				code := ""
				if w.Header().Get("Content-Type") == "application/problem+json" {
					var p problem.Problem
					_ = json.Unmarshal(w.Body.Bytes(), &p)
					code = p.Code
				}
				if w.Code != s.wantStatus || (w.Header().Get(idempotency.ReplayedHeader) == "true") != s.wantReplayed ||
					code != s.wantCode || f.orders(t)-before != s.wantOrders {
					t.Fatalf("%s: %d %s (replayed %q), %d orders; want %d %q replayed %v, %d orders",
						s.name, w.Code, w.Body, w.Header().Get(idempotency.ReplayedHeader), f.orders(t)-before, s.wantStatus, s.wantCode, s.wantReplayed, s.wantOrders)
				}
			}
		})
	}
}

// answer is what one request through the middleware got.
type answer struct {
	status               int
	body, code, replayed string
	retryAfter           string
}

// serve sends a POST /orders with key and body through h.
func serve(h http.Handler, key, body string) answer {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(idempotency.KeyHeader, `"`+key+`"`)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	a := answer{status: w.Code, body: w.Body.String(), replayed: w.Header().Get(idempotency.ReplayedHeader), retryAfter: w.Header().Get("Retry-After")}
	if w.Header().Get("Content-Type") == "application/problem+json" {
		var p problem.Problem
		_ = json.Unmarshal(w.Body.Bytes(), &p)
		a.code = p.Code
	}
	return a
}

// TestIdempotentConcurrentDuplicate holds the first request's transaction
// open in its handler and sends duplicates: one whose lock_timeout runs
// out first gets 409 request_in_progress with Retry-After, and one that
// waits within the default lock_timeout gets the committed response,
// replayed. The handler runs once.
func TestIdempotentConcurrentDuplicate(t *testing.T) {
	f := newFixture(t)
	for name, db := range f.dbs() {
		t.Run(name, func(t *testing.T) {
			var runs atomic.Int32
			held, release := make(chan int32), make(chan struct{}) // held carries the first transaction's backend pid
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, _ := pgtx.From(r.Context())
				if err := tx.Exec(r.Context(), `INSERT INTO orders (item) VALUES ('held')`); err != nil {
					t.Errorf("insert: %v", err)
				}
				if runs.Add(1) == 1 {
					var pid int32
					if err := tx.QueryRow(r.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
						t.Errorf("pg_backend_pid: %v", err)
					}
					held <- pid
					<-release
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(`{"item":"held"}`))
			})
			short := pgtx.Idempotent(db, pgtx.WithLockTimeout(100*time.Millisecond))(handler)
			waiting := pgtx.Idempotent(db)(handler) // DefaultLockTimeout
			key, body := name+"-held", `{"item":"held"}`
			before := f.orders(t)

			var first, waited answer
			var wg sync.WaitGroup
			wg.Go(func() { first = serve(short, key, body) })
			pid := <-held

			start := time.Now()
			busy := serve(short, key, body)
			if busy.status != http.StatusConflict || busy.code != "request_in_progress" || busy.retryAfter == "" {
				t.Errorf("a duplicate past lock_timeout = %d %q, Retry-After %q; want 409 request_in_progress with Retry-After",
					busy.status, busy.body, busy.retryAfter)
			}
			if took := time.Since(start); took < 100*time.Millisecond {
				t.Errorf("it was answered after %v, before its lock_timeout of 100ms", took)
			}

			wg.Go(func() { waited = serve(waiting, key, body) })
			// Release the first request once the second waits on its lock.
			deadline := time.Now().Add(10 * time.Second)
			for {
				var n int
				if err := f.monitor.QueryRow(context.Background(),
					`SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))`, pid).Scan(&n); err != nil {
					t.Errorf("pg_blocking_pids: %v", err)
					break
				}
				if n > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Error("the second duplicate never waited on the first request's lock")
					break
				}
				time.Sleep(10 * time.Millisecond) // polling PostgreSQL
			}
			close(release)
			wg.Wait()

			if first.status != http.StatusCreated || first.replayed != "" {
				t.Errorf("the first request = %d %q (replayed %q), want 201", first.status, first.body, first.replayed)
			}
			if waited.status != http.StatusCreated || waited.replayed != "true" || waited.body != first.body {
				t.Errorf("the duplicate that waited = %d %q (replayed %q), want the first's 201 %q replayed",
					waited.status, waited.body, waited.replayed, first.body)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("the handler ran %d times, want once", n)
			}
			if n := f.orders(t) - before; n != 1 {
				t.Errorf("%d orders, want 1", n)
			}
		})
	}
}

// TestIdempotentDefaultLockTimeout checks the lock_timeout the middleware
// sets on the transaction it hands the handler: 5 s by default, as
// documented, and WithLockTimeout's value otherwise.
func TestIdempotentDefaultLockTimeout(t *testing.T) {
	if pgtx.DefaultLockTimeout != 5*time.Second {
		t.Errorf("DefaultLockTimeout = %v, want 5s", pgtx.DefaultLockTimeout)
	}
	f := newFixture(t)
	for name, db := range f.dbs() {
		for _, c := range []struct {
			name string
			opts []pgtx.Option
			want string
		}{
			{"default", nil, "5s"},
			{"WithLockTimeout(250ms)", []pgtx.Option{pgtx.WithLockTimeout(250 * time.Millisecond)}, "250ms"},
			{"WithLockTimeout(0) keeps the default", []pgtx.Option{pgtx.WithLockTimeout(0)}, "5s"},
		} {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				var got string
				h := pgtx.Idempotent(db, c.opts...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					tx, _ := pgtx.From(r.Context())
					if err := tx.QueryRow(r.Context(), `SELECT current_setting('lock_timeout')`).Scan(&got); err != nil {
						t.Errorf("lock_timeout: %v", err)
					}
					w.WriteHeader(http.StatusNoContent)
				}))
				if a := serve(h, name+c.name, `{}`); a.status != http.StatusNoContent {
					t.Fatalf("request = %d %s", a.status, a.body)
				}
				if got != c.want {
					t.Errorf("lock_timeout in the handler's transaction = %q, want %q", got, c.want)
				}
			})
		}
	}
}
