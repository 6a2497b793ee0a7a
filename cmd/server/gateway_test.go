package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
)

// gatewayRoutes is the routes file of the end-to-end test: one route per
// policy.
const gatewayRoutes = `routes:
  - match: "POST /orders"
    policy: idempotency_key
    required: true
  - match: "POST /comments"
    policy: fingerprint
    window: 1m
  - match: "POST /checkout"
    policy: token
    purpose: checkout
  - match: "POST /payments"
    policy: signature
`

// gatewayAdminKey is the operators' key of the end-to-end test.
const gatewayAdminKey = "ops-secret"

// TestGatewayEndToEnd runs the server in gateway mode in front of a real
// upstream process (test/upstream) that counts its executions, and sends
// double submits and retries through it.
func TestGatewayEndToEnd(t *testing.T) {
	bin := buildUpstream(t)
	stores := []struct {
		name string
		env  func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return nil }},
		{"redis", func(t *testing.T) []string {
			return []string{
				"REPLAYGUARD_REDIS_URL=" + testenv.Var(t, "REPLAYGUARD_TEST_REDIS_URL"),
				"REPLAYGUARD_KEY_PREFIX=rgtest:gateway:" + randomHex(t) + ":",
				"REPLAYGUARD_STORE_TIMEOUT=5s",
			}
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			env := st.env(t)
			up := startUpstream(t, bin)
			dir := t.TempDir()
			routes := filepath.Join(dir, "routes.yaml")
			if err := os.WriteFile(routes, []byte(gatewayRoutes), 0o600); err != nil {
				t.Fatal(err)
			}
			secret := hmacSecret(t)
			keys := filepath.Join(dir, "client-keys.json")
			writeClientKeys(t, keys, "partner-1", secret)
			gw := startGateway(t, append(env,
				"REPLAYGUARD_UPSTREAM=http://"+up.addr,
				"REPLAYGUARD_ROUTES="+routes,
				"REPLAYGUARD_CLIENT_KEYS="+keys,
				"REPLAYGUARD_IDEMPOTENCY_RETENTION=10m",
				"REPLAYGUARD_ADMIN_KEYS="+gatewayAdminKey,
			)...)
			gatewayScenarios(t, gw, up, secret)
		})
	}
}

