package guard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// failingStore fails every Acquire with err, as a store does: wrapped in
// store.ErrUnavailable unless it is store.ErrFull.
type failingStore struct {
	store.Store
	err error
}

func (f failingStore) Acquire(context.Context, string, string, string, time.Duration) (store.Record, bool, error) {
	return store.Record{}, false, store.Unavailable("acquire", f.err)
}

// orders is the protected application: it counts its runs and answers
// with handle, 201 and the run number by default.
type orders struct {
	runs   atomic.Int32
	handle func(w http.ResponseWriter, r *http.Request, run int32)
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := o.runs.Add(1)
	if o.handle != nil {
		o.handle(w, r, n)
		return
	}
	created(w, r, n)
}

// created answers 201 with a Location and the run number and the body it
// read, so a replay can be told from a new run.
func created(w http.ResponseWriter, r *http.Request, run int32) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", run))
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"run":%d,"got":%q}`, run, body)
}

// idemShape mounts the protected routes behind mw (Idempotent) with one
// middleware shape: POST /orders, POST /carts/{id} and GET /orders.
type idemShape struct {
	name  string
	mount func(mw func(http.Handler) http.Handler, app http.Handler) http.Handler
}

var idemShapes = []idemShape{
	{"net/http", func(mw func(http.Handler) http.Handler, app http.Handler) http.Handler {
		mux := http.NewServeMux()
		mux.Handle("POST /orders", mw(app))
		mux.Handle("POST /carts/{id}", mw(app))
		mux.Handle("GET /orders", mw(app))
		return mux
	}},
	{"gin", func(mw func(http.Handler) http.Handler, app http.Handler) http.Handler {
		r := gin.New()
		_ = r.SetTrustedProxies(nil)
		h := gin.WrapH(app)
		r.POST("/orders", guard.Gin(mw), h)
		r.POST("/carts/:id", guard.Gin(mw), h)
		r.GET("/orders", guard.Gin(mw), h)
		return r
	}},
}

// req describes a request; its zero value is a JSON POST /orders from
// 192.0.2.1 with Idempotency-Key: "k1".
type req struct {
	method, path, body, ctype, remote string
	keys                              []string // raw header values; nil means "k1"
	noKey                             bool
	header                            http.Header
}

const defaultBody = `{"item":"book","qty":2}`

func (q req) build() *http.Request {
	method, path, body, ctype, remote := q.method, q.path, q.body, q.ctype, q.remote
	if method == "" {
		method = http.MethodPost
	}
	if path == "" {
		path = "/orders"
	}
	if body == "" && method != http.MethodGet {
		body = defaultBody
	}
	if ctype == "" {
		ctype = "application/json"
	}
	if remote == "" {
		remote = "192.0.2.1:1234"
	}
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = remote
	r.Header.Set("Content-Type", ctype)
	keys := q.keys
	if keys == nil {
		keys = []string{`"k1"`}
	}
	if !q.noKey {
		for _, k := range keys {
			r.Header.Add(idempotency.KeyHeader, k)
		}
	}
	for name, vs := range q.header {
		r.Header[name] = vs
	}
	return r
}

// step is one request of a scenario and what it must get.
type step struct {
	name         string
	req          req
	wantStatus   int
	wantCode     string // the problem code, "" for the application's answers
	wantReplayed bool
	wantRuns     int32 // application runs so far
	wantBody     string
}

func multipartBody(t testing.TB, boundary string, fields [][2]string) string {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	if err := mw.SetBoundary(boundary); err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		if err := mw.WriteField(f[0], f[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestIdempotentScenarios(t *testing.T) {
	status := func(code int) func(http.ResponseWriter, *http.Request, int32) {
		return func(w http.ResponseWriter, _ *http.Request, run int32) {
			w.WriteHeader(code)
			_, _ = fmt.Fprintf(w, "run %d", run)
		}
	}
	formA := url.Values{"item": {"book"}, "qty": {"2"}, "tag": {"a", "b"}}.Encode()
	formB := "tag=a&qty=2&tag=b&item=book" // the same fields in another order
	formC := "tag=b&qty=2&tag=a&item=book" // repeated field in another order: another request
	mpA := multipartBody(t, "boundaryA", [][2]string{{"item", "book"}, {"qty", "2"}, {"sent_at", "1"}})
	mpB := multipartBody(t, "boundaryB", [][2]string{{"qty", "2"}, {"sent_at", "2"}, {"item", "book"}})
	tests := []struct {
		name   string
		opts   []guard.Option
		keeper []idempotency.Option
		handle func(http.ResponseWriter, *http.Request, int32)
		steps  []step
	}{
		{
			name: "a duplicate after completion gets the stored response",
			steps: []step{
				{"first", req{}, 201, "", false, 1, `"run":1`},
				{"duplicate", req{}, 201, "", true, 1, `"run":1`},
				{"bare key means the same key", req{keys: []string{"k1"}}, 201, "", true, 1, `"run":1`},
			},
		},
		{
			name: "a reused key with another body is refused",
			steps: []step{
				{"first", req{}, 201, "", false, 1, ""},
				{"another body", req{body: `{"item":"book","qty":3}`}, 422, "idempotency_key_reused", false, 1, ""},
				{"another content type", req{ctype: "text/plain"}, 422, "idempotency_key_reused", false, 1, ""},
				{"a query", req{path: "/orders?coupon=x"}, 422, "idempotency_key_reused", false, 1, ""},
				{"the first body still replays", req{}, 201, "", true, 1, ""},
			},
		},
		{
			name: "canonical JSON ignores key order and whitespace",
			steps: []step{
				{"first", req{body: `{"item":"book","qty":2,"meta":{"a":1,"b":[1,2]}}`}, 201, "", false, 1, ""},
				{"reordered and spaced", req{body: " {\n \"meta\": {\"b\": [1, 2], \"a\": 1},\t\"qty\": 2, \"item\": \"book\"}\n"}, 201, "", true, 1, ""},
				{"an array in another order is another request", req{body: `{"item":"book","qty":2,"meta":{"a":1,"b":[2,1]}}`}, 422, "idempotency_key_reused", false, 1, ""},
				{"2.0 is not 2", req{body: `{"item":"book","qty":2.0,"meta":{"a":1,"b":[1,2]}}`}, 422, "idempotency_key_reused", false, 1, ""},
			},
		},
		{
			name: "ignored fields are left out of the fingerprint",
			opts: []guard.Option{guard.WithIgnoredFields("sent_at")},
			steps: []step{
				{"first", req{body: `{"item":"book","sent_at":"10:00:00"}`}, 201, "", false, 1, ""},
				{"a retry with a new timestamp", req{body: `{"sent_at":"10:00:05","item":"book"}`}, 201, "", true, 1, ""},
				{"multipart first", req{keys: []string{`"k2"`}, body: mpA, ctype: "multipart/form-data; boundary=boundaryA"}, 201, "", false, 2, ""},
				{"multipart reordered, new boundary and timestamp", req{keys: []string{`"k2"`}, body: mpB, ctype: "multipart/form-data; boundary=boundaryB"}, 201, "", true, 2, ""},
			},
		},
		{
			name: "a JSON body that names a member twice is refused before anything runs",
			steps: []step{
				{"amount twice", req{body: `{"amount":1,"amount":1000}`}, 400, "invalid_request", false, 0, ""},
				{"the same key with the body the app reads", req{body: `{"amount":1000}`}, 201, "", false, 1, ""},
			},
		},
		{
			// encoding/json reads qty 5 from the first and 1 from the
			// second (names match a struct field in any case, the last
			// wins), which would have one canonical form.
			name: "a JSON body that names a member twice in two cases is refused, in either order",
			steps: []step{
				{"qty then QTY", req{body: `{"item":"book","qty":1,"QTY":5}`}, 400, "invalid_request", false, 0, `the member \"qty\" twice in one object, the second time as \"QTY\"`},
				{"QTY then qty, with the same key", req{body: `{"QTY":5,"item":"book","qty":1}`}, 400, "invalid_request", false, 0, `the member \"QTY\" twice`},
				{"in a nested object", req{body: `{"order":{"item":"book","Qty":1,"qtY":5}}`}, 400, "invalid_request", false, 0, `\"Qty\"`},
				{"in an array of objects", req{body: `{"lines":[{"sku":"a"},{"sku":"b","SKU":"c"}]}`}, 400, "invalid_request", false, 0, `\"SKU\"`},
				{"the Kelvin sign is k", req{body: "{\"k\":1,\"\u212a\":2}"}, 400, "invalid_request", false, 0, "the member \\\"k\\\" twice"},
				{"the long s is s", req{body: `{"s":1,"\u017f":2}`}, 400, "invalid_request", false, 0, "the member \\\"s\\\" twice"},
				{"the same key with one qty runs", req{body: `{"item":"book","qty":1}`}, 201, "", false, 1, ""},
				{"and names in two cases in two objects are two members", req{keys: []string{`"k2"`}, body: `{"qty":1,"order":{"QTY":5}}`}, 201, "", false, 2, ""},
			},
		},
		{
			name: "a JSON body that is not Unicode text is refused before anything runs",
			steps: []step{
				{"a lone high surrogate", req{body: `{"a":"\ud800"}`}, 400, "invalid_request", false, 0, "lone surrogate"},
				{"another lone high surrogate", req{body: `{"a":"\udbff"}`}, 400, "invalid_request", false, 0, "lone surrogate"},
				{"a lone low surrogate in a name", req{body: `{"\udc00":1}`}, 400, "invalid_request", false, 0, "lone surrogate"},
				{"a raw 0xff", req{body: "{\"a\":\"\xff\"}"}, 400, "invalid_request", false, 0, "UTF-8"},
				{"a raw 0xfe", req{body: "{\"a\":\"\xfe\"}"}, 400, "invalid_request", false, 0, "UTF-8"},
				{"a surrogate pair is a character", req{body: `{"a":"\ud83d\ude00"}`}, 201, "", false, 1, ""},
				{"and the same character as UTF-8 is the same request", req{body: `{"a":"😀"}`}, 201, "", true, 1, ""},
				{"an escaped backslash is no escape", req{keys: []string{`"k2"`}, body: `{"a":"\\ud800"}`}, 201, "", false, 2, ""},
			},
		},
		{
			name: "form bodies are compared in canonical order",
			steps: []step{
				{"first", req{body: formA, ctype: "application/x-www-form-urlencoded"}, 201, "", false, 1, ""},
				{"fields reordered", req{body: formB, ctype: "application/x-www-form-urlencoded"}, 201, "", true, 1, ""},
				{"a repeated field's values reordered", req{body: formC, ctype: "application/x-www-form-urlencoded"}, 422, "idempotency_key_reused", false, 1, ""},
			},
		},
		{
			name: "another caller with the same key gets its own execution",
			steps: []step{
				{"first", req{}, 201, "", false, 1, `"run":1`},
				{"another IP", req{remote: "198.51.100.7:999"}, 201, "", false, 2, `"run":2`},
				{"its duplicate", req{remote: "198.51.100.7:1000"}, 201, "", true, 2, `"run":2`},
				{"the first caller still gets its own", req{}, 201, "", true, 2, `"run":1`},
			},
		},
		{
			name: "the scope is the caller's credentials before its IP",
			steps: []step{
				{"alice", req{header: http.Header{"Authorization": {"Bearer alice"}}}, 201, "", false, 1, `"run":1`},
				{"alice from another IP", req{remote: "198.51.100.7:1", header: http.Header{"Authorization": {"Bearer alice"}}}, 201, "", true, 1, `"run":1`},
				{"bob from alice's IP", req{header: http.Header{"Authorization": {"Bearer bob"}}}, 201, "", false, 2, `"run":2`},
				{"a session cookie behind the same NAT", req{header: http.Header{"Cookie": {"session=carol"}}}, 201, "", false, 3, `"run":3`},
				{"another session behind the same NAT", req{header: http.Header{"Cookie": {"session=dave"}}}, 201, "", false, 4, `"run":4`},
				{"carol again", req{header: http.Header{"Cookie": {"session=carol"}}}, 201, "", true, 4, `"run":3`},
				{"no credential falls back to the IP", req{}, 201, "", false, 5, `"run":5`},
			},
		},
		{
			name: "a configured header is one of the credentials",
			opts: []guard.Option{guard.WithScope(guard.Credentials("X-Tenant"))},
			steps: []step{
				{"tenant a", req{header: http.Header{"X-Tenant": {"a"}}}, 201, "", false, 1, `"run":1`},
				{"tenant a from another IP", req{remote: "198.51.100.7:1", header: http.Header{"X-Tenant": {"a"}}}, 201, "", true, 1, `"run":1`},
				{"tenant b", req{header: http.Header{"X-Tenant": {"b"}}}, 201, "", false, 2, `"run":2`},
				{"tenant a with a session is another caller", req{header: http.Header{"X-Tenant": {"a"}, "Cookie": {"s=1"}}}, 201, "", false, 3, `"run":3`},
			},
		},
		{
			name: "the key is scoped to the route",
			steps: []step{
				{"orders", req{}, 201, "", false, 1, ""},
				{"cart 1", req{path: "/carts/1"}, 201, "", false, 2, ""},
				{"cart 2 is the same route with another path", req{path: "/carts/2"}, 422, "idempotency_key_reused", false, 2, ""},
				{"cart 1 again", req{path: "/carts/1"}, 201, "", true, 2, ""},
			},
		},
		{
			name: "a 5xx releases the record so the retry runs",
			handle: func(w http.ResponseWriter, r *http.Request, run int32) {
				status(map[bool]int{true: 503, false: 200}[run == 1])(w, r, run)
			},
			steps: []step{
				{"first fails", req{}, 503, "", false, 1, "run 1"},
				{"retry runs", req{}, 200, "", false, 2, "run 2"},
				{"then it is stored", req{}, 200, "", true, 2, "run 2"},
			},
		},
		{
			name:   "a 4xx is stored",
			handle: status(http.StatusBadRequest),
			steps: []step{
				{"first", req{}, 400, "", false, 1, "run 1"},
				{"duplicate", req{}, 400, "", true, 1, "run 1"},
			},
		},
		{
			name: "the release policy is configurable",
			opts: []guard.Option{guard.WithReleaseStatus(func(s int) bool { return s == http.StatusConflict })},
			handle: func(w http.ResponseWriter, r *http.Request, run int32) {
				status(map[int32]int{1: 409, 2: 500}[run])(w, r, run)
			},
			steps: []step{
				{"a 409 releases", req{}, 409, "", false, 1, "run 1"},
				{"a 500 is stored", req{}, 500, "", false, 2, "run 2"},
				{"and replayed", req{}, 500, "", true, 2, "run 2"},
			},
		},
		{
			name:   "a response over the cap completes without its body",
			keeper: []idempotency.Option{idempotency.WithMaxBody(64)},
			handle: func(w http.ResponseWriter, _ *http.Request, run int32) {
				_, _ = io.WriteString(w, strings.Repeat("x", 40))
				_, _ = io.WriteString(w, strings.Repeat("y", 40))
			},
			steps: []step{
				{"first gets it all", req{}, 200, "", false, 1, strings.Repeat("x", 40) + strings.Repeat("y", 40)},
				{"duplicate", req{}, 409, "response_not_stored", false, 1, ""},
			},
		},
		{
			name: "invalid keys are refused before the application runs",
			steps: []step{
				{"empty", req{keys: []string{""}}, 400, "invalid_idempotency_key", false, 0, ""},
				{"empty sf-string", req{keys: []string{`""`}}, 400, "invalid_idempotency_key", false, 0, ""},
				{"256 characters", req{keys: []string{`"` + strings.Repeat("k", 256) + `"`}}, 400, "invalid_idempotency_key", false, 0, "256 characters"},
				{"not an sf-string", req{keys: []string{`"unterminated`}}, 400, "invalid_idempotency_key", false, 0, ""},
				{"a space in a bare value", req{keys: []string{`a b`}}, 400, "invalid_idempotency_key", false, 0, ""},
				{"two headers", req{keys: []string{`"a"`, `"b"`}}, 400, "invalid_idempotency_key", false, 0, ""},
				{"255 characters pass", req{keys: []string{`"` + strings.Repeat("k", 255) + `"`}}, 201, "", false, 1, ""},
			},
		},
		{
			name: "a missing key is refused by default",
			steps: []step{
				{"no key", req{noKey: true}, 400, "idempotency_key_missing", false, 0, "Idempotency-Key"},
				{"GET is not guarded", req{method: "GET", noKey: true}, 201, "", false, 1, ""},
			},
		},
		{
			name: "an optional key lets keyless requests through",
			opts: []guard.Option{guard.WithKeyRequired(false)},
			steps: []step{
				{"no key", req{noKey: true}, 201, "", false, 1, ""},
				{"no key again runs again", req{noKey: true}, 201, "", false, 2, ""},
				{"a key still counts", req{}, 201, "", false, 3, ""},
				{"its duplicate", req{}, 201, "", true, 3, ""},
			},
		},
		{
			name: "other methods pass through when configured",
			opts: []guard.Option{guard.WithMethods("get")},
			steps: []step{
				{"POST is no longer guarded", req{noKey: true}, 201, "", false, 1, ""},
				{"GET is", req{method: "GET"}, 201, "", false, 2, ""},
				{"GET duplicate", req{method: "GET"}, 201, "", true, 2, ""},
			},
		},
		{
			name: "a request body over the limit is refused",
			opts: []guard.Option{guard.WithMaxBody(10)},
			steps: []step{
				{"too large", req{}, 413, "payload_too_large", false, 0, ""},
				{"small enough", req{body: `{"a":1}`}, 201, "", false, 1, ""},
			},
		},
	}
	for _, sc := range recordStores {
		for _, sh := range idemShapes {
			for _, tc := range tests {
				t.Run(sc.name+"/"+sh.name+"/"+tc.name, func(t *testing.T) {
					k := idempotency.New(sc.open(t), tc.keeper...)
					app := &orders{handle: tc.handle}
					h := sh.mount(guard.Idempotent(k, append([]guard.Option{quiet}, tc.opts...)...), app)
					for _, s := range tc.steps {
						w := serve(h, s.req.build())
						replayed := w.Header().Get(idempotency.ReplayedHeader) == "true"
						if w.Code != s.wantStatus || codeOf(w) != s.wantCode || replayed != s.wantReplayed ||
							app.runs.Load() != s.wantRuns || !strings.Contains(w.Body.String(), s.wantBody) {
							t.Fatalf("%s: got %d %q replayed=%v runs=%d body %q; want %d %q replayed=%v runs=%d body containing %q",
								s.name, w.Code, codeOf(w), replayed, app.runs.Load(), w.Body, s.wantStatus, s.wantCode, s.wantReplayed, s.wantRuns, s.wantBody)
						}
					}
				})
			}
		}
	}
}

