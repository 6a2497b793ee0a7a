package handlers_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
)

// The operators' keys of these tests; backendKey is the API key.
var adminKeys = []string{"ops-key-0", "ops-key-1"}

// adminAnswer is a decoded answer of an operators' endpoint.
type adminAnswer struct {
	status int
	header http.Header
	raw    string
	code   string         // problem code
	body   map[string]any // a 200's JSON
}

// admin calls an operators' endpoint with bearer as the Authorization
// bearer key ("" sends none) and body as JSON (nil sends none).
func (e apiEnv) admin(method, path, bearer string, body any) adminAnswer {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = strings.NewReader(string(data))
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	a := adminAnswer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	switch ct := resp.Header.Get("Content-Type"); {
	case ct == "application/problem+json":
		var p problem.Problem
		if err := json.Unmarshal(raw, &p); err != nil {
			e.t.Fatalf("%s %s: problem %s: %v", method, path, raw, err)
		}
		a.code = p.Code
	case resp.StatusCode == http.StatusOK && ct == "application/json; charset=utf-8":
		if err := json.Unmarshal(raw, &a.body); err != nil {
			e.t.Fatalf("%s %s: answer %s: %v", method, path, raw, err)
		}
	default:
		e.t.Fatalf("%s %s: %d with Content-Type %q: %s", method, path, resp.StatusCode, ct, raw)
	}
	return a
}