func gatewayScenarios(t *testing.T, gw string, up *upstreamProc, secret []byte) {
	t.Run("idempotency_key: a double submit and a retry run the app once", func(t *testing.T) {
		const burst = 10
		results := make([]result, burst)
		var wg sync.WaitGroup
		for i := range results {
			wg.Go(func() {
				results[i] = try(newReq(t, "POST", gw+"/orders", `{"item":"book","qty":1}`,
					"Idempotency-Key", `"order-1"`, "Content-Type", "application/json", "X-Test-Case", "orders-1"))
			})
		}
		wg.Wait()
		var first *result
		for i, r := range results {
			switch {
			case r.err != nil:
				t.Fatalf("request %d: %v", i, r.err)
			case r.status == http.StatusCreated && r.header.Get("Idempotent-Replayed") == "":
				if first != nil {
					t.Fatalf("two executions answered: %s and %s", first.body, r.body)
				}
				first = &results[i]
			case r.status == http.StatusCreated:
			case r.status == http.StatusConflict && r.code() == "request_in_progress":
			default:
				t.Fatalf("request %d = %d %s", i, r.status, r.body)
			}
		}
		if first == nil {
			t.Fatal("no request got the execution's own answer")
		}
		retry := try(newReq(t, "POST", gw+"/orders", `{"qty":1,"item":"book"}`, // same JSON, other order
			"Idempotency-Key", `"order-1"`, "Content-Type", "application/json", "X-Test-Case", "orders-1"))
		if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "true" || retry.body != first.body ||
			retry.header.Get("X-Upstream") != "1" || retry.header.Get("Content-Type") != "application/json" {
			t.Fatalf("retry = %d %v %s, want the first answer %s replayed", retry.status, retry.header, retry.body, first.body)
		}
		up.wantCount(t, "orders-1", 1)
	})

	t.Run("idempotency_key: another key runs again, a reused key with another body is refused", func(t *testing.T) {
		r := try(newReq(t, "POST", gw+"/orders", `{"item":"pen"}`, "Idempotency-Key", `"order-2"`, "Content-Type", "application/json", "X-Test-Case", "orders-2"))
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("= %d %s", r.status, r.body)
		}
		r = try(newReq(t, "POST", gw+"/orders", `{"item":"cup"}`, "Idempotency-Key", `"order-2"`, "Content-Type", "application/json", "X-Test-Case", "orders-2"))
		if r.status != http.StatusUnprocessableEntity || r.code() != "idempotency_key_reused" {
			t.Fatalf("reused = %d %s", r.status, r.body)
		}
		up.wantCount(t, "orders-2", 1)
	})

	t.Run("idempotency_key: a missing key is refused before the app", func(t *testing.T) {
		r := try(newReq(t, "POST", gw+"/orders", `{}`, "X-Test-Case", "orders-keyless"))
		if r.status != http.StatusBadRequest || r.code() != "idempotency_key_missing" {
			t.Fatalf("= %d %s", r.status, r.body)
		}
		up.wantCount(t, "orders-keyless", 0)
	})

	t.Run("idempotency_key: other spellings of the path and method get the policy", func(t *testing.T) {
		tests := []struct {
			method, path string
			status       int
			code         string // problem code, when refused
			location     string // redirect target
		}{
			{"POST", "/x/%2e%2e/orders", 307, "", "/orders"},
			{"POST", "/x/%2E%2E/orders", 307, "", "/orders"},
			{"POST", "/%2e/orders", 307, "", "/orders"},
			{"POST", "/x/../orders", 307, "", "/orders"},
			{"POST", "/x/..//orders", 307, "", "/orders"},
			{"post", "/orders", 400, "idempotency_key_missing", ""},
			{"Post", "/orders", 400, "idempotency_key_missing", ""},
		}
		for _, tc := range tests {
			req := newReq(t, tc.method, gw, `{}`, "X-Test-Case", "orders-spelled")
			req.URL.Opaque = tc.path // sent exactly as written
			r := try(req)
			if r.err != nil || r.status != tc.status || r.code() != tc.code || r.header.Get("Location") != tc.location {
				t.Errorf("%s %s = %d %q %v, want %d %q Location %q", tc.method, tc.path, r.status, r.body, r.err, tc.status, tc.code, tc.location)
			}
		}
		up.wantCount(t, "orders-spelled", 0)
	})

	t.Run("idempotency_key: a 5xx is not stored, so the retry runs", func(t *testing.T) {
		send := func() result {
			return try(newReq(t, "POST", gw+"/orders", `{}`, "Idempotency-Key", `"order-3"`, "X-Test-Case", "orders-5xx", "X-Test-Fail-First", "1"))
		}
		if r := send(); r.status != http.StatusInternalServerError {
			t.Fatalf("first = %d %s", r.status, r.body)
		}
		if r := send(); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry = %d %v %s", r.status, r.header, r.body)
		}
		if r := send(); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("second retry = %d %v %s", r.status, r.header, r.body)
		}
		up.wantCount(t, "orders-5xx", 2)
	})

	t.Run("fingerprint: an identical keyless double submit runs the app once", func(t *testing.T) {
		form := "title=hi&text=first+comment"
		first := try(newReq(t, "POST", gw+"/comments", form, "Content-Type", "application/x-www-form-urlencoded", "X-Test-Case", "comments"))
		second := try(newReq(t, "POST", gw+"/comments", "text=first+comment&title=hi", "Content-Type", "application/x-www-form-urlencoded", "X-Test-Case", "comments"))
		if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("first = %d %s", first.status, first.body)
		}
		if second.status != http.StatusCreated || second.header.Get("Idempotent-Replayed") != "true" || second.body != first.body {
			t.Fatalf("double submit = %d %v %s", second.status, second.header, second.body)
		}
		up.wantCount(t, "comments", 1)
		other := try(newReq(t, "POST", gw+"/comments", "title=hi&text=second", "Content-Type", "application/x-www-form-urlencoded", "X-Test-Case", "comments"))
		if other.status != http.StatusCreated || other.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("another comment = %d %v %s", other.status, other.header, other.body)
		}
		up.wantCount(t, "comments", 2)
	})

	t.Run("fingerprint and keys: a member named in two cases is refused, in either order, and never reaches the app", func(t *testing.T) {
		for _, tc := range []struct{ path, body, key string }{
			{"/comments", `{"item":"book","qty":1,"QTY":5}`, ""},
			{"/comments", `{"QTY":5,"item":"book","qty":1}`, ""},
			{"/comments", `{"lines":[{"sku":"a","\u017fku":"b"}]}`, ""}, // the long s is s
			{"/orders", `{"item":"book","qty":1,"QTY":5}`, `"case-1"`},
			{"/orders", `{"QTY":5,"item":"book","qty":1}`, `"case-1"`},
		} {
			headers := []string{"Content-Type", "application/json", "X-Test-Case", "case-members"}
			if tc.key != "" {
				headers = append(headers, "Idempotency-Key", tc.key)
			}
			r := try(newReq(t, "POST", gw+tc.path, tc.body, headers...))
			if r.status != http.StatusBadRequest || r.code() != "invalid_request" || !strings.Contains(r.body, "twice in one object") {
				t.Fatalf("%s %s = %d %s, want 400 invalid_request naming the member", tc.path, tc.body, r.status, r.body)
			}
		}
		up.wantCount(t, "case-members", 0)
	})

	t.Run("token: a form submit reaches the app once, with its body and token id", func(t *testing.T) {
		tok, id := issueToken(t, gw, "checkout")
		form := "item=book&idempotency_token=" + url.QueryEscape(tok) + "&qty=2"
		submit := func() result {
			return try(newReq(t, "POST", gw+"/checkout", form, "Content-Type", "application/x-www-form-urlencoded",
				"X-Test-Case", "checkout", "Replayguard-Token-Id", "spoofed", "replayguard_token_id", "spoofed"))
		}
		first := submit()
		if first.status != http.StatusSeeOther || !strings.HasPrefix(first.header.Get("Location"), "/orders/") {
			t.Fatalf("= %d %v %s", first.status, first.header, first.body)
		}
		e := first.echo(t)
		if e.Body != form {
			t.Errorf("the app got the body %q, want %q as sent", e.Body, form)
		}
		if got := e.Headers.Values("Replayguard-Token-Id"); len(got) != 1 || got[0] != id {
			t.Errorf("the app got Replayguard-Token-Id %q, want [%s]", got, id)
		}
		if _, ok := e.Headers["Replayguard_token_id"]; ok {
			t.Error("the app got the underscore spelling of Replayguard-Token-Id")
		}
		// The double submit gets first's 303 to the same order page,
		// recorded under the token's ID.
		dup := submit()
		if dup.status != http.StatusSeeOther || dup.header.Get("Location") != first.header.Get("Location") ||
			dup.header.Get("Idempotent-Replayed") != "true" || string(dup.body) != string(first.body) {
			t.Fatalf("double submit = %d %v %s, want first's %d %v replayed", dup.status, dup.header, dup.body, first.status, first.header)
		}
		up.wantCount(t, "checkout", 1)
	})

	t.Run("token: a request without a token is refused before the app", func(t *testing.T) {
		r := try(newReq(t, "POST", gw+"/checkout", "item=book", "Content-Type", "application/x-www-form-urlencoded", "X-Test-Case", "checkout-tokenless"))
		if r.status != http.StatusBadRequest || r.code() != "invalid_request" {
			t.Fatalf("= %d %s", r.status, r.body)
		}
		up.wantCount(t, "checkout-tokenless", 0)
	})

	t.Run("signature: a signed request reaches the app once, with its keyid", func(t *testing.T) {
		signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, secret)
		if err != nil {
			t.Fatal(err)
		}
		req := newReq(t, "POST", gw+"/payments", `{"amount":5}`, "Content-Type", "application/json", "X-Test-Case", "payments", "Replayguard-Client-Key-Id", "spoofed")
		if err := signer.Sign(req); err != nil {
			t.Fatal(err)
		}
		again := req.Clone(context.Background())
		again.Body, _ = req.GetBody()
		r := try(req)
		if r.status != http.StatusCreated {
			t.Fatalf("= %d %s", r.status, r.body)
		}
		if got := r.echo(t).Headers.Values("Replayguard-Client-Key-Id"); len(got) != 1 || got[0] != "partner-1" {
			t.Fatalf("the app got Replayguard-Client-Key-Id %q", got)
		}
		if r := try(again); r.status != http.StatusUnauthorized || r.code() != "replayed_request" {
			t.Fatalf("replay = %d %s", r.status, r.body)
		}
		up.wantCount(t, "payments", 1)
	})

	t.Run("unrouted requests pass through, without spoofed or hop-by-hop headers", func(t *testing.T) {
		r := try(newReq(t, "GET", gw+"/hello?x=1", "", "X-Test-Case", "hello", "X-Request-ID", "trace-gw-1",
			"Replayguard-Token-Id", "spoofed", "REPLAYGUARD-CLIENT-KEY-ID", "spoofed", "Replayguard_Client_Key_Id", "spoofed",
			"Connection", "X-Hop", "X-Hop", "1", "Keep-Alive", "timeout=5", "Proxy-Authorization", "Basic eDp5",
			"X-Forwarded-For", "6.6.6.6"))
		if r.status != http.StatusCreated {
			t.Fatalf("= %d %s", r.status, r.body)
		}
		e := r.echo(t)
		if e.URI != "/hello?x=1" || e.Method != "GET" {
			t.Errorf("the app got %s %s", e.Method, e.URI)
		}
		for name := range e.Headers {
			n := strings.ReplaceAll(strings.ToLower(name), "_", "-")
			if strings.HasPrefix(n, "replayguard-") || slices.Contains([]string{"x-hop", "keep-alive", "proxy-authorization"}, n) {
				t.Errorf("the app got %s: %q", name, e.Headers[name])
			}
		}
		if xff := e.Headers.Get("X-Forwarded-For"); xff != "127.0.0.1" {
			t.Errorf("the app got X-Forwarded-For %q, want the client 127.0.0.1", xff)
		}
		if got, sent := r.header.Values("X-Request-ID"), e.Headers.Values("X-Request-ID"); len(got) != 1 || got[0] != "trace-gw-1" || len(sent) != 1 || sent[0] != "trace-gw-1" {
			t.Errorf("X-Request-ID: the client got %q, the app %q; want one trace-gw-1 each", got, sent)
		}
		up.wantCount(t, "hello", 1)
	})

	t.Run("Replayguard keeps its own paths", func(t *testing.T) {
		tests := []struct {
			method, path string
			status       int
			code         string
		}{
			{"GET", "/healthz", 200, ""},
			{"GET", "/readyz", 200, ""},
			{"GET", "/metrics", 200, ""},
			{"GET", "/v1/tokens", 405, "method_not_allowed"},
			{"POST", "/v1/unknown", 404, "not_found"},
			{"GET", "/sdk/unknown.js", 404, "not_found"},
		}
		for _, tc := range tests {
			r := try(newReq(t, tc.method, gw+tc.path, "", "X-Test-Case", "replayguard-paths"))
			if r.status != tc.status || r.code() != tc.code || r.header.Get("X-Upstream") != "" {
				t.Errorf("%s %s = %d %s, want %d %q from Replayguard", tc.method, tc.path, r.status, r.body, tc.status, tc.code)
			}
		}
		up.wantCount(t, "replayguard-paths", 0)
	})

	t.Run("spellings servers read their own way are refused before the upstream", func(t *testing.T) {
		for _, path := range []string{"/x/..;/checkout", "/.;/orders", `/x/..\orders`, "/x/%252e%252e/orders"} {
			r := try(newReq(t, "POST", gw+path, `{}`, "X-Test-Case", "refused-spellings"))
			if r.status != http.StatusBadRequest || r.code() != "invalid_request" || r.header.Get("X-Upstream") != "" {
				t.Errorf("POST %s = %d %s, want 400 invalid_request from the gateway", path, r.status, r.body)
			}
		}
		req := newReq(t, "POST", gw+"/hello", `{}`, "X-Test-Case", "refused-spellings")
		req.Host = "shop.test:80:80"
		if r := try(req); r.status != http.StatusBadRequest || r.code() != "invalid_request" || r.header.Get("X-Upstream") != "" {
			t.Errorf("Host shop.test:80:80 = %d %s, want 400 invalid_request", r.status, r.body)
		}
		up.wantCount(t, "refused-spellings", 0)
	})

	t.Run("admin: an operator finds a keyed request's record by the request, and releases a token's record by hand", func(t *testing.T) {
		r := try(newReq(t, "POST", gw+"/orders", `{"item":"lamp"}`, "Idempotency-Key", `"order-admin"`, "Authorization", "Bearer shopper-7", "X-Test-Case", "orders-admin"))
		if r.status != http.StatusCreated {
			t.Fatalf("the keyed request = %d %s", r.status, r.body)
		}
		admin := func(path, body string) result {
			return try(newReq(t, "POST", gw+path, body, "Authorization", "Bearer "+gatewayAdminKey, "Content-Type", "application/json"))
		}
		lookup := admin("/v1/admin/records/lookup", `{"method":"POST","path":"/orders","key":"order-admin","headers":{"Authorization":"Bearer shopper-7"},"client_ip":"127.0.0.1"}`)
		var rec struct {
			ID, State  string
			Status     int
			BodyStored bool `json:"body_stored"`
		}
		if lookup.status != http.StatusOK || json.Unmarshal([]byte(lookup.body), &rec) != nil || rec.State != "completed" || rec.Status != http.StatusCreated || !rec.BodyStored || !strings.HasPrefix(rec.ID, "idem:") {
			t.Fatalf("lookup = %d %s, want the record completed with the app's 201", lookup.status, lookup.body)
		}
		if byID := try(newReq(t, "GET", gw+"/v1/admin/records/"+rec.ID, "", "Authorization", "Bearer "+gatewayAdminKey)); byID.status != http.StatusOK || byID.body != lookup.body {
			t.Fatalf("by ID = %d %s, want %s", byID.status, byID.body, lookup.body)
		}
		if other := admin("/v1/admin/records/lookup", `{"method":"POST","path":"/orders","key":"order-admin","headers":{"Authorization":"Bearer shopper-8"}}`); other.status != http.StatusNotFound || other.code() != "record_not_found" {
			t.Fatalf("another caller's lookup = %d %s, want 404 record_not_found", other.status, other.body)
		}
		if noKey := try(newReq(t, "POST", gw+"/v1/admin/records/lookup", `{"token":"x"}`)); noKey.status != http.StatusUnauthorized || noKey.code() != "unauthorized" {
			t.Fatalf("without the admin key = %d %s", noKey.status, noKey.body)
		}
		// A backend's token record, processing, released by hand: the
		// token redeems again.
		tok, id := issueToken(t, gw, "checkout")
		redeem := func() result {
			return try(newReq(t, "POST", gw+"/v1/tokens/redeem", `{"purpose":"checkout","record":true}`, "Idempotency-Token", tok))
		}
		if r := redeem(); r.status != http.StatusOK {
			t.Fatalf("redeem = %d %s", r.status, r.body)
		}
		if r := admin("/v1/admin/records/token:"+id+"/release", ""); r.status != http.StatusOK || strings.TrimSpace(r.body) != `{"released":true}` {
			t.Fatalf("release = %d %s", r.status, r.body)
		}
		if r := redeem(); r.status != http.StatusOK || !strings.Contains(r.body, `"status":"redeemed"`) {
			t.Fatalf("the retry after the release = %d %s, want redeemed", r.status, r.body)
		}
		up.wantCount(t, "orders-admin", 1)
	})

	t.Run("the upstream down: 502 upstream_unavailable", func(t *testing.T) {
		up.stop(t)
		for _, path := range []string{"/hello", "/orders"} {
			r := try(newReq(t, "POST", gw+path, `{}`, "Idempotency-Key", `"order-down"`))
			if r.status != http.StatusBadGateway || r.code() != "upstream_unavailable" || r.header.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("POST %s = %d %v %s", path, r.status, r.header, r.body)
			}
		}
	})
}