func TestIdempotentFiftyConcurrentRequestsRunOnce(t *testing.T) {
	const n = 50
	for _, sc := range recordStores {
		for _, sh := range idemShapes {
			t.Run(sc.name+"/"+sh.name, func(t *testing.T) {
				k := idempotency.New(sc.open(t))
				hold := make(chan struct{})
				app := &orders{handle: func(w http.ResponseWriter, r *http.Request, run int32) {
					<-hold // until every duplicate has answered
					created(w, r, run)
				}}
				h := sh.mount(guard.Idempotent(k, quiet), app)
				got := sendHeld(n, hold, func(int) *httptest.ResponseRecorder { return serve(h, req{}.build()) })
				wantOneRun(t, got, 201, app.runs.Load())
				if w := serve(h, req{}.build()); w.Code != 201 || w.Header().Get(idempotency.ReplayedHeader) != "true" {
					t.Fatalf("after completion: %d %v", w.Code, w.Header())
				}
			})
		}
	}
}

func TestIdempotentReplayIsByteIdentical(t *testing.T) {
	k := idempotency.New(newRecordStore(t, nil))
	var requestIDs atomic.Int32
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json; charset=utf-8")
		h.Set("Location", "/orders/7")
		h["X-Multi"] = []string{"a", "b"}
		h.Set("Cache-Control", "no-store")
		h.Set("Set-Cookie", "session=first-callers-only")
		h.Set("Date", "Mon, 01 Jan 2001 00:00:00 GMT")
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "per-connection")
		h.Del("X-Outer-Removed")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "{\"id\":7}\n")
	})
	outer := func(next http.Handler) http.Handler { // middleware outside the guard
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Request-Id", fmt.Sprint(requestIDs.Add(1)))
			w.Header().Set("X-Outer-Removed", "yes")
			next.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(outer(guard.Idempotent(k)(app)))
	defer srv.Close()
	do := func() (*http.Response, []byte) {
		r, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(defaultBody))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set(idempotency.KeyHeader, `"byte-identical"`)
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, body
	}
	first, firstBody := do()
	second, secondBody := do()

	if second.Header.Get(idempotency.ReplayedHeader) != "true" || first.Header.Get(idempotency.ReplayedHeader) != "" {
		t.Fatalf("Idempotent-Replayed: first %q, second %q", first.Header.Get(idempotency.ReplayedHeader), second.Header.Get(idempotency.ReplayedHeader))
	}
	if first.StatusCode != second.StatusCode || !bytes.Equal(firstBody, secondBody) {
		t.Fatalf("first %d %q, replay %d %q", first.StatusCode, firstBody, second.StatusCode, secondBody)
	}
	if first.Header.Get("Set-Cookie") == "" || second.Header.Get("Set-Cookie") != "" {
		t.Fatalf("Set-Cookie: first %q, replay %q; want it on the first only", first.Header.Get("Set-Cookie"), second.Header.Get("Set-Cookie"))
	}
	if second.Header.Get("Date") == "Mon, 01 Jan 2001 00:00:00 GMT" || second.Header.Get("X-Hop") != "" {
		t.Fatalf("replayed Date %q or hop-by-hop X-Hop %q", second.Header.Get("Date"), second.Header.Get("X-Hop"))
	}
	if first.Header.Get("X-Request-Id") == second.Header.Get("X-Request-Id") {
		t.Fatalf("the outer middleware's X-Request-Id was replayed: %q", second.Header.Get("X-Request-Id"))
	}
	if first.Header.Get("X-Outer-Removed") != "" {
		t.Fatalf("a header the handler deleted was sent: %q", first.Header.Get("X-Outer-Removed"))
	}
	strip := func(h http.Header) http.Header {
		h = h.Clone()
		// Deletions are not recorded: the duplicate keeps the header its
		// own outer middleware set.
		for _, name := range []string{"Date", "Set-Cookie", "X-Request-Id", "X-Outer-Removed", "Connection", "X-Hop", idempotency.ReplayedHeader} {
			h.Del(name)
		}
		return h
	}
	if a, b := strip(first.Header), strip(second.Header); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("headers differ:\nfirst  %v\nreplay %v", a, b)
	}
	if first.ContentLength != int64(len(firstBody)) || first.Header.Get("Location") != "/orders/7" || len(first.Header["X-Multi"]) != 2 {
		t.Fatalf("first response lost something: %v", first.Header)
	}
}

