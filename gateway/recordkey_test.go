package gateway_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/problem"
)

// recordKeyRoutes has a keyed route with a path parameter, a fingerprint
// route, and a route of each policy that keeps no record by key.
const recordKeyRoutes = `routes:
  - match: "POST /orders/{shop}"
    policy: idempotency_key
    required: true
  - match: "/comments"
    policy: fingerprint
  - match: "POST /checkout"
    policy: token
`

// TestRecordKeyFindsTheGatewaysRecord: a keyed request goes through the
// gateway to the app; the same request described to Gateway.RecordKey
// (headers, client IP, the key as sent, never its body) derives the key
// the gateway recorded it under, so Lookup shows it completed with the
// app's status. Another caller, key or path derives another key, and a
// request no keyed route records is refused. Released by hand while the
// app still runs, the record lets the next retry run.
func TestRecordKeyFindsTheGatewaysRecord(t *testing.T) {
	d := newDeps(t)
	up := newApp(t)
	routes, err := gateway.ParseRoutes([]byte(recordKeyRoutes))
	if err != nil {
		t.Fatal(err)
	}
	// The client IP the gateway finds, and RecordKey with it, is the
	// X-Real-IP a trusted proxy in front sets: the scope of requests
	// without credentials.
	gw, err := gateway.New(up.url(t), routes, quiet, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens),
		gateway.WithClientIP(func(r *http.Request) string { return r.Header.Get("X-Real-IP") }))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	send := func(path, key string, header ...string) (int, http.Header) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{"item":"book"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idempotency.KeyHeader, key)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		status, h, _ := do(t, req)
		return status, h
	}
	if status, _ := send("/orders/berlin", `"order-1"`, "Authorization", "Bearer alice"); status != http.StatusCreated {
		t.Fatalf("the keyed request = %d", status)
	}
	if status, _ := send("/comments", `"c-1"`, "X-Real-IP", "203.0.113.7"); status != http.StatusCreated {
		t.Fatalf("the keyed request without credentials = %d", status)
	}
	described := func(method, target, key string, header ...string) *http.Request {
		r := httptest.NewRequest(method, target, nil)
		if key != "" {
			r.Header.Set(idempotency.KeyHeader, key)
		}
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}
	tests := []struct {
		name  string
		r     *http.Request
		err   error
		found bool
	}{
		{"the same request", described("POST", "/orders/berlin", `"order-1"`, "Authorization", "Bearer alice"), nil, true},
		{"its method spelled in lowercase, its key bare", described("post", "/orders/berlin", "order-1", "Authorization", "Bearer alice"), nil, true},
		{"another caller", described("POST", "/orders/berlin", `"order-1"`, "Authorization", "Bearer bob"), nil, false},
		{"another key", described("POST", "/orders/berlin", `"order-2"`, "Authorization", "Bearer alice"), nil, false},
		{"another path of the route", described("POST", "/orders/paris", `"order-1"`, "Authorization", "Bearer alice"), nil, true}, // the route, not the path, is keyed
		{"a caller known by its IP", described("POST", "/comments", `"c-1"`, "X-Real-IP", "203.0.113.7"), nil, true},
		{"another IP", described("POST", "/comments", `"c-1"`, "X-Real-IP", "203.0.113.8"), nil, false},
		{"no key", described("POST", "/orders/berlin", "", "Authorization", "Bearer alice"), idempotency.ErrKeyMissing, false},
		{"no route", described("POST", "/carts", `"order-1"`), problem.ErrBadRequest, false},
		{"a method the route does not record", described("GET", "/comments", `"c-1"`), problem.ErrBadRequest, false},
		{"a token route", described("POST", "/checkout", `"order-1"`), problem.ErrBadRequest, false},
		{"a spelling the gateway redirects", described("POST", "/x/../orders/berlin", `"order-1"`), problem.ErrBadRequest, false},
		{"a spelling the gateway refuses", described("POST", "/orders/berlin;x", `"order-1"`), problem.ErrBadRequest, false},
	}
	for _, tc := range tests {
		key, err := gw.RecordKey(tc.r)
		if !errors.Is(err, tc.err) {
			t.Fatalf("%s: RecordKey error %v, want %v", tc.name, err, tc.err)
		}
		if err != nil {
			continue
		}
		info, found, err := d.keeper.Lookup(t.Context(), key)
		if err != nil || found != tc.found {
			t.Fatalf("%s: Lookup(%s) = %v %v, want found %v", tc.name, idempotency.RecordID(key), found, err, tc.found)
		}
		if found && (!info.Completed || info.Status != http.StatusCreated || !info.BodyStored) {
			t.Fatalf("%s: %+v, want completed with the app's 201", tc.name, info)
		}
	}

	// A request the app is still running: processing; released by hand,
	// the next retry runs the app again.
	started, finish := make(chan struct{}), make(chan struct{})
	up.mu.Lock()
	up.respond = func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			close(started)
			<-finish
		}
		w.WriteHeader(http.StatusAccepted)
	}
	up.mu.Unlock()
	done := make(chan int)
	go func() {
		status, _ := send("/orders/berlin", `"order-3"`, "Authorization", "Bearer alice", "X-Slow", "1")
		done <- status
	}()
	<-started
	key, err := gw.RecordKey(described("POST", "/orders/berlin", `"order-3"`, "Authorization", "Bearer alice"))
	if err != nil {
		t.Fatal(err)
	}
	if info, found, err := d.keeper.Lookup(t.Context(), key); err != nil || !found || info.Completed {
		t.Fatalf("while the app runs: %+v %v %v, want processing", info, found, err)
	}
	if status, _ := send("/orders/berlin", `"order-3"`, "Authorization", "Bearer alice"); status != http.StatusConflict {
		t.Fatalf("a retry while processing = %d, want 409", status)
	}
	if released, err := d.keeper.Release(t.Context(), key); !released || err != nil {
		t.Fatalf("Release = %v %v", released, err)
	}
	before := len(up.requests())
	if status, h := send("/orders/berlin", `"order-3"`, "Authorization", "Bearer alice"); status != http.StatusAccepted || h.Get(idempotency.ReplayedHeader) != "" {
		t.Fatalf("the retry after the release = %d %v, want the app's own 202", status, h)
	}
	if n := len(up.requests()) - before; n != 1 {
		t.Fatalf("the retry reached the app %d times, want once", n)
	}
	close(finish)
	<-done
}