// result is one answer the gateway gave.
type result struct {
	status int
	header http.Header
	body   string
	err    error
}

func (r result) code() string {
	var p problem.Problem
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Code
}

// upstreamEcho is test/upstream's answer.
type upstreamEcho struct {
	Case      string      `json:"case"`
	Execution int         `json:"execution"`
	Method    string      `json:"method"`
	URI       string      `json:"uri"`
	Headers   http.Header `json:"headers"`
	Body      string      `json:"body"`
}

func (r result) echo(t *testing.T) upstreamEcho {
	t.Helper()
	var e upstreamEcho
	if err := json.Unmarshal([]byte(r.body), &e); err != nil {
		t.Fatalf("not the upstream's echo: %d %s", r.status, r.body)
	}
	return e
}

// try sends req without following redirects. It never fails the test,
// so goroutines may call it.
func try(req *http.Request) result {
	client := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, header: resp.Header, body: string(body), err: err}
}

// newReq builds a request; headers are name, value pairs, kept as
// written (not canonicalised).
func newReq(t *testing.T, method, target, body string, headers ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == "" {
		req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header[headers[i]] = append(req.Header[headers[i]], headers[i+1])
	}
	return req
}

// issueToken issues a token for purpose from the server at base.
func issueToken(t *testing.T, base, purpose string) (tok, id string) {
	t.Helper()
	r := try(newReq(t, "POST", base+"/v1/tokens", `{"purpose":"`+purpose+`"}`, "Content-Type", "application/json"))
	var issued struct{ Token, ID string }
	if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &issued) != nil || issued.Token == "" {
		t.Fatalf("issue = %d %s %v", r.status, r.body, r.err)
	}
	return issued.Token, issued.ID
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// buildUpstream builds test/upstream into a temporary directory.
func buildUpstream(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "upstream")
	cmd := exec.Command(goBin, "build", "-o", bin, "./test/upstream")
	cmd.Dir = composeRepoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building test/upstream: %v\n%s", err, out)
	}
	return bin
}