// hookWriter runs onHeader when the status is written: the moment the
// client could first see the answer.
type hookWriter struct {
	http.ResponseWriter
	onHeader func()
}

func (h *hookWriter) WriteHeader(code int) {
	h.onHeader()
	h.ResponseWriter.WriteHeader(code)
}

func (h *hookWriter) Write(p []byte) (int, error) { return h.ResponseWriter.Write(p) }

func TestIdempotentRecordIsFinishedBeforeTheAnswer(t *testing.T) {
	tests := []struct {
		name     string
		handle   func(http.ResponseWriter, *http.Request, int32)
		wantDup  int
		wantCode string
	}{
		{"a stored response", created, 201, ""},
		{"a released 5xx", func(w http.ResponseWriter, _ *http.Request, _ int32) { w.WriteHeader(502) }, 201, ""},
		{"a response streamed past the cap", func(w http.ResponseWriter, _ *http.Request, _ int32) {
			_, _ = w.Write(bytes.Repeat([]byte("z"), 100))
		}, 409, "response_not_stored"},
		{"a flushed response", func(w http.ResponseWriter, _ *http.Request, _ int32) {
			_, _ = io.WriteString(w, "event: one\n\n")
			w.(http.Flusher).Flush()
		}, 409, "response_not_stored"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k := idempotency.New(newRecordStore(t, nil), idempotency.WithMaxBody(50))
			app := &orders{handle: func(w http.ResponseWriter, r *http.Request, run int32) {
				if run == 1 {
					tc.handle(w, r, run)
					return
				}
				created(w, r, run)
			}}
			h := guard.Idempotent(k, quiet)(app)
			var dup *httptest.ResponseRecorder
			w := &hookWriter{ResponseWriter: httptest.NewRecorder(), onHeader: func() {
				if dup == nil {
					dup = serve(h, req{}.build()) // a retry the moment the answer starts
				}
			}}
			h.ServeHTTP(w, req{}.build())
			if dup == nil || dup.Code != tc.wantDup || codeOf(dup) != tc.wantCode {
				t.Fatalf("retry during the answer: %v, want %d %q (never request_in_progress)", answer(dup), tc.wantDup, tc.wantCode)
			}
		})
	}
}