// TestAdminEndpoints covers every answer of the operators' endpoints on
// a server with admin keys and token records: records of tokens in each
// state, looked up by ID and by token, released by hand, and refused.
func TestAdminEndpoints(t *testing.T) {
	const ttl = 20 * time.Second // and a grace of as much
	for _, sc := range apiStores {
		t.Run(sc.name, func(t *testing.T) {
			down := new(atomic.Bool)
			var logs testenv.LockedBuffer
			e := newAPIEnv(t, func(t *testing.T) (store.Store, func() time.Time, func(time.Duration)) {
				st, now, advance := sc.open(t)
				return failingRecords{st, down}, now, advance
			}, []idempotency.Option{idempotency.WithLockTTL(ttl), idempotency.WithMaxBody(16)},
				handlers.WithAdminKeys(adminKeys...), handlers.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
			opened := e.now()
			toks := map[string]token.Issued{}
			for _, name := range []string{"processing", "completed", "unstored", "never"} {
				toks[name] = e.issue("checkout", time.Hour)
			}
			for name, resp := range map[string]map[string]any{
				"processing": nil,
				"completed":  {"status": 201, "body": b64("ok")},
				"unstored":   {"status": 200, "body": b64(strings.Repeat("x", 40))},
			} {
				if got := e.post("/v1/tokens/redeem", map[string]any{"token": toks[name].Token, "purpose": "checkout", "record": true}, false); got.jsonStatus != "redeemed" {
					t.Fatalf("redeem %s: %d %s", name, got.status, got.raw)
				}
				if resp != nil {
					if got := e.post("/v1/tokens/complete", map[string]any{"token": toks[name].Token, "response": resp}, false); got.status != 204 {
						t.Fatalf("complete %s: %d %s", name, got.status, got.raw)
					}
				}
			}
			id := func(name string) string { return "token:" + toks[name].ID }
			stamp := func(d time.Duration) string { return opened.Add(d).UTC().Format(time.RFC3339) }
			processing := map[string]any{"id": id("processing"), "state": "processing", "created": stamp(0), "lease_ends": stamp(ttl), "expires": stamp(2 * ttl)}
			completed := map[string]any{"id": id("completed"), "state": "completed", "created": stamp(0), "expires": stamp(idempotency.DefaultRetention), "status": 201.0, "body_stored": true}
			unstored := map[string]any{"id": id("unstored"), "state": "completed", "created": stamp(0), "expires": stamp(idempotency.DefaultRetention), "status": 200.0, "body_stored": false}
			tests := []struct {
				name         string
				method, path string
				bearer       string
				body         any
				down         bool // the store's records fail
				status       int
				code         string
				want         map[string]any
			}{
				{"a processing record by ID", "GET", "/v1/admin/records/" + id("processing"), adminKeys[0], nil, false, 200, "", processing},
				{"a completed record by ID", "GET", "/v1/admin/records/" + id("completed"), adminKeys[1], nil, false, 200, "", completed},
				{"a record stored without its body", "GET", "/v1/admin/records/" + id("unstored"), adminKeys[0], nil, false, 200, "", unstored},
				{"a processing record by token", "POST", "/v1/admin/records/lookup", adminKeys[0], map[string]any{"token": toks["processing"].Token}, false, 200, "", processing},
				{"a completed record by token", "POST", "/v1/admin/records/lookup", adminKeys[0], map[string]any{"token": toks["completed"].Token}, false, 200, "", completed},
				{"no record by ID", "GET", "/v1/admin/records/" + id("never"), adminKeys[0], nil, false, 404, "record_not_found", nil},
				{"no record by token", "POST", "/v1/admin/records/lookup", adminKeys[0], map[string]any{"token": toks["never"].Token}, false, 404, "record_not_found", nil},
				{"no record under a key ID", "GET", "/v1/admin/records/idem:" + strings.Repeat("ab", 32), adminKeys[0], nil, false, 404, "record_not_found", nil},
				{"a malformed ID", "GET", "/v1/admin/records/b64:***", adminKeys[0], nil, false, 400, "invalid_request", nil},
				{"an ID with a space", "GET", "/v1/admin/records/idem:%20x", adminKeys[0], nil, false, 400, "invalid_request", nil},
				{"a malformed ID to release", "POST", "/v1/admin/records/b64:/release", adminKeys[0], nil, false, 400, "invalid_request", nil},
				{"a forged token", "POST", "/v1/admin/records/lookup", adminKeys[0], map[string]any{"token": "a.b.c"}, false, 400, "invalid_request", nil},
				{"a token and a request", "POST", "/v1/admin/records/lookup", adminKeys[0], map[string]any{"token": toks["processing"].Token, "method": "POST"}, false, 400, "invalid_request", nil},
				{"an empty lookup", "POST", "/v1/admin/records/lookup", adminKeys[0], nil, false, 400, "invalid_request", nil},
				{"an unknown field", "POST", "/v1/admin/records/lookup", adminKeys[0], map[string]any{"tokn": "x"}, false, 400, "invalid_request", nil},
				{"a request on a server that is no gateway", "POST", "/v1/admin/records/lookup", adminKeys[0], map[string]any{"method": "POST", "path": "/orders", "key": "k"}, false, 400, "invalid_request", nil},
				{"no credential", "GET", "/v1/admin/records/" + id("processing"), "", nil, false, 401, "unauthorized", nil},
				{"a wrong credential", "POST", "/v1/admin/records/lookup", "ops-key-2", map[string]any{"token": toks["processing"].Token}, false, 401, "unauthorized", nil},
				{"the backends' API key is no admin key", "POST", "/v1/admin/records/" + id("processing") + "/release", backendKey, nil, false, 401, "unauthorized", nil},
				{"a lookup the store cannot answer", "GET", "/v1/admin/records/" + id("processing"), adminKeys[0], nil, true, 503, "store_unavailable", nil},
				{"a release the store cannot confirm", "POST", "/v1/admin/records/" + id("processing") + "/release", adminKeys[0], nil, true, 503, "store_unavailable", nil},
				{"a completed record is never released", "POST", "/v1/admin/records/" + id("completed") + "/release", adminKeys[0], nil, false, 409, "record_not_processing", nil},
				{"no record to release", "POST", "/v1/admin/records/" + id("never") + "/release", adminKeys[0], nil, false, 409, "record_not_processing", nil},
				{"a processing record is released", "POST", "/v1/admin/records/" + id("processing") + "/release", adminKeys[1], nil, false, 200, "", map[string]any{"released": true}},
				{"and is gone", "GET", "/v1/admin/records/" + id("processing"), adminKeys[0], nil, false, 404, "record_not_found", nil},
				{"so a second release finds nothing", "POST", "/v1/admin/records/" + id("processing") + "/release", adminKeys[0], nil, false, 409, "record_not_processing", nil},
			}
			for _, tc := range tests {
				down.Store(tc.down)
				got := e.admin(tc.method, tc.path, tc.bearer, tc.body)
				down.Store(false)
				if got.status != tc.status || got.code != tc.code {
					t.Fatalf("%s: %d %q %s, want %d %q", tc.name, got.status, got.code, got.raw, tc.status, tc.code)
				}
				if tc.want != nil && fmt.Sprint(got.body) != fmt.Sprint(tc.want) {
					t.Fatalf("%s: %v\nwant %v", tc.name, got.body, tc.want)
				}
				if cc := got.header.Get("Cache-Control"); cc != "no-store" {
					t.Fatalf("%s: Cache-Control %q", tc.name, cc)
				}
				if tc.status == 401 && got.header.Get("WWW-Authenticate") == "" {
					t.Fatalf("%s: 401 without WWW-Authenticate", tc.name)
				}
				if strings.Contains(got.raw, "10.0.0.7") {
					t.Fatalf("%s: the store's address reached the answer: %s", tc.name, got.raw)
				}
			}
			// Released by hand, the token is redeemed again: the retry runs.
			if got := e.post("/v1/tokens/redeem", map[string]any{"token": toks["processing"].Token, "purpose": "checkout", "record": true}, false); got.jsonStatus != "redeemed" {
				t.Fatalf("the retry after the release: %d %s, want redeemed", got.status, got.raw)
			}
			// One audit line, with the record and the admin key's index,
			// never a key.
			var audits []map[string]any
			for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("log line %q: %v", line, err)
				}
				if strings.Contains(fmt.Sprint(rec["msg"]), "released by an operator") {
					audits = append(audits, rec)
				}
			}
			if len(audits) != 1 || audits[0]["level"] != "WARN" || audits[0]["record_id"] != id("processing") || audits[0]["admin_key"] != 1.0 || audits[0]["request_id"] == "" {
				t.Fatalf("audit lines = %v, want one WARN line naming %s and admin key 1", audits, id("processing"))
			}
			for _, k := range append(adminKeys, backendKey) {
				if strings.Contains(logs.String(), k) {
					t.Fatalf("a key reached the logs:\n%s", logs.String())
				}
			}
		})
	}
}

