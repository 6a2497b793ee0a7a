package guard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// TestRecordKeyFindsIdempotentsRecord: RecordKey, given a request as its
// client sent it and the middleware's options, derives the key Idempotent
// stored its record under, so that an operator finds the record (state
// and stored status) and can release it by hand; another caller, method,
// route or key derives another key.
func TestRecordKeyFindsIdempotentsRecord(t *testing.T) {
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	k := idempotency.New(st)
	opts := []guard.Option{guard.WithScope(guard.Credentials("X-Tenant"))}
	app := &orders{}
	mux := http.NewServeMux()
	mux.Handle("POST /carts/{id}", guard.Idempotent(k, opts...)(app))
	send := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/carts/7", strings.NewReader(`{"qty":1}`))
		r.Header.Set(idempotency.KeyHeader, key)
		r.Header.Set("Authorization", "Bearer alice")
		r.Header.Set("X-Tenant", "acme")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	if w := send(`"cart-1"`); w.Code != http.StatusCreated {
		t.Fatalf("first request = %d %s", w.Code, w.Body)
	}
	// What the operator describes: the same request, without its body,
	// the key as sent or bare, matched to its route.
	described := func(method, target, key string, header ...string) *http.Request {
		r := httptest.NewRequest(method, target, nil)
		r.Pattern = "POST /carts/{id}"
		if key != "" {
			r.Header.Set(idempotency.KeyHeader, key)
		}
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		return r
	}
	caller := []string{"Authorization", "Bearer alice", "X-Tenant", "acme"}
	tests := []struct {
		name  string
		r     *http.Request
		err   error // of RecordKey
		found bool
	}{
		{"the key as sent", described("POST", "/carts/7", `"cart-1"`, caller...), nil, true},
		{"the key bare", described("POST", "/carts/7", "cart-1", caller...), nil, true},
		{"another key", described("POST", "/carts/7", `"cart-2"`, caller...), nil, false},
		{"another caller", described("POST", "/carts/7", `"cart-1"`, "Authorization", "Bearer bob", "X-Tenant", "acme"), nil, false},
		{"another tenant header", described("POST", "/carts/7", `"cart-1"`, "Authorization", "Bearer alice"), nil, false},
		{"another method", described("PATCH", "/carts/7", `"cart-1"`, caller...), nil, false},
		{"no key", described("POST", "/carts/7", "", caller...), idempotency.ErrKeyMissing, false},
		{"a malformed key", described("POST", "/carts/7", `"unterminated`, caller...), idempotency.ErrInvalidKey, false},
		{"a method Idempotent lets through", described("GET", "/carts/7", `"cart-1"`, caller...), problem.ErrBadRequest, false},
	}
	for _, tc := range tests {
		key, err := guard.RecordKey(tc.r, opts...)
		if !errors.Is(err, tc.err) {
			t.Fatalf("%s: RecordKey error %v, want %v", tc.name, err, tc.err)
		}
		if err != nil {
			continue
		}
		info, found, err := k.Lookup(t.Context(), key)
		if err != nil || found != tc.found {
			t.Fatalf("%s: Lookup(%s) = %v %v, want found %v", tc.name, idempotency.RecordID(key), found, err, tc.found)
		}
		if found && (!info.Completed || info.Status != http.StatusCreated || !info.BodyStored || !strings.HasPrefix(info.ID, "idem:")) {
			t.Fatalf("%s: record %+v, want completed with 201", tc.name, info)
		}
	}

	// Released by hand while processing, the key's next retry runs.
	block, release := make(chan struct{}), make(chan struct{})
	app.handle = func(w http.ResponseWriter, r *http.Request, run int32) {
		if run == 2 {
			close(block)
			<-release
			w.WriteHeader(http.StatusServiceUnavailable) // would release anyway: the record is gone
			return
		}
		created(w, r, run)
	}
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- send(`"cart-3"`) }()
	<-block
	key, err := guard.RecordKey(described("POST", "/carts/7", `"cart-3"`, caller...), opts...)
	if err != nil {
		t.Fatal(err)
	}
	if info, found, err := k.Lookup(t.Context(), key); err != nil || !found || info.Completed || info.LeaseEnds.IsZero() {
		t.Fatalf("while running: %+v %v %v, want a processing record with its lease end", info, found, err)
	}
	if released, err := k.Release(t.Context(), key); !released || err != nil {
		t.Fatalf("Release = %v %v", released, err)
	}
	if w := send(`"cart-3"`); w.Code != http.StatusCreated || w.Header().Get(idempotency.ReplayedHeader) != "" {
		t.Fatalf("the retry after the release = %d %v, want it run", w.Code, w.Header())
	}
	close(release)
	<-done
	if n := app.runs.Load(); n != 3 {
		t.Fatalf("%d runs, want 3", n)
	}
}