func TestIdempotentPanicReleases(t *testing.T) {
	for _, sh := range idemShapes {
		t.Run(sh.name, func(t *testing.T) {
			ignore := goleak.IgnoreCurrent()
			t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the store's Close
			k := idempotency.New(newRecordStore(t, nil))
			app := &orders{handle: func(w http.ResponseWriter, r *http.Request, run int32) {
				if run == 1 {
					w.Header().Set("X-Half", "written")
					panic("the order service blew up")
				}
				created(w, r, run)
			}}
			h := sh.mount(guard.Idempotent(k, quiet), app)
			steps := []step{
				{"the panic is answered with 500", req{}, 500, "internal_error", false, 1, ""},
				{"the retry runs", req{}, 201, "", false, 2, `"run":2`},
				{"and is stored", req{}, 201, "", true, 2, `"run":2`},
			}
			for _, s := range steps {
				w := serve(h, s.req.build())
				replayed := w.Header().Get(idempotency.ReplayedHeader) == "true"
				if w.Code != s.wantStatus || codeOf(w) != s.wantCode || replayed != s.wantReplayed || app.runs.Load() != s.wantRuns || !strings.Contains(w.Body.String(), s.wantBody) {
					t.Fatalf("%s: got %d %q replayed=%v runs=%d %q", s.name, w.Code, codeOf(w), replayed, app.runs.Load(), w.Body)
				}
				if s.wantStatus == 500 && w.Header().Get("X-Half") != "" {
					t.Fatalf("the panicking handler's headers reached the client: %v", w.Header())
				}
			}
		})
	}
}

func TestIdempotentPanicWhileStreamingAborts(t *testing.T) {
	k := idempotency.New(newRecordStore(t, nil), idempotency.WithMaxBody(4))
	app := &orders{handle: func(w http.ResponseWriter, _ *http.Request, _ int32) {
		_, _ = io.WriteString(w, "more than four bytes")
		panic("late failure")
	}}
	h := guard.Idempotent(k, quiet)(app)
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		serve(h, req{}.build())
	}()
	if recovered != http.ErrAbortHandler {
		t.Fatalf("recovered %v, want http.ErrAbortHandler", recovered)
	}
}