// upstreamProc is a running test/upstream.
type upstreamProc struct {
	addr string
	cmd  *exec.Cmd
	done chan struct{}
}

func startUpstream(t *testing.T, bin string) *upstreamProc {
	t.Helper()
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &upstreamProc{cmd: cmd, done: make(chan struct{})}
	t.Cleanup(func() { p.stop(t) })
	lines := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	select {
	case line := <-lines:
		var l struct{ Listening string }
		if json.Unmarshal([]byte(line), &l) != nil || l.Listening == "" {
			t.Fatalf("upstream said %q", line)
		}
		p.addr = l.Listening
	case <-p.done:
		t.Fatal("the upstream exited before listening")
	case <-time.After(20 * time.Second):
		t.Fatal("the upstream did not listen")
	}
	return p
}

// stop kills the upstream and waits for it; it may be called again.
func (p *upstreamProc) stop(t *testing.T) {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.cmd.Wait()
}

// wantCount checks how often the upstream executed requests of name.
func (p *upstreamProc) wantCount(t *testing.T, name string, want int) {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + "/_counts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var counts map[string]int
	if err := json.NewDecoder(resp.Body).Decode(&counts); err != nil {
		t.Fatal(err)
	}
	if counts[name] != want {
		t.Fatalf("the upstream executed %q %d times, want %d", name, counts[name], want)
	}
}