// TestAdminEndpointsOff: without admin keys the operators' endpoints do
// not exist (404 not_found, whatever the caller presents), and with keys
// but without records there is nothing to look up.
func TestAdminEndpointsOff(t *testing.T) {
	st := newRecordStore(t)
	svc := newTokenService(t, st)
	k := idempotency.New(st)
	for _, tc := range []struct {
		name   string
		opts   []handlers.Option
		bearer string
		status int
		code   string
	}{
		{"no admin keys", []handlers.Option{handlers.WithRecords(k), handlers.WithAPIKeys(backendKey)}, backendKey, 404, "not_found"},
		{"no admin keys, no credential", []handlers.Option{handlers.WithRecords(k)}, "", 404, "not_found"},
		{"admin keys without records", []handlers.Option{handlers.WithAdminKeys(adminKeys...)}, adminKeys[0], 404, "not_found"},
		{"admin keys without records, no credential", []handlers.Option{handlers.WithAdminKeys(adminKeys...)}, "", 401, "unauthorized"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := handlers.New(svc, append(tc.opts, quietLogs)...).Engine()
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(e)
			defer srv.Close()
			env := apiEnv{t: t, srv: srv, svc: svc}
			for _, c := range []struct{ method, path string }{
				{"GET", "/v1/admin/records/token:1"},
				{"POST", "/v1/admin/records/lookup"},
				{"POST", "/v1/admin/records/token:1/release"},
			} {
				if got := env.admin(c.method, c.path, tc.bearer, nil); got.status != tc.status || got.code != tc.code {
					t.Fatalf("%s %s: %d %q %s, want %d %q", c.method, c.path, got.status, got.code, got.raw, tc.status, tc.code)
				}
			}
		})
	}
}