func TestIdempotentLeaseExpiryLetsOneRetryRun(t *testing.T) {
	clk := newFakeClock()
	k := idempotency.New(newRecordStore(t, clk), idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
	entered, hold := make(chan struct{}), make(chan struct{})
	app := &orders{handle: func(w http.ResponseWriter, r *http.Request, run int32) {
		if run == 1 {
			close(entered)
			<-hold // a stuck request whose heartbeat cannot help it (the clock is fake)
		}
		created(w, r, run)
	}}
	h := guard.Idempotent(k, quiet)(app)
	stuck := make(chan *httptest.ResponseRecorder)
	go func() { stuck <- serve(h, req{}.build()) }()
	<-entered

	if w := serve(h, req{}.build()); w.Code != 409 || codeOf(w) != "request_in_progress" {
		t.Fatalf("inside the lease: %d %q", w.Code, codeOf(w))
	}
	clk.Advance(time.Minute)
	if w := serve(h, req{}.build()); w.Code != 409 || codeOf(w) != "request_in_progress" {
		t.Fatalf("inside the grace after the lease: %d %q", w.Code, codeOf(w))
	}
	clk.Advance(time.Minute) // the grace is one lease by default
	const n = 10
	results := make(chan *httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { results <- serve(h, req{}.build()) })
	}
	wg.Wait()
	close(results)
	fresh := 0
	for w := range results {
		switch {
		case w.Code == 201 && w.Header().Get(idempotency.ReplayedHeader) == "":
			fresh++
		case w.Code == 201 || codeOf(w) == "request_in_progress":
		default:
			t.Errorf("unexpected answer %d %s", w.Code, w.Body)
		}
	}
	if fresh != 1 || app.runs.Load() != 2 {
		t.Fatalf("after the lease: %d fresh answers, %d runs; want 1 and 2", fresh, app.runs.Load())
	}
	close(hold)
	if w := <-stuck; w.Code != 201 || !strings.Contains(w.Body.String(), `"run":1`) {
		t.Fatalf("the stuck request still answers its client: %d %s", w.Code, w.Body)
	}
	if w := serve(h, req{}.build()); !strings.Contains(w.Body.String(), `"run":2`) || w.Header().Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("the retry's response is the stored one: %d %s", w.Code, w.Body)
	}
}

func TestIdempotentAbandonRecord(t *testing.T) {
	for _, shape := range idemShapes {
		t.Run(shape.name, func(t *testing.T) {
			clk := newFakeClock()
			k := idempotency.New(newRecordStore(t, clk), idempotency.WithClock(clk.Now), idempotency.WithLockTTL(time.Minute))
			app := &orders{handle: func(w http.ResponseWriter, r *http.Request, run int32) {
				if run == 1 { // the outcome is unknown: say so, and answer 502
					if !guard.AbandonRecord(w) {
						t.Error("AbandonRecord found no record")
					}
					w.WriteHeader(http.StatusBadGateway)
					return
				}
				created(w, r, run)
			}}
			h := shape.mount(guard.Idempotent(k, quiet), app)
			if w := serve(h, req{}.build()); w.Code != http.StatusBadGateway {
				t.Fatalf("first = %d, want the handler's 502", w.Code)
			}
			if w := serve(h, req{}.build()); w.Code != http.StatusConflict || codeOf(w) != "request_in_progress" {
				t.Fatalf("duplicate inside the lease = %d %q, want 409 request_in_progress: neither stored nor released", w.Code, codeOf(w))
			}
			clk.Advance(time.Minute)
			if w := serve(h, req{}.build()); w.Code != http.StatusConflict || codeOf(w) != "request_in_progress" {
				t.Fatalf("duplicate inside the grace after the lease = %d %q, want 409 request_in_progress", w.Code, codeOf(w))
			}
			clk.Advance(time.Minute) // the grace is one lease by default
			if w := serve(h, req{}.build()); w.Code != http.StatusCreated || w.Header().Get(idempotency.ReplayedHeader) != "" {
				t.Fatalf("retry after the lease and grace = %d, want a fresh 201", w.Code)
			}
			if app.runs.Load() != 2 {
				t.Fatalf("%d runs, want 2", app.runs.Load())
			}
		})
	}
	if guard.AbandonRecord(httptest.NewRecorder()) {
		t.Error("AbandonRecord reported a record for a writer without one")
	}
}

func TestIdempotentStoreFailure(t *testing.T) {
	closed := memory.New()
	_ = closed.Close()
	tests := []struct {
		name       string
		st         store.Store
		opts       []guard.Option
		wantStatus int
		wantCode   string
		wantRuns   int32
	}{
		{"an unreachable store answers 503 and runs nothing", failingStore{newRecordStore(t, nil), errors.New("dial tcp 10.0.0.7:6379: connection refused")}, nil, 503, "store_unavailable", 0},
		{"a closed store answers 503 and runs nothing", closed, nil, 503, "store_unavailable", 0},
		{"a full store answers 503 store_full", failingStore{newRecordStore(t, nil), store.ErrFull}, nil, 503, "store_full", 0},
		{"UnsafeFailOpen runs the handler without a record", failingStore{newRecordStore(t, nil), errors.New("timeout")}, []guard.Option{guard.UnsafeFailOpen(true)}, 201, "", 1},
	}
	for _, sh := range idemShapes {
		for _, tc := range tests {
			t.Run(sh.name+"/"+tc.name, func(t *testing.T) {
				app := &orders{}
				h := sh.mount(guard.Idempotent(idempotency.New(tc.st), append([]guard.Option{quiet}, tc.opts...)...), app)
				w := serve(h, req{}.build())
				if w.Code != tc.wantStatus || codeOf(w) != tc.wantCode || app.runs.Load() != tc.wantRuns {
					t.Fatalf("got %d %q runs=%d, want %d %q %d", w.Code, codeOf(w), app.runs.Load(), tc.wantStatus, tc.wantCode, tc.wantRuns)
				}
				if tc.wantStatus == 503 && (w.Header().Get("Retry-After") == "" || strings.Contains(w.Body.String(), "10.0.0.7")) {
					t.Fatalf("503 without Retry-After or leaking the address: %v %s", w.Header(), w.Body)
				}
			})
		}
	}
}