// TestMiddlewareNamesTheRecordForTheLog: every record a middleware opens
// or finds is named in the request's context (problem.SetRecordKey) for
// its log line, whether the request ran, was replayed or was refused as
// in progress; a request that meets no record names none.
func TestMiddlewareNamesTheRecordForTheLog(t *testing.T) {
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	k := idempotency.New(st)
	started, unblock := make(chan struct{}), make(chan struct{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			close(started)
			<-unblock
		}
		w.WriteHeader(http.StatusCreated)
	})
	// send serves a request through h and returns the record it named.
	send := func(h http.Handler, r *http.Request) (string, int) {
		ctx := problem.WithRequestID(context.Background(), "req")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r.WithContext(ctx))
		return problem.RecordID(ctx), w.Code
	}
	post := func(key, body string, block bool) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		if key != "" {
			r.Header.Set(idempotency.KeyHeader, key)
		}
		if block {
			r.Header.Set("X-Block", "1")
		}
		return r
	}
	idem := guard.Idempotent(k, guard.WithKeyRequired(false), guard.WithFingerprintWindow(time.Minute))(app)
	keyed, _ := send(idem, post(`"k1"`, "{}", false))
	if !strings.HasPrefix(keyed, "idem:") || len(keyed) != len("idem:")+64 {
		t.Fatalf("a keyed request names %q, want idem: and 64 hex digits", keyed)
	}
	if again, code := send(idem, post(`"k1"`, "{}", false)); again != keyed || code != http.StatusCreated {
		t.Fatalf("its replay (%d) names %q, want %q", code, again, keyed)
	}
	if other, _ := send(idem, post(`"k2"`, "{}", false)); other == keyed || other == "" {
		t.Fatalf("another key names %q", other)
	}
	if fp, _ := send(idem, post("", `{"a":1}`, false)); fp == "" || fp == keyed {
		t.Fatalf("a keyless request in fingerprint mode names %q", fp)
	}
	done := make(chan string)
	go func() { id, _ := send(idem, post(`"k3"`, "{}", true)); done <- id }()
	<-started
	inProgress, code := send(idem, post(`"k3"`, "{}", false))
	close(unblock)
	if first := <-done; code != http.StatusConflict || inProgress != first || first == "" {
		t.Fatalf("the duplicate in progress (%d) names %q, the first %q", code, inProgress, first)
	}
	plain := guard.Idempotent(k, guard.WithKeyRequired(false))(app)
	if id, _ := send(plain, post("", "{}", false)); id != "" {
		t.Fatalf("a request without a record names %q", id)
	}

	// A token's record, opened and then found.
	svc := newTokenService(t, st)
	is, err := svc.Issue(t.Context(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		t.Fatal(err)
	}
	withToken := func(block bool) *http.Request {
		r := post("", "", block)
		r.Header.Set(token.Header, is.Token)
		return r
	}
	started, unblock = make(chan struct{}), make(chan struct{})
	checkout := guard.RequireToken(svc, "checkout", guard.WithRecords(k))(app)
	go func() { id, _ := send(checkout, withToken(true)); done <- id }()
	<-started
	inProgress, code = send(checkout, withToken(false))
	close(unblock)
	if first := <-done; code != http.StatusConflict || first != "token:"+is.ID || inProgress != first {
		t.Fatalf("the token's request names %q, its duplicate in progress (%d) %q; want token:%s", first, code, inProgress, is.ID)
	}
	if replayed, code := send(checkout, withToken(false)); replayed != "token:"+is.ID || code != http.StatusCreated {
		t.Fatalf("the replay (%d) names %q", code, replayed)
	}
	if id, code := send(guard.RequireToken(svc, "checkout")(app), withToken(false)); id != "" {
		t.Fatalf("a redemption without records (%d) names %q", code, id)
	}
}