// TestAdminLookupByRequest: a lookup by request hands WithRecordKeys'
// function the request as its client sent it (method, path and query,
// Host, headers, client IP, Idempotency-Key as sent), and answers from
// the record under the key it returns; what cannot be a request is 400.
func TestAdminLookupByRequest(t *testing.T) {
	var seen *http.Request
	var keyErr error
	keyOf := func(r *http.Request) (string, error) {
		seen = r
		return store.TokenRecordKey("recorded"), keyErr
	}
	st, now, advance := apiStores[0].open(t)
	opened := func(*testing.T) (store.Store, func() time.Time, func(time.Duration)) { return st, now, advance }
	e := newAPIEnv(t, opened, nil, handlers.WithAdminKeys(adminKeys...), handlers.WithRecordKeys(keyOf))
	// The record keyOf names: a token's, opened as Redeem opens it.
	if _, err := st.Put(t.Context(), "recorded", store.Token{Purpose: "p"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, _, err := st.Redeem(t.Context(), "recorded", store.Token{Purpose: "p"}, "owner", time.Minute); err != nil || res != store.Redeemed {
		t.Fatal(res, err)
	}
	lookup := map[string]any{
		"method": "POST", "path": "/orders?x=1", "key": `"order-7"`,
		"headers":   map[string]string{"authorization": "Bearer user-token", "Cookie": "s=1", "Host": "shop.example"},
		"client_ip": "203.0.113.7",
	}
	got := e.admin("POST", "/v1/admin/records/lookup", adminKeys[0], lookup)
	if got.status != 200 || got.body["id"] != "token:recorded" || got.body["state"] != "processing" {
		t.Fatalf("lookup = %d %s", got.status, got.raw)
	}
	switch {
	case seen.Method != "POST" || seen.URL.Path != "/orders" || seen.URL.RawQuery != "x=1" || seen.Host != "shop.example":
		t.Errorf("the request is %s %s (Host %s), want POST /orders?x=1 (Host shop.example)", seen.Method, seen.URL, seen.Host)
	case seen.Header.Get("Authorization") != "Bearer user-token" || seen.Header.Get("Cookie") != "s=1" || seen.Header.Get(idempotency.KeyHeader) != `"order-7"`:
		t.Errorf("the request's headers are %v", seen.Header)
	case request.ClientIP(seen) != "203.0.113.7" || seen.RemoteAddr != "203.0.113.7:0":
		t.Errorf("the request's client IP is %q (RemoteAddr %q)", request.ClientIP(seen), seen.RemoteAddr)
	}
	// Without a Host of its own, the request has the admin request's.
	delete(lookup["headers"].(map[string]string), "Host")
	e.admin("POST", "/v1/admin/records/lookup", adminKeys[0], lookup)
	if want := strings.TrimPrefix(e.srv.URL, "http://"); seen.Host != want {
		t.Errorf("Host %q, want the admin request's %q", seen.Host, want)
	}
	for _, tc := range []struct {
		name   string
		change func(body map[string]any)
		keyErr error
		code   string
	}{
		{"no method", func(b map[string]any) { delete(b, "method") }, nil, "invalid_request"},
		{"no path", func(b map[string]any) { delete(b, "path") }, nil, "invalid_request"},
		{"no key", func(b map[string]any) { delete(b, "key") }, nil, "invalid_request"},
		{"a method that is no token", func(b map[string]any) { b["method"] = "PO ST" }, nil, "invalid_request"},
		{"a path without its slash", func(b map[string]any) { b["path"] = "orders" }, nil, "invalid_request"},
		{"the key in the headers", func(b map[string]any) { b["headers"] = map[string]string{"idempotency-key": "k"} }, nil, "invalid_request"},
		{"a header value with CRLF", func(b map[string]any) { b["headers"] = map[string]string{"Cookie": "a\r\nb"} }, nil, "invalid_request"},
		{"a client IP that is no IP", func(b map[string]any) { b["client_ip"] = "shop.example" }, nil, "invalid_request"},
		{"a request no route records", func(map[string]any) {}, fmt.Errorf("%w: no route matches", problem.ErrBadRequest), "invalid_request"},
		{"a malformed key", func(map[string]any) {}, idempotency.ErrInvalidKey, "invalid_idempotency_key"},
	} {
		body := map[string]any{"method": "POST", "path": "/orders", "key": "k", "client_ip": "203.0.113.7"}
		tc.change(body)
		keyErr = tc.keyErr
		if got := e.admin("POST", "/v1/admin/records/lookup", adminKeys[0], body); got.status != 400 || got.code != tc.code {
			t.Errorf("%s: %d %q %s, want 400 %q", tc.name, got.status, got.code, got.raw, tc.code)
		}
	}
}