func TestIdempotentFingerprintMode(t *testing.T) {
	clk := newFakeClock()
	k := idempotency.New(newRecordStore(t, clk), idempotency.WithClock(clk.Now))
	app := &orders{}
	for _, sh := range idemShapes {
		t.Run(sh.name, func(t *testing.T) {
			app.runs.Store(0)
			h := sh.mount(guard.Idempotent(k, quiet, guard.WithFingerprintWindow(0)), app)
			body := fmt.Sprintf(`{"shape":%q}`, sh.name) // the two shapes share the store
			steps := []struct {
				step
				advance time.Duration
			}{
				{step{"first submit", req{noKey: true, body: body}, 201, "", false, 1, `"run":1`}, 0},
				{step{"double submit inside the window", req{noKey: true, body: body}, 201, "", true, 1, `"run":1`}, 1999 * time.Millisecond},
				{step{"another body is another request", req{noKey: true, body: `{"other":1}` + body}, 201, "", false, 2, `"run":2`}, 0},
				{step{"another caller is another request", req{noKey: true, body: body, remote: "198.51.100.7:1"}, 201, "", false, 3, `"run":3`}, 0},
				{step{"after the window it runs again", req{noKey: true, body: body}, 201, "", false, 4, `"run":4`}, time.Millisecond},
				{step{"a keyed request uses its key", req{body: body}, 201, "", false, 5, `"run":5`}, 0},
				{step{"whose record outlives the window", req{body: body}, 201, "", true, 5, `"run":5`}, time.Hour},
				// Each would be read as {"a":"\uFFFD"} by the canonical form.
				{step{"a lone surrogate is refused", req{noKey: true, body: `{"a":"\ud800"}`}, 400, "invalid_request", false, 5, ""}, 0},
				{step{"and so is another", req{noKey: true, body: `{"a":"\udbff"}`}, 400, "invalid_request", false, 5, ""}, 0},
				{step{"a raw 0xff is refused", req{noKey: true, body: "{\"a\":\"\xff\"}"}, 400, "invalid_request", false, 5, ""}, 0},
				{step{"and so is a raw 0xfe", req{noKey: true, body: "{\"a\":\"\xfe\"}"}, 400, "invalid_request", false, 5, ""}, 0},
				// Each would have the canonical form of the other.
				{step{"a member in two cases is refused", req{noKey: true, body: `{"item":"book","qty":1,"QTY":5}`}, 400, "invalid_request", false, 5, "the member"}, 0},
				{step{"and so is its other order", req{noKey: true, body: `{"QTY":5,"item":"book","qty":1}`}, 400, "invalid_request", false, 5, "the member"}, 0},
				{step{"and one in a nested object", req{noKey: true, body: `{"lines":[{"Sku":"a","sKU":"b"}]}`}, 400, "invalid_request", false, 5, "the member"}, 0},
			}
			for _, s := range steps {
				clk.Advance(s.advance)
				w := serve(h, s.req.build())
				replayed := w.Header().Get(idempotency.ReplayedHeader) == "true"
				if w.Code != s.wantStatus || replayed != s.wantReplayed || app.runs.Load() != s.wantRuns || !strings.Contains(w.Body.String(), s.wantBody) {
					t.Fatalf("%s: got %d replayed=%v runs=%d %q", s.name, w.Code, replayed, app.runs.Load(), w.Body)
				}
			}
		})
	}
}

func TestIdempotentGinWriter(t *testing.T) {
	k := idempotency.New(newRecordStore(t, nil))
	var seenStatus []int
	var runs atomic.Int32
	r := gin.New()
	r.Use(func(c *gin.Context) { // an outer middleware reading the status, like a request log
		c.Next()
		seenStatus = append(seenStatus, c.Writer.Status())
	})
	r.POST("/orders", guard.Gin(guard.Idempotent(k, quiet)), func(c *gin.Context) {
		n := runs.Add(1)
		if c.Writer.Written() || c.Writer.Size() != -1 {
			c.String(500, "fresh writer reports written")
			return
		}
		c.Status(http.StatusAccepted) // overridden below, as gin allows
		c.Header("Location", "/orders/7")
		c.SetCookie("session", "s", 60, "/", "", false, true)
		c.JSON(http.StatusCreated, gin.H{"run": n})
		if !c.Writer.Written() || c.Writer.Status() != http.StatusCreated || c.Writer.Size() <= 0 {
			panic("gin writer state is wrong")
		}
	})
	first := serve(r, req{}.build())
	second := serve(r, req{}.build())
	if first.Code != 201 || second.Code != 201 || first.Body.String() != second.Body.String() || runs.Load() != 1 {
		t.Fatalf("first %d %s, second %d %s, runs %d", first.Code, first.Body, second.Code, second.Body, runs.Load())
	}
	if second.Header().Get(idempotency.ReplayedHeader) != "true" || second.Header().Get("Location") != "/orders/7" ||
		second.Header().Get("Content-Type") != first.Header().Get("Content-Type") || second.Header().Get("Set-Cookie") != "" || first.Header().Get("Set-Cookie") == "" {
		t.Fatalf("replayed headers %v (first %v)", second.Header(), first.Header())
	}
	if !slices.Equal(seenStatus, []int{201, 201}) {
		t.Fatalf("the outer middleware saw %v", seenStatus)
	}
}

func TestIdempotentErrorHandler(t *testing.T) {
	k := idempotency.New(newRecordStore(t, nil))
	onError := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := guard.FailureReason(r)
		w.WriteHeader(problem.For(err).Status)
		_, _ = fmt.Fprintf(w, "<p>refused: %v</p>", errors.Is(err, idempotency.ErrKeyMissing))
	})
	h := guard.Idempotent(k, guard.WithErrorHandler(onError))(&orders{})
	if w := serve(h, req{noKey: true}.build()); w.Code != 400 || w.Body.String() != "<p>refused: true</p>" {
		t.Fatalf("got %d %q", w.Code, w.Body)
	}
}

func TestParseScope(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Authorization", "Bearer alice")
	tests := []struct {
		spec      string
		wantNil   bool
		wantErr   bool
		wantScope bool
	}{
		{"credentials", true, false, false},
		{"client_ip", true, false, false}, // the old default reads as the new one
		{"", true, false, false},
		{"header:Authorization", false, false, true},
		{" header:X-Tenant ", false, false, true}, // Authorization is there
		{"header:", false, true, false},
		{"header:Bad Name", false, true, false},
		{"cookie:session", false, true, false},
	}
	for _, tc := range tests {
		f, err := guard.ParseScope(tc.spec)
		if (err != nil) != tc.wantErr || (f == nil) != (tc.wantNil || tc.wantErr) {
			t.Errorf("ParseScope(%q) = %v, %v", tc.spec, f != nil, err)
			continue
		}
		if f != nil {
			s := f(r)
			if (s != "") != tc.wantScope || strings.Contains(s, "alice") {
				t.Errorf("ParseScope(%q)(r) = %q", tc.spec, s)
			}
		}
	}
}

