package pgtx_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
				{"a panic undoes everything", "d", "panic", 500, false, "internal_error", 1},
				{"an SQL error the handler swallowed is no success", "e", "swallow", 503, false, "store_unavailable", 1},
				{"nor is a commit that fails", "f", "deferred", 503, false, "store_unavailable", 1},
				{"which frees the key", "f", "deferred", 503, false, "store_unavailable", 1},
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