// startGateway runs the server in this process with env (NAME=value) on
// a free port, and returns its base URL. It stops with the test.
func startGateway(t *testing.T, env ...string) string {
	t.Helper()
	base, _ := startServer(t, env...)
	return base
}

// startServer runs the server in this process with env (NAME=value) on a
// free port, and returns its base URL and a function that stops it (and
// waits for it); it stops with the test at the latest.
func startServer(t *testing.T, env ...string) (base string, stop func()) {
	t.Helper()
	vars := map[string]string{"REPLAYGUARD_ADDR": "127.0.0.1:0"}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	ctx, cancel := context.WithCancel(context.Background())
	logs := &testenv.LockedBuffer{}
	listening := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, nil, func(k string) string { return vars[k] }, logs, func(addr string) { listening <- addr })
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			if t.Failed() {
				t.Logf("server logs:\n%s", logs.String())
			}
		})
	}
	t.Cleanup(stop)
	select {
	case addr := <-listening:
		return "http://" + addr, stop
	case err := <-done:
		done <- err // for stop, which the cleanup runs: it must not wait for a second result
		t.Fatalf("run: %v\n%s", err, logs.String())
	case <-time.After(20 * time.Second):
		t.Fatal("the server did not listen")
	}
	return "", stop
}

func TestGatewaySettings(t *testing.T) {
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte(gatewayRoutes), 0o600); err != nil {
		t.Fatal(err)
	}
	badRoutes := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badRoutes, []byte("routes:\n  - match: \"POST /orders\"\n    policy: idempotency_key\n    lock_ttl: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenRoutes := filepath.Join(dir, "token.yaml")
	if err := os.WriteFile(tokenRoutes, []byte("routes:\n  - {match: \"POST /checkout\", policy: token, purpose: checkout}\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("defaults", func(t *testing.T) {
		c, err := loadConfig(nil, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		if c.IdempotencyLockTTL != time.Minute || c.IdempotencyRetention != 24*time.Hour || c.IdempotencyMaxBody != 1<<20 ||
			c.IdempotencyScope != nil || c.FingerprintWindow != 2*time.Second || c.Upstream != nil || c.Routes != nil {
			t.Fatalf("defaults = %+v", c)
		}
	})

	t.Run("variables and flags", func(t *testing.T) {
		env := map[string]string{
			"REPLAYGUARD_IDEMPOTENCY_LOCK_TTL":  "30s",
			"REPLAYGUARD_IDEMPOTENCY_RETENTION": "1h",
			"REPLAYGUARD_IDEMPOTENCY_MAX_BODY":  "512KiB",
			"REPLAYGUARD_IDEMPOTENCY_SCOPE":     "header:X-Tenant",
			"REPLAYGUARD_UPSTREAM":              "http://app:3000/base",
			"REPLAYGUARD_ROUTES":                tokenRoutes,
		}
		c, err := loadConfig([]string{"-fingerprint-window", "5s", "-idempotency-max-body", "2048"}, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		if c.IdempotencyLockTTL != 30*time.Second || c.IdempotencyRetention != time.Hour || c.IdempotencyMaxBody != 2048 ||
			c.FingerprintWindow != 5*time.Second || c.Upstream.String() != "http://app:3000/base" || len(c.Routes) != 1 || c.Routes[0].Purpose != "checkout" {
			t.Fatalf("config = %+v", c)
		}
		r, _ := http.NewRequest("POST", "/", nil)
		r.Header.Set("X-Tenant", "a")
		other := r.Clone(r.Context())
		other.Header.Set("X-Tenant", "b")
		if s := c.IdempotencyScope(r); !strings.HasPrefix(s, "cred:") || s == c.IdempotencyScope(other) {
			t.Fatalf("scope = %q; want the credentials with X-Tenant", s)
		}
	})

	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"lock TTL without a unit", map[string]string{"REPLAYGUARD_IDEMPOTENCY_LOCK_TTL": "60"}, "REPLAYGUARD_IDEMPOTENCY_LOCK_TTL: \"60\" is not a Go duration"},
		{"lock TTL under a second", map[string]string{"REPLAYGUARD_IDEMPOTENCY_LOCK_TTL": "500ms"}, "REPLAYGUARD_IDEMPOTENCY_LOCK_TTL: must be at least 1s"},
		{"zero retention", map[string]string{"REPLAYGUARD_IDEMPOTENCY_RETENTION": "0s"}, "REPLAYGUARD_IDEMPOTENCY_RETENTION: must be positive"},
		{"max body with MB", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_BODY": "1MB"}, "REPLAYGUARD_IDEMPOTENCY_MAX_BODY: \"1MB\" is not a size"},
		{"max body over 64MiB", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_BODY": "128MiB"}, "REPLAYGUARD_IDEMPOTENCY_MAX_BODY:"},
		{"unknown scope", map[string]string{"REPLAYGUARD_IDEMPOTENCY_SCOPE": "user"}, "REPLAYGUARD_IDEMPOTENCY_SCOPE:"},
		{"per-caller quota that is not a number", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER": "many"}, "REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER: must be auto"},
		{"negative per-caller quota", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER": "-1"}, "REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER: must be auto"},
		{"per-address quota that is not a number", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS": "lots"}, "REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS: must be auto"},
		{"negative per-address quota", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS": "-5"}, "REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS: must be auto"},
		{"per-address bytes that are not a size", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS": "8MB"}, "REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS: must be auto, 0 (none) or a size"},
		{"negative per-address bytes", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS": "-1"}, "REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS: must be auto"},
		{"memory bytes without a unit it knows", map[string]string{"REPLAYGUARD_MEMORY_MAX_BYTES": "1GB"}, "REPLAYGUARD_MEMORY_MAX_BYTES: \"1GB\" is not a size"},
		{"scope header that is not a name", map[string]string{"REPLAYGUARD_IDEMPOTENCY_SCOPE": "header:a b"}, "REPLAYGUARD_IDEMPOTENCY_SCOPE:"},
		{"negative window", map[string]string{"REPLAYGUARD_FINGERPRINT_WINDOW": "-2s"}, "REPLAYGUARD_FINGERPRINT_WINDOW: must be positive"},
		{"upstream without a scheme", map[string]string{"REPLAYGUARD_UPSTREAM": "app:3000"}, "REPLAYGUARD_UPSTREAM:"},
		{"upstream with a query", map[string]string{"REPLAYGUARD_UPSTREAM": "http://app/?x=1"}, "REPLAYGUARD_UPSTREAM:"},
		{"upstream with a password", map[string]string{"REPLAYGUARD_UPSTREAM": "http://u:secret@app/"}, "REPLAYGUARD_UPSTREAM:"},
		{"missing routes file", map[string]string{"REPLAYGUARD_UPSTREAM": "http://app", "REPLAYGUARD_ROUTES": filepath.Join(dir, "nope.yaml")}, "REPLAYGUARD_ROUTES:"},
		{"bad routes file", map[string]string{"REPLAYGUARD_UPSTREAM": "http://app", "REPLAYGUARD_ROUTES": badRoutes}, "REPLAYGUARD_ROUTES: " + badRoutes + ": line 4: routes[0].lock_ttl"},
		{"routes without an upstream", map[string]string{"REPLAYGUARD_ROUTES": tokenRoutes}, "REPLAYGUARD_ROUTES is set but REPLAYGUARD_UPSTREAM is not"},
		{"a signature route without client keys", map[string]string{"REPLAYGUARD_UPSTREAM": "http://app", "REPLAYGUARD_ROUTES": routes}, "routes[3] (line 11) has policy signature, which needs REPLAYGUARD_CLIENT_KEYS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(nil, func(k string) string { return tc.env[k] })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Fatalf("the error quotes a password: %v", err)
			}
		})
	}
}

func TestReplayguardPaths(t *testing.T) {
	for path, want := range map[string]bool{
		"/v1/tokens": true, "/v1/anything/else": true, "/sdk/replayguard.js": true,
		"/healthz": true, "/readyz": true, "/metrics": true,
		"/": false, "/v1": false, "/v10/x": false, "/orders": false, "/healthz/x": false, "/metricsx": false,
	} {
		if got := replayguardPath(path); got != want {
			t.Errorf("replayguardPath(%q) = %v, want %v", path, got, want)
		}
	}
}

// TestServerTimeouts: in gateway mode a request may wait for its body and
// then for the app, each up to the gateway's timeout, so the server's
// read and write timeouts must outlast them (else the app's late answer,
// or the 502, becomes an empty reply); outside it they stay short.
func TestServerTimeouts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		upstream time.Duration
	}{
		{"the default gateway timeout", gateway.DefaultTimeout},
		{"a long gateway timeout", 5 * time.Minute},
		{"a short gateway timeout", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(http.NotFoundHandler(), tc.upstream)
			if srv.ReadHeaderTimeout != 5*time.Second {
				t.Errorf("ReadHeaderTimeout = %v, want 5s", srv.ReadHeaderTimeout)
			}
			// ReadTimeout runs from the request's first byte: the
			// headers, then a body that may stream to the app for as
			// long as the gateway waits for it.
			if srv.ReadTimeout < srv.ReadHeaderTimeout+tc.upstream {
				t.Errorf("ReadTimeout = %v, under ReadHeaderTimeout + the gateway timeout %v", srv.ReadTimeout, tc.upstream)
			}
			// WriteTimeout runs from the end of the headers: the body
			// (buffered first on recorded routes), then the app.
			if srv.WriteTimeout <= srv.ReadTimeout+tc.upstream {
				t.Errorf("WriteTimeout = %v, not over ReadTimeout %v + the gateway timeout %v", srv.WriteTimeout, srv.ReadTimeout, tc.upstream)
			}
		})
	}
	t.Run("outside gateway mode the timeouts stay short", func(t *testing.T) {
		srv := newServer(http.NotFoundHandler(), 0)
		if srv.ReadHeaderTimeout != 5*time.Second || srv.ReadTimeout != 10*time.Second || srv.WriteTimeout != 15*time.Second || srv.IdleTimeout != time.Minute {
			t.Fatalf("timeouts = %v, %v, %v, %v, want 5s, 10s, 15s, 1m", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
		}
	})
}