// BenchmarkIdempotent compares the bare handler with the first run of a
// key (buffer, record, complete) and the replay of a stored response, on
// the memory store and on Redis (skipped without
// REPLAYGUARD_TEST_REDIS_URL; records expire after a minute, so that runs
// leave nothing behind for long).
func BenchmarkIdempotent(b *testing.B) {
	body := []byte(defaultBody)
	resp := bytes.Repeat([]byte("r"), 512)
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(resp)
	})
	newReq := func(key string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/orders", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		if key != "" {
			r.Header.Set(idempotency.KeyHeader, key)
		}
		return r
	}

	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			app.ServeHTTP(httptest.NewRecorder(), newReq(""))
		}
	})
	for _, sc := range recordStores[:2] {
		b.Run(sc.name, func(b *testing.B) {
			k := idempotency.New(sc.open(b), idempotency.WithRetention(time.Minute))
			guarded := guard.Idempotent(k)(app)
			b.Run("first-execution", func(b *testing.B) {
				i := 0
				for b.Loop() {
					i++
					w := httptest.NewRecorder()
					guarded.ServeHTTP(w, newReq(fmt.Sprintf(`"first-%d"`, i)))
					if w.Code != http.StatusCreated {
						b.Fatal(w.Code)
					}
				}
			})
			b.Run("replay", func(b *testing.B) {
				guarded.ServeHTTP(httptest.NewRecorder(), newReq(`"replayed"`))
				for b.Loop() {
					w := httptest.NewRecorder()
					guarded.ServeHTTP(w, newReq(`"replayed"`))
					if w.Header().Get(idempotency.ReplayedHeader) != "true" {
						b.Fatal("not replayed")
					}
				}
			})
		})
	}
}

// TestCallerQuota: one caller cannot open more records than its quota,
// so it cannot take a bounded store's room from everyone else; its
// duplicates are still answered, and other callers are not affected.
func TestCallerQuota(t *testing.T) {
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	var runs atomic.Int32
	h := guard.Idempotent(idempotency.New(st), quiet, guard.WithCallerQuota(st, 2))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	alice := http.Header{"Authorization": {"Bearer alice"}}
	steps := []struct {
		name       string
		q          req
		wantStatus int
		wantCode   string
		wantRuns   int32
	}{
		{"alice's first key", req{keys: []string{`"a1"`}, header: alice}, 201, "", 1},
		{"alice's second key", req{keys: []string{`"a2"`}, header: alice}, 201, "", 2},
		{"alice's third key is past her quota", req{keys: []string{`"a3"`}, header: alice}, 429, "rate_limited", 2},
		{"her first key's duplicate is still answered", req{keys: []string{`"a1"`}, header: alice}, 201, "", 2},
		{"bob is not affected", req{keys: []string{`"a3"`}, header: http.Header{"Authorization": {"Bearer bob"}}}, 201, "", 3},
		{"alice's refused key did not stay behind", req{keys: []string{`"a3"`}, header: alice}, 429, "rate_limited", 3},
	}
	for _, s := range steps {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, s.q.build())
		if w.Code != s.wantStatus || (s.wantCode != "" && problemCode(t, w) != s.wantCode) || runs.Load() != s.wantRuns {
			t.Fatalf("%s: %d %s, %d runs; want %d %q, %d runs", s.name, w.Code, w.Body, runs.Load(), s.wantStatus, s.wantCode, s.wantRuns)
		}
		if w.Code == 429 && w.Header().Get("Retry-After") == "" {
			t.Fatalf("%s: no Retry-After", s.name)
		}
	}
}

// TestAddressQuota: the per-caller quota counts per scope, made of
// credentials nothing checks, so one client inventing a new Authorization
// for each keyed request (the app answering 401, which is stored) once
// filled the memory store's records and made every caller's keyed request
// 503 store_full. The address quota bounds every caller at one client IP
// (an IPv6 client's /64) together.
func TestAddressQuota(t *testing.T) {
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	var runs atomic.Int32
	h := guard.Idempotent(idempotency.New(st), quiet, guard.WithCallerQuota(st, 2), guard.WithAddressQuota(st, 3))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	bearer := func(who string) http.Header { return http.Header{"Authorization": {"Bearer " + who}} }
	const mallory, office = "192.0.2.66:1234", "198.51.100.1:1234"
	steps := []struct {
		name       string
		q          req
		wantStatus int
		wantCode   string
		wantRuns   int32
		wantDetail string // in a 429's detail: whose quota it is
	}{
		{"an invented credential", req{keys: []string{`"m1"`}, header: bearer("fake1"), remote: mallory}, 401, "", 1, ""},
		{"another", req{keys: []string{`"m2"`}, header: bearer("fake2"), remote: mallory}, 401, "", 2, ""},
		{"a third, from another port", req{keys: []string{`"m3"`}, header: bearer("fake3"), remote: "192.0.2.66:999"}, 401, "", 3, ""},
		{"a fourth is past the address's quota", req{keys: []string{`"m4"`}, header: bearer("fake4"), remote: mallory}, 429, "rate_limited", 3, "this address"},
		{"and so is a request without credentials", req{keys: []string{`"m5"`}, remote: mallory}, 429, "rate_limited", 3, "this address"},
		{"a stored answer is still replayed", req{keys: []string{`"m1"`}, header: bearer("fake1"), remote: mallory}, 401, "", 3, ""},
		{"alice at another address is not affected", req{keys: []string{`"a1"`}, header: bearer("alice"), remote: office}, 401, "", 4, ""},
		{"alice again", req{keys: []string{`"a2"`}, header: bearer("alice"), remote: office}, 401, "", 5, ""},
		{"alice past her own quota", req{keys: []string{`"a3"`}, header: bearer("alice"), remote: office}, 429, "rate_limited", 5, "this caller"},
		{"which left her address's quota to bob", req{keys: []string{`"b1"`}, header: bearer("bob"), remote: office}, 401, "", 6, ""},
		{"an IPv6 client", req{keys: []string{`"v1"`}, header: bearer("v1"), remote: "[2001:db8:1:2::1]:1"}, 401, "", 7, ""},
		{"its /64 is one address", req{keys: []string{`"v2"`}, header: bearer("v2"), remote: "[2001:db8:1:2::2]:1"}, 401, "", 8, ""},
		{"however the host numbers itself", req{keys: []string{`"v3"`}, header: bearer("v3"), remote: "[2001:db8:1:2:ffff::3]:1"}, 401, "", 9, ""},
		{"the /64's fourth", req{keys: []string{`"v4"`}, header: bearer("v4"), remote: "[2001:db8:1:2::4]:1"}, 429, "rate_limited", 9, "this address"},
		{"another /64 is another address", req{keys: []string{`"v5"`}, header: bearer("v5"), remote: "[2001:db8:1:3::1]:1"}, 401, "", 10, ""},
	}
	for _, s := range steps {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, s.q.build())
		if w.Code != s.wantStatus || (s.wantCode != "" && problemCode(t, w) != s.wantCode) || runs.Load() != s.wantRuns {
			t.Fatalf("%s: %d %s, %d runs; want %d %q, %d runs", s.name, w.Code, w.Body, runs.Load(), s.wantStatus, s.wantCode, s.wantRuns)
		}
		if w.Code == 429 && (w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), s.wantDetail)) {
			t.Fatalf("%s: %s, Retry-After %q; want %q in the detail and a Retry-After", s.name, w.Body, w.Header().Get("Retry-After"), s.wantDetail)
		}
	}
}

// TestFingerprintRecordsCountInTheQuotas: keyless requests on a
// fingerprint route open records too (300 distinct bodies from one
// address once got 300 answers past an address quota of 125, and enough
// of them filled the memory store's records). They count against the
// caller's and the address's quotas as keyed ones do, in the same
// buckets; a double submit inside the window is still replayed.
func TestFingerprintRecordsCountInTheQuotas(t *testing.T) {
	st := newRecordStore(t, newFakeClock())
	var runs atomic.Int32
	h := guard.Idempotent(idempotency.New(st), quiet, guard.WithFingerprintWindow(time.Hour),
		guard.WithCallerQuota(st, 2), guard.WithAddressQuota(st, 3))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	bearer := func(who string) http.Header { return http.Header{"Authorization": {"Bearer " + who}} }
	const office, home = "198.51.100.1:1234", "203.0.113.9:1234"
	steps := []struct {
		name         string
		q            req
		wantStatus   int
		wantRuns     int32
		wantReplayed bool
		wantDetail   string // in a 429's detail: whose quota it is
	}{
		{"alice's first comment", req{noKey: true, body: `{"c":1}`, header: bearer("alice"), remote: office}, 201, 1, false, ""},
		{"its double submit is replayed, and does not count", req{noKey: true, body: `{"c":1}`, header: bearer("alice"), remote: office}, 201, 1, true, ""},
		{"alice's second comment", req{noKey: true, body: `{"c":2}`, header: bearer("alice"), remote: office}, 201, 2, false, ""},
		{"alice's third is past her quota", req{noKey: true, body: `{"c":3}`, header: bearer("alice"), remote: office}, 429, 2, false, "this caller"},
		{"bob at her address", req{noKey: true, body: `{"c":3}`, header: bearer("bob"), remote: office}, 201, 3, false, ""},
		{"carol at that address is past its quota", req{noKey: true, body: `{"c":4}`, header: bearer("carol"), remote: office}, 429, 3, false, "this address"},
		{"and so is a keyed request from it: one bucket", req{keys: []string{`"k1"`}, header: bearer("dave"), remote: office}, 429, 3, false, "this address"},
		{"alice's double submit is still replayed", req{noKey: true, body: `{"c":1}`, header: bearer("alice"), remote: office}, 201, 3, true, ""},
		{"another address is not affected", req{noKey: true, body: `{"c":4}`, header: bearer("carol"), remote: home}, 201, 4, false, ""},
	}
	for _, s := range steps {
		w := serve(h, s.q.build())
		replayed := w.Header().Get(idempotency.ReplayedHeader) == "true"
		if w.Code != s.wantStatus || runs.Load() != s.wantRuns || replayed != s.wantReplayed {
			t.Fatalf("%s: %d %s, %d runs, replayed %v; want %d, %d runs, replayed %v", s.name, w.Code, w.Body, runs.Load(), replayed, s.wantStatus, s.wantRuns, s.wantReplayed)
		}
		if w.Code == 429 && (problemCode(t, w) != "rate_limited" || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), s.wantDetail)) {
			t.Fatalf("%s: %s, Retry-After %q; want rate_limited with %q in the detail and a Retry-After", s.name, w.Body, w.Header().Get("Retry-After"), s.wantDetail)
		}
	}
}

// TestAddressBytes: the address quota counts records, and a bounded
// store's room is bytes too, so large answers filled the memory store's
// records long before any count did. WithAddressBytes counts each
// record's bytes against its address when it completes: a response that
// does not fit is sent but not stored, and the address then gets 429
// until its bytes refill, on keyed and fingerprint requests alike.
func TestAddressBytes(t *testing.T) {
	clk := newFakeClock()
	st := newRecordStore(t, clk)
	var runs atomic.Int32
	k := idempotency.New(st, idempotency.WithClock(clk.Now))
	// About 1,450 bytes a record (1,000 of body, headers, 400 for the
	// record): two fit in 3,000.
	h := guard.Idempotent(k, quiet, guard.WithFingerprintWindow(time.Hour), guard.WithAddressBytes(st, 3000))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, "run %d %s", n, strings.Repeat("x", 1000))
	}))
	bearer := func(who string) http.Header { return http.Header{"Authorization": {"Bearer " + who}} }
	const mallory, office = "192.0.2.66:1234", "198.51.100.1:1234"
	steps := []struct {
		name         string
		advance      time.Duration
		q            req
		wantStatus   int
		wantCode     string
		wantRuns     int32
		wantReplayed bool
	}{
		{"a first answer is stored", 0, req{keys: []string{`"m1"`}, header: bearer("fake1"), remote: mallory}, 201, "", 1, false},
		{"a second, by another caller", 0, req{keys: []string{`"m2"`}, header: bearer("fake2"), remote: mallory}, 201, "", 2, false},
		{"a third is answered", 0, req{noKey: true, body: `{"c":3}`, header: bearer("fake3"), remote: mallory}, 201, "", 3, false},
		{"but was not stored: it did not fit", 0, req{noKey: true, body: `{"c":3}`, header: bearer("fake3"), remote: mallory}, 409, "response_not_stored", 3, false},
		{"so the address's next key is refused", 0, req{keys: []string{`"m4"`}, header: bearer("fake4"), remote: mallory}, 429, "rate_limited", 3, false},
		{"and so is a keyless request", 0, req{noKey: true, body: `{"c":5}`, remote: mallory}, 429, "rate_limited", 3, false},
		{"a stored answer is still replayed", 0, req{keys: []string{`"m1"`}, header: bearer("fake1"), remote: mallory}, 201, "", 3, true},
		{"another address is not affected", 0, req{keys: []string{`"a1"`}, header: bearer("alice"), remote: office}, 201, "", 4, false},
		{"and its answer is stored", 0, req{keys: []string{`"a1"`}, header: bearer("alice"), remote: office}, 201, "", 4, true},
		{"the address's bytes refill over the retention", 24 * time.Hour, req{keys: []string{`"m4"`}, header: bearer("fake4"), remote: mallory}, 201, "", 5, false},
		{"and its answer is stored again", 0, req{keys: []string{`"m4"`}, header: bearer("fake4"), remote: mallory}, 201, "", 5, true},
	}
	for _, s := range steps {
		clk.Advance(s.advance)
		w := serve(h, s.q.build())
		replayed := w.Header().Get(idempotency.ReplayedHeader) == "true"
		if w.Code != s.wantStatus || codeOf(w) != s.wantCode || runs.Load() != s.wantRuns || replayed != s.wantReplayed {
			t.Fatalf("%s: %d %q %.80s, %d runs, replayed %v; want %d %q, %d runs, replayed %v", s.name, w.Code, codeOf(w), w.Body, runs.Load(), replayed, s.wantStatus, s.wantCode, s.wantRuns, s.wantReplayed)
		}
		if w.Code == 429 && (w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "response bytes")) {
			t.Fatalf("%s: %s, Retry-After %q; want the bytes in the detail and a Retry-After", s.name, w.Body, w.Header().Get("Retry-After"))
		}
	}
}
