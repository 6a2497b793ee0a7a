package gateway_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/store/storetest"
	"github.com/replayguard/replayguard/token"
)

// app is an upstream that records what reached it and answers with
// respond (by default 201 and a JSON echo).
type app struct {
	srv     *httptest.Server
	mu      sync.Mutex
	got     []seen
	respond http.HandlerFunc
}

// seen is one request as the app received it.
type seen struct {
	Method, Path, Host string
	Header             http.Header
	Body               string
}

func newApp(t *testing.T) *app {
	t.Helper()
	a := &app{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		a.mu.Lock()
		a.got = append(a.got, seen{r.Method, r.URL.RequestURI(), r.Host, r.Header.Clone(), string(body)})
		n := len(a.got)
		respond := a.respond
		a.mu.Unlock()
		if respond != nil {
			respond(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"execution": n, "path": r.URL.Path})
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) requests() []seen {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]seen(nil), a.got...)
}

func (a *app) url(t *testing.T) *url.URL {
	u, err := url.Parse(a.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// deps are what the policies need, on one memory store.
type deps struct {
	keeper *idempotency.Keeper
	tokens *token.Service
}

func newDeps(t testing.TB) deps {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := token.New(st, []token.Key{key}, token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	return deps{keeper: idempotency.New(st), tokens: svc}
}

var quiet = gateway.WithLogger(slog.New(slog.DiscardHandler))

// serve runs a gateway to upstream with the routes in yaml.
func serve(t *testing.T, upstream *url.URL, yaml string, opts ...gateway.Option) *httptest.Server {
	t.Helper()
	routes, err := gateway.ParseRoutes([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(upstream, routes, append([]gateway.Option{quiet}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return srv
}

// do sends req and returns the status, headers and body.
func do(t *testing.T, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

func newRequest(t *testing.T, method, target, body string, header ...string) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, target, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header[header[i]] = append(req.Header[header[i]], header[i+1]) // as written, not canonicalised
	}
	return req
}

// problemCode is the code of a problem+json body, or "".
func problemCode(body string) string {
	var p problem.Problem
	_ = json.Unmarshal([]byte(body), &p)
	return p.Code
}

const routingRoutes = `routes:
  - match: "POST /orders"
    policy: idempotency_key
    required: true
  - match: "POST /checkout"
    policy: token
    purpose: checkout
  - match: "POST shop.test/hosted"
    policy: idempotency_key
    required: true
  - match: "POST /admin/"
    policy: idempotency_key
    required: true
`

func TestRouting(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), routingRoutes, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens))
	tests := []struct {
		name, method, path, host string
		status                   int
		code                     string // problem code, when refused
		location                 string // redirect target
		reachesApp               bool
	}{
		{"routed: a keyless POST /orders is refused", "POST", "/orders", "", 400, "idempotency_key_missing", "", false},
		{"routed whatever the query", "POST", "/orders?x=1", "", 400, "idempotency_key_missing", "", false},
		{"routed: a tokenless POST /checkout is refused", "POST", "/checkout", "", 400, "invalid_request", "", false},
		{"another method passes through", "GET", "/orders", "", 201, "", "", true},
		{"another path passes through", "POST", "/orders/7", "", 201, "", "", true},
		{"another method's spelling passes through", "GET", "/ORDERS/", "", 201, "", "", true},
		{"a longer name passes through", "POST", "/orders7.json", "", 201, "", "", true},
		{"a dot inside a name that is not the last passes through", "POST", "/orders.json/x", "", 201, "", "", true},
		{"an unrouted path passes through", "POST", "/comments", "", 201, "", "", true},
		{"a host pattern needs its host", "POST", "/hosted", "", 201, "", "", true},
		{"a host pattern routes its host", "POST", "/hosted", "shop.test", 400, "idempotency_key_missing", "", false},
		{"a host pattern routes its host in capitals", "POST", "/hosted", "SHOP.TEST", 400, "idempotency_key_missing", "", false},
		{"a host pattern routes its host in mixed case", "POST", "/hosted", "Shop.Test", 400, "idempotency_key_missing", "", false},
		{"a host pattern routes its host with a trailing dot", "POST", "/hosted", "shop.test.", 400, "idempotency_key_missing", "", false},
		{"a host pattern routes its host with a port", "POST", "/hosted", "shop.test:80", 400, "idempotency_key_missing", "", false},
		{"a host pattern routes its host with a trailing dot and a port", "POST", "/hosted", "Shop.Test.:8080", 400, "idempotency_key_missing", "", false},
		{"a host pattern's host redirects an unclean path", "POST", "/x/../hosted", "SHOP.TEST.", 307, "", "/hosted", false},
		{"a host pattern does not route another host", "POST", "/hosted", "shop.test.evil", 201, "", "", true},
		{"a doubled slash to a routed path redirects", "POST", "/x/..//orders", "", 307, "", "/orders", false},
		{"a dot to a routed path redirects", "POST", "/./orders", "", 307, "", "/orders", false},
		{"a dot segment to a routed path redirects", "POST", "/x/../orders?a=1", "", 307, "", "/orders?a=1", false},
		{"an unclean unrouted path passes through as sent", "POST", "/x/../comments", "", 201, "", "", true},
		{"a leading doubled slash redirects", "POST", "//orders", "", 307, "", "/orders", false},
		{"a doubled slash inside redirects", "POST", "/admin//x", "", 307, "", "/admin/x", false},
		{"an encoded dot-dot segment redirects", "POST", "/x/%2e%2e/orders", "", 307, "", "/orders", false},
		{"an encoded dot-dot segment in capitals redirects", "POST", "/x/%2E%2E/orders?a=1", "", 307, "", "/orders?a=1", false},
		{"a half-encoded dot-dot segment redirects", "POST", "/x/.%2e/orders", "", 307, "", "/orders", false},
		{"an encoded dot segment redirects", "POST", "/%2e/orders", "", 307, "", "/orders", false},
		{"encoded slashes around dots redirect", "POST", "/x%2F..%2Forders", "", 307, "", "/orders", false},
		{"an encoded slash into a subtree redirects", "POST", "/admin%2Fusers", "", 307, "", "/admin/users", false},
		{"an escaped letter is the same path", "POST", "/%6Frders", "", 400, "idempotency_key_missing", "", false},
		{"a subtree's path without its slash redirects", "POST", "/admin", "", 307, "", "/admin/", false},
		{"an encoded unclean unrouted path passes through as sent", "POST", "/x/%2e%2e/comments", "", 201, "", "", true},
		{"paths match in any case", "POST", "/Orders", "", 400, "idempotency_key_missing", "", false},
		{"paths match in capitals", "POST", "/ORDERS", "", 400, "idempotency_key_missing", "", false},
		{"a subtree matches in any case", "POST", "/Admin/x", "", 400, "idempotency_key_missing", "", false},
		{"a subtree's path in capitals without its slash", "POST", "/ADMIN", "", 400, "idempotency_key_missing", "", false},
		{"a trailing slash is the same path", "POST", "/orders/", "", 400, "idempotency_key_missing", "", false},
		{"an encoded trailing slash is the same path", "POST", "/orders%2f", "", 400, "idempotency_key_missing", "", false},
		{"a format suffix is the same path", "POST", "/orders.json", "", 400, "idempotency_key_missing", "", false},
		{"a format suffix in capitals with a slash", "POST", "/ORDERS.JSON/", "", 400, "idempotency_key_missing", "", false},
		{"two suffixes", "POST", "/checkout.tar.gz", "", 400, "invalid_request", "", false},
		{"a trailing dot", "POST", "/orders.", "", 400, "idempotency_key_missing", "", false},
		{"a trailing dot on a subtree's segment", "POST", "/admin./x", "", 400, "idempotency_key_missing", "", false},
		{"an encoded trailing dot on a subtree's segment", "POST", "/admin%2e/x", "", 400, "idempotency_key_missing", "", false},
		{"an encoded trailing dot in capitals", "POST", "/admin%2E/x", "", 400, "idempotency_key_missing", "", false},
		{"a trailing space on a subtree's segment", "POST", "/admin%20/x", "", 400, "idempotency_key_missing", "", false},
		{"a trailing space", "POST", "/orders%20", "", 400, "idempotency_key_missing", "", false},
		{"a fullwidth solidus", "POST", "/%EF%BC%8Fadmin/x", "", 400, "idempotency_key_missing", "", false},
		{"fullwidth letters", "POST", "/%EF%BD%8F%EF%BD%92%EF%BD%84%EF%BD%85%EF%BD%92%EF%BD%93", "", 400, "idempotency_key_missing", "", false},
		{"a long s", "POST", "/order%C5%BF", "", 400, "idempotency_key_missing", "", false},
		{"a two dot leader as a dot-dot segment", "POST", "/x/%E2%80%A5/orders", "", 400, "idempotency_key_missing", "", false},
		{"a double-encoded letter", "POST", "/%256Frders", "", 400, "idempotency_key_missing", "", false},
		{"triple-encoded dots", "POST", "/x/%25252e%25252e/checkout", "", 400, "invalid_request", "", false},
		{"an encoded query mark", "POST", "/orders%3Fx=1", "", 400, "idempotency_key_missing", "", false},
		{"a doubled slash before capitals", "POST", "/x/..//ORDERS", "", 400, "idempotency_key_missing", "", false},
		{"a host pattern's path in capitals", "POST", "/HOSTED.json", "Shop.Test", 400, "idempotency_key_missing", "", false},
		{"a lowercase method is routed", "post", "/orders", "", 400, "idempotency_key_missing", "", false},
		{"a mixed-case method is routed", "Post", "/checkout", "", 400, "invalid_request", "", false},
		{"a lowercase method reaches the app in capitals", "get", "/orders", "", 201, "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(a.requests())
			req := newRequest(t, tc.method, gw.URL, "")
			req.URL.Opaque = tc.path // sent exactly as written
			if p, q, ok := strings.Cut(tc.path, "?"); ok {
				req.URL.Opaque, req.URL.RawQuery = p, q
			}
			if strings.HasPrefix(tc.path, "//") { // an Opaque "//x" is sent as the URL http://x
				req.URL.Opaque, req.URL.Path = "", tc.path
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || problemCode(string(body)) != tc.code {
				t.Fatalf("= %d %s, want %d %q", resp.StatusCode, body, tc.status, tc.code)
			}
			if loc := resp.Header.Get("Location"); loc != tc.location {
				t.Fatalf("Location = %q, want %q", loc, tc.location)
			}
			got := a.requests()[before:]
			if reached := len(got) > 0; reached != tc.reachesApp {
				t.Fatalf("reached the app: %v, want %v", reached, tc.reachesApp)
			}
			if tc.reachesApp && (got[0].Path != tc.path || got[0].Method != strings.ToUpper(tc.method)) {
				t.Fatalf("the app got %s %s, want %s %s", got[0].Method, got[0].Path, strings.ToUpper(tc.method), tc.path)
			}
		})
	}
}

func TestStripVerifiedHeaders(t *testing.T) {
	h := http.Header{
		"Replayguard-Token-Id":      {"a"},
		"replayguard-token-id":      {"b"},
		"REPLAYGUARD-CLIENT-KEY-ID": {"c"},
		"Replayguard_Token_Id":      {"d"},
		"Replayguard_client_key_id": {"e"},
		"REPLAYGUARD_WEBHOOK_ID":    {"f"},
		"replayguard-webhook-id":    {"g"},
		"Replayguard-Token-Ids":     {"kept"},
		"Content-Type":              {"kept"},
	}
	gateway.StripVerifiedHeaders(h)
	if len(h) != 2 || h.Get("Content-Type") != "kept" || h.Get("Replayguard-Token-Ids") != "kept" {
		t.Fatalf("left %v", h)
	}
}

// spoofs are client-sent copies of the verified headers in the spellings
// an app might read.
var spoofs = []string{
	"Replayguard-Token-Id", "spoof-1",
	"replayguard-token-id", "spoof-2",
	"REPLAYGUARD-CLIENT-KEY-ID", "spoof-3",
	"Replayguard_Token_Id", "spoof-4",
	"replayguard_client_key_id", "spoof-5",
	"Replayguard-Webhook-Id", "spoof-6",
	"replayguard_webhook_id", "spoof-7",
}

// hopByHop are headers for one connection only, and one a Connection
// header names.
var hopByHop = []string{
	"Connection", "X-Hop, Replayguard-Token-Id",
	"X-Hop", "1",
	"Keep-Alive", "timeout=5",
	"Proxy-Authorization", "Basic c2VjcmV0",
	"Proxy-Connection", "keep-alive",
	"Te", "gzip",
}

func TestHeaderHygiene(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), routingRoutes, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens))
	is, err := d.tokens.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		t.Fatal(err)
	}
	headers := append(append(append([]string{}, spoofs...), hopByHop...),
		"X-Forwarded-For", "6.6.6.6", "X-Forwarded-Host", "evil.test", "X-Forwarded-Proto", "https", "Forwarded", "for=6.6.6.6",
		"X-Real-IP", "6.6.6.1", "x-real-ip", "6.6.6.2", "X_Real_IP", "6.6.6.3", "True-Client-IP", "6.6.6.4", "true_client_ip", "6.6.6.5",
		"X_Forwarded_For", "6.6.6.6", "x_forwarded_host", "evil.test", "X_FORWARDED_PROTO", "https")
	tests := []struct {
		name    string
		req     *http.Request
		tokenID string // the Replayguard-Token-Id the app must get
	}{
		{"unrouted", newRequest(t, "GET", gw.URL+"/hello", "", headers...), ""},
		{"routed (token)", newRequest(t, "POST", gw.URL+"/checkout", "", append([]string{"Idempotency-Token", is.Token}, headers...)...), is.ID},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(a.requests())
			if status, _, body := do(t, tc.req); status != http.StatusCreated {
				t.Fatalf("= %d %s", status, body)
			}
			got := a.requests()[before:]
			if len(got) != 1 {
				t.Fatalf("the app got %d requests", len(got))
			}
			h := got[0].Header
			for name, vs := range h {
				n := strings.ReplaceAll(strings.ToLower(name), "_", "-")
				if n == "replayguard-client-key-id" || n == "replayguard-webhook-id" || (n == "replayguard-token-id" && (len(vs) != 1 || vs[0] != tc.tokenID)) {
					t.Errorf("the app got %s: %q", name, vs)
				}
				for _, v := range vs {
					if strings.HasPrefix(v, "spoof-") {
						t.Errorf("the app got a spoofed value in %s: %q", name, v)
					}
				}
			}
			if tc.tokenID != "" && h.Get(gateway.TokenIDHeader) != tc.tokenID {
				t.Errorf("Replayguard-Token-Id = %q, want %q (a Connection header naming it must not drop it)", h.Get(gateway.TokenIDHeader), tc.tokenID)
			}
			for _, hop := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te", "Forwarded"} {
				if v, ok := h[hop]; ok {
					t.Errorf("the app got %s: %q", hop, v)
				}
			}
			if c := h.Get("Connection"); c != "" && c != "close" && c != "keep-alive" {
				t.Errorf("the app got Connection: %q", c)
			}
			if xff := h.Get("X-Forwarded-For"); xff != "127.0.0.1" {
				t.Errorf("X-Forwarded-For = %q, want the peer 127.0.0.1 only", xff)
			}
			if xri := h.Values("X-Real-Ip"); len(xri) != 1 || xri[0] != "127.0.0.1" {
				t.Errorf("X-Real-IP = %q, want the peer 127.0.0.1 only", xri)
			}
			for name, vs := range h {
				n := strings.ReplaceAll(strings.ToLower(name), "_", "-")
				if n == "true-client-ip" || strings.Contains(name, "_") && (strings.HasPrefix(n, "x-forwarded-") || n == "x-real-ip") {
					t.Errorf("the app got the client's %s: %q", name, vs)
				}
			}
			if xfh, xfp := h.Get("X-Forwarded-Host"), h.Get("X-Forwarded-Proto"); xfh != strings.TrimPrefix(gw.URL, "http://") || xfp != "http" {
				t.Errorf("X-Forwarded-Host, -Proto = %q, %q: want what the gateway saw", xfh, xfp)
			}
		})
	}
}

func TestClientIPOption(t *testing.T) {
	a := newApp(t)
	gw := serve(t, a.url(t), "", gateway.WithClientIP(func(*http.Request) string { return "203.0.113.9" }))
	if status, _, body := do(t, newRequest(t, "GET", gw.URL+"/x", "", "X-Forwarded-For", "6.6.6.6")); status != http.StatusCreated {
		t.Fatalf("= %d %s", status, body)
	}
	if xff := a.requests()[0].Header.Get("X-Forwarded-For"); xff != "203.0.113.9" {
		t.Fatalf("X-Forwarded-For = %q", xff)
	}
}

func TestTokenPolicy(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), `routes:
  - match: "POST /checkout"
    policy: token
    purpose: checkout
    max_body: 1KiB
`, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens))
	issue := func(purpose string) token.Issued {
		is, err := d.tokens.Issue(context.Background(), token.IssueRequest{Purpose: purpose})
		if err != nil {
			t.Fatal(err)
		}
		return is
	}

	t.Run("a form field token: the app gets the body as sent and the token's id", func(t *testing.T) {
		is := issue("checkout")
		body := "item=book&idempotency_token=" + url.QueryEscape(is.Token) + "&qty=2"
		before := len(a.requests())
		status, _, resp := do(t, newRequest(t, "POST", gw.URL+"/checkout", body, "Content-Type", "application/x-www-form-urlencoded"))
		if status != http.StatusCreated {
			t.Fatalf("= %d %s", status, resp)
		}
		got := a.requests()[before:]
		if len(got) != 1 || got[0].Body != body || got[0].Header.Get(gateway.TokenIDHeader) != is.ID {
			t.Fatalf("the app got %+v", got)
		}

		// The duplicate gets the first response, recorded under the
		// token's ID.
		status, h, dup := do(t, newRequest(t, "POST", gw.URL+"/checkout", body, "Content-Type", "application/x-www-form-urlencoded"))
		if status != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" || dup != resp {
			t.Fatalf("duplicate = %d %v %s, want the first response %s replayed", status, h, dup, resp)
		}
		if n := len(a.requests()) - before; n != 1 {
			t.Fatalf("the app ran %d times", n)
		}
	})

	t.Run("a multipart form field token", func(t *testing.T) {
		is := issue("checkout")
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		_ = mw.WriteField("idempotency_token", is.Token)
		_ = mw.WriteField("item", "pen")
		_ = mw.Close()
		before := len(a.requests())
		status, _, resp := do(t, newRequest(t, "POST", gw.URL+"/checkout", b.String(), "Content-Type", mw.FormDataContentType()))
		if status != http.StatusCreated {
			t.Fatalf("= %d %s", status, resp)
		}
		got := a.requests()[before:]
		if len(got) != 1 || got[0].Body != b.String() || got[0].Header.Get(gateway.TokenIDHeader) != is.ID {
			t.Fatalf("the app got %+v", got)
		}
	})

	t.Run("a form whose Content-Type has an unparseable parameter: the app gets the body as sent", func(t *testing.T) {
		is := issue("checkout")
		body := "item=book&idempotency_token=" + url.QueryEscape(is.Token)
		before := len(a.requests())
		status, _, resp := do(t, newRequest(t, "POST", gw.URL+"/checkout", body, "Content-Type", "application/x-www-form-urlencoded; foo"))
		if status != http.StatusCreated {
			t.Fatalf("= %d %s", status, resp)
		}
		got := a.requests()[before:]
		if len(got) != 1 || got[0].Body != body || got[0].Header.Get(gateway.TokenIDHeader) != is.ID {
			t.Fatalf("the app got %+v", got)
		}
	})

	t.Run("a header token: the body streams through untouched", func(t *testing.T) {
		is := issue("checkout")
		body := strings.Repeat("x", 4096) // over max_body: not read, since the header has the token
		before := len(a.requests())
		status, _, resp := do(t, newRequest(t, "POST", gw.URL+"/checkout", body, "Idempotency-Token", is.Token, "Content-Type", "application/octet-stream"))
		if status != http.StatusCreated {
			t.Fatalf("= %d %s", status, resp)
		}
		if got := a.requests()[before:]; len(got) != 1 || got[0].Body != body || got[0].Header.Get(gateway.TokenIDHeader) != is.ID {
			t.Fatalf("the app got %d requests", len(got))
		}
	})

	refusals := []struct {
		name   string
		req    func() *http.Request
		status int
		code   string
	}{
		{"no token at all", func() *http.Request {
			return newRequest(t, "POST", gw.URL+"/checkout", "item=book", "Content-Type", "application/x-www-form-urlencoded")
		}, 400, "invalid_request"},
		{"no token and a JSON body", func() *http.Request {
			return newRequest(t, "POST", gw.URL+"/checkout", `{"idempotency_token":"x"}`, "Content-Type", "application/json")
		}, 400, "invalid_request"},
		{"a token for another purpose", func() *http.Request {
			return newRequest(t, "POST", gw.URL+"/checkout", "", "Idempotency-Token", issue("other").Token)
		}, 403, "purpose_mismatch"},
		{"a forged token", func() *http.Request {
			return newRequest(t, "POST", gw.URL+"/checkout", "", "Idempotency-Token", "not.a.token")
		}, 401, "token_invalid"},
		{"a form over max_body", func() *http.Request {
			return newRequest(t, "POST", gw.URL+"/checkout", "idempotency_token="+issue("checkout").Token+"&pad="+strings.Repeat("p", 1024), "Content-Type", "application/x-www-form-urlencoded")
		}, 413, "payload_too_large"},
		{"a form over max_body with an unparseable Content-Type", func() *http.Request {
			return newRequest(t, "POST", gw.URL+"/checkout", "idempotency_token="+issue("checkout").Token+"&pad="+strings.Repeat("p", 1024), "Content-Type", "application/x-www-form-urlencoded; foo")
		}, 413, "payload_too_large"},
		{"a chunked form over max_body", func() *http.Request {
			req := newRequest(t, "POST", gw.URL+"/checkout", "", "Content-Type", "application/x-www-form-urlencoded")
			req.Body = io.NopCloser(strings.NewReader("idempotency_token=" + issue("checkout").Token + "&pad=" + strings.Repeat("p", 1024)))
			req.ContentLength = -1
			return req
		}, 413, "payload_too_large"},
		{"a tokenless body over max_body", func() *http.Request {
			return newRequest(t, "POST", gw.URL+"/checkout", `{"pad":"`+strings.Repeat("p", 1024)+`"}`, "Content-Type", "application/json")
		}, 413, "payload_too_large"},
	}
	for _, tc := range refusals {
		t.Run("refused before the app: "+tc.name, func(t *testing.T) {
			before := len(a.requests())
			status, _, resp := do(t, tc.req())
			if status != tc.status || problemCode(resp) != tc.code {
				t.Fatalf("= %d %s, want %d %s", status, resp, tc.status, tc.code)
			}
			if n := len(a.requests()) - before; n != 0 {
				t.Fatalf("the app ran %d times", n)
			}
		})
	}
}

func TestIdempotencyRecordsStreamedResponses(t *testing.T) {
	a := newApp(t)
	a.respond = func(w http.ResponseWriter, r *http.Request) {
		// No Content-Length and flushes: ReverseProxy flushes such a
		// response as it goes, which must not stop it being recorded.
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusAccepted)
		for i := range 3 {
			_, _ = io.WriteString(w, strings.Repeat(string(rune('a'+i)), 5000))
			http.NewResponseController(w).Flush()
		}
	}
	d := newDeps(t)
	gw := serve(t, a.url(t), "routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n", gateway.WithKeeper(d.keeper))
	var first string
	for i, want := range []string{"", "true"} {
		status, h, body := do(t, newRequest(t, "POST", gw.URL+"/orders", `{"n":1}`, "Idempotency-Key", `"k1"`, "Content-Type", "application/json"))
		if status != http.StatusAccepted || len(body) != 15000 || h.Get("Idempotent-Replayed") != want {
			t.Fatalf("request %d = %d, %d bytes, replayed %q", i, status, len(body), h.Get("Idempotent-Replayed"))
		}
		if i == 0 {
			first = body
		} else if body != first {
			t.Fatal("the replay differs from the first response")
		}
	}
	if n := len(a.requests()); n != 1 {
		t.Fatalf("the app ran %d times", n)
	}
}

func TestRecordedRequestOutlivesItsClient(t *testing.T) {
	a := newApp(t)
	started, finish := make(chan struct{}), make(chan struct{})
	a.respond = func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-finish
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "order 1")
	}
	d := newDeps(t)
	routes, err := gateway.ParseRoutes([]byte("routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(a.url(t), routes, quiet, gateway.WithKeeper(d.keeper))
	if err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{}, 1)   // the gateway saw the first request's client go away
	firstDone := make(chan struct{}) // the first request's ServeHTTP returned: its record is finished
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Attempt") != "first" {
			gw.ServeHTTP(w, r)
			return
		}
		stop := context.AfterFunc(r.Context(), func() { gone <- struct{}{} })
		defer stop()
		gw.ServeHTTP(w, r)
		close(firstDone)
	}))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	req := newRequest(t, "POST", srv.URL+"/orders", "{}", "Idempotency-Key", `"k1"`, "X-Attempt", "first").WithContext(ctx)
	gave := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gave <- err
	}()
	<-started
	cancel() // the client gives up while the app works
	if err := <-gave; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client got %v", err)
	}
	<-gone // the gateway's request context is canceled; the app still works
	a.mu.Lock()
	a.respond = func(w http.ResponseWriter, r *http.Request) { t.Error("the retry ran the app again") }
	a.mu.Unlock()
	close(finish)
	<-firstDone

	// The retry gets the first execution's answer, recorded although its
	// client had gone.
	status, h, body := do(t, newRequest(t, "POST", srv.URL+"/orders", "{}", "Idempotency-Key", `"k1"`))
	if status != http.StatusCreated || body != "order 1" || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d %v %s, want the first answer replayed", status, h, body)
	}
	if n := len(a.requests()); n != 1 {
		t.Fatalf("the app ran %d times", n)
	}
}

// deadUpstream is the URL of a port nothing listens on.
func deadUpstream(t *testing.T) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	_ = ln.Close()
	return u
}

func TestUpstreamUnavailable(t *testing.T) {
	d := newDeps(t)
	gw := serve(t, deadUpstream(t), "routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n", gateway.WithKeeper(d.keeper))
	for _, tc := range []struct{ name, method, path string }{
		{"unrouted", "GET", "/hello"},
		{"routed", "POST", "/orders"},
		{"routed retry: the 502 released the key", "POST", "/orders"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, h, body := do(t, newRequest(t, tc.method, gw.URL+tc.path, "{}", "Idempotency-Key", `"k1"`))
			if status != http.StatusBadGateway || problemCode(body) != "upstream_unavailable" || h.Get("Content-Type") != "application/problem+json" {
				t.Fatalf("= %d %s %v", status, body, h)
			}
			if strings.Contains(body, "127.0.0.1") {
				t.Fatalf("the problem reveals the upstream's address: %s", body)
			}
		})
	}
}

// TestUpstreamTimeout: WithTimeout bounds the wait for the app: an answer
// inside it is proxied, past it the client gets 502. Only the timeout
// itself takes real time: the app answers when the test lets it.
func TestUpstreamTimeout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  bool // the app answers as soon as it has the request; else only after the 502
		timeout time.Duration
		status  int
	}{
		// The request, the app's answer and the response must fit in
		// the timeout however loaded the machine: the default.
		{"an answer inside the timeout is proxied", true, gateway.DefaultTimeout, http.StatusCreated},
		// Nothing fits in it: it runs out whatever the load, so it is short.
		{"no answer inside the timeout is 502", false, 300 * time.Millisecond, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newApp(t)
			started, release := make(chan struct{}), make(chan struct{})
			a.respond = func(w http.ResponseWriter, r *http.Request) {
				close(started)
				<-release
				w.WriteHeader(http.StatusCreated)
			}
			gw := serve(t, a.url(t), "", gateway.WithTimeout(tc.timeout))
			if tc.answer {
				go func() {
					<-started
					close(release)
				}()
			} else {
				t.Cleanup(func() { close(release) })
			}
			begin := time.Now()
			status, _, body := do(t, newRequest(t, "GET", gw.URL+"/slow", ""))
			if status != tc.status || (status == http.StatusBadGateway && problemCode(body) != "upstream_unavailable") {
				t.Fatalf("= %d %s, want %d", status, body, tc.status)
			}
			if elapsed := time.Since(begin); !tc.answer && elapsed < tc.timeout {
				t.Fatalf("502 after %v, before the timeout %v", elapsed, tc.timeout)
			}
		})
	}
}

// TestTimeoutBoundsResponseHeaders: the default transport waits for the
// app's response headers as long as WithTimeout allows, not a fixed 30s.
func TestTimeoutBoundsResponseHeaders(t *testing.T) {
	up := &url.URL{Scheme: "http", Host: "127.0.0.1:1"}
	for _, tc := range []struct {
		name string
		opts []gateway.Option
		want time.Duration
	}{
		{"default", nil, gateway.DefaultTimeout},
		{"longer", []gateway.Option{gateway.WithTimeout(2 * time.Minute)}, 2 * time.Minute},
		{"shorter", []gateway.Option{gateway.WithTimeout(time.Second)}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw, err := gateway.New(up, nil, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			tr, ok := gateway.TransportOf(gw).(*http.Transport)
			if !ok {
				t.Fatalf("the default transport is a %T", gateway.TransportOf(gw))
			}
			if tr.ResponseHeaderTimeout != tc.want {
				t.Fatalf("ResponseHeaderTimeout = %v, want %v", tr.ResponseHeaderTimeout, tc.want)
			}
		})
	}
}

// TestUnknownOutcomeAbandonsTheRecord: when the request may have reached
// the app (it timed out, or its answer broke off), the record is neither
// stored nor released: duplicates get 409 until the lease ends, then one
// retry runs. A 502 for an app that could not be reached releases it.
func TestUnknownOutcomeAbandonsTheRecord(t *testing.T) {
	for _, tc := range []struct {
		name    string
		respond func(release <-chan struct{}) http.HandlerFunc
		status  int // what the first client gets; 0: a broken connection
		// timeout is the gateway's for the first request: short where it
		// must run out, the default where the app's own failure must
		// come first however loaded the machine.
		timeout time.Duration
	}{
		{"the app does not answer in time", func(release <-chan struct{}) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) { <-release }
		}, http.StatusBadGateway, 100 * time.Millisecond},
		{"the app's answer breaks off after its status", func(<-chan struct{}) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", "100")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, "partial")
				_ = http.NewResponseController(w).Flush() // the status reaches the gateway
				panic(http.ErrAbortHandler)               // the app's server drops the connection
			}
		}, 0, gateway.DefaultTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newApp(t)
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			a.respond = tc.respond(release)
			clock := storetest.NewClock(time.Unix(1_700_000_000, 0))
			st := memory.New(memory.WithClock(clock.Now))
			t.Cleanup(func() { _ = st.Close() })
			keeper := idempotency.New(st, idempotency.WithClock(clock.Now), idempotency.WithLockTTL(time.Minute))
			const routes = "routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n"
			gw := serve(t, a.url(t), routes, gateway.WithKeeper(keeper), gateway.WithTimeout(tc.timeout))
			// The retry must reach the app and back however loaded the
			// machine: through a gateway with the default timeout, on the
			// same records.
			calm := serve(t, a.url(t), routes, gateway.WithKeeper(keeper))
			send := func() (*http.Response, error) {
				return http.DefaultClient.Do(newRequest(t, "POST", gw.URL+"/orders", "{}", "Idempotency-Key", `"k1"`))
			}
			resp, err := send()
			switch {
			case err == nil:
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != tc.status {
					t.Fatalf("first = %d, want %d", resp.StatusCode, tc.status)
				}
			case tc.status != 0:
				t.Fatalf("first: %v", err)
			}
			status, h, body := do(t, newRequest(t, "POST", gw.URL+"/orders", "{}", "Idempotency-Key", `"k1"`))
			if status != http.StatusConflict || problemCode(body) != "request_in_progress" || h.Get("Retry-After") == "" {
				t.Fatalf("duplicate = %d %s, want 409 request_in_progress: the record must outlive an unknown outcome", status, body)
			}
			if n := len(a.requests()); n != 1 {
				t.Fatalf("the app ran %d times, want 1", n)
			}
			clock.Advance(2*time.Minute + time.Second) // the lease and its grace (one lease) end
			a.mu.Lock()
			a.respond = nil
			a.mu.Unlock()
			if status, _, body := do(t, newRequest(t, "POST", calm.URL+"/orders", "{}", "Idempotency-Key", `"k1"`)); status != http.StatusCreated {
				t.Fatalf("retry after the lease = %d %s", status, body)
			}
			if status, h, _ := do(t, newRequest(t, "POST", calm.URL+"/orders", "{}", "Idempotency-Key", `"k1"`)); status != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("duplicate of the retry = %d %v", status, h)
			}
			if n := len(a.requests()); n != 2 {
				t.Fatalf("the app ran %d times, want 2 (the first, then one retry after the lease)", n)
			}
		})
	}
}

// rawApp is an upstream on a bare TCP listener, for a failure net/http's
// server cannot produce: it reads each request, notes how it was framed
// and answers 201, except that the first request with Idempotency-Key
// (or X-Idempotency-Key) dropKey is read (the app ran it) and its connection closed without an
// answer.
type rawApp struct {
	ln      net.Listener
	dropKey string
	mu      sync.Mutex
	conns   int
	got     []rawRequest
}

// rawRequest is one request as rawApp read it off the wire.
type rawRequest struct {
	Method, Key, ContentLength string
	Chunked                    bool
	Body                       string
}

func newRawApp(t *testing.T, dropKey string) *rawApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	a := &rawApp{ln: ln, dropKey: dropKey}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			a.conns++
			a.mu.Unlock()
			go a.serve(c)
		}
	}()
	return a
}

func (a *rawApp) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		key := req.Header.Get("Idempotency-Key") + req.Header.Get("X-Idempotency-Key")
		a.mu.Lock()
		a.got = append(a.got, rawRequest{req.Method, key, req.Header.Get("Content-Length"), slices.Contains(req.TransferEncoding, "chunked"), string(body)})
		drop := key == a.dropKey && len(a.with(key)) == 1
		a.mu.Unlock()
		if drop {
			return // the app ran the request, and its answer is lost with the connection
		}
		if _, err := io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// with returns the requests with the key key; a.mu must be held.
func (a *rawApp) with(key string) []rawRequest {
	var rs []rawRequest
	for _, r := range a.got {
		if r.Key == key {
			rs = append(rs, r)
		}
	}
	return rs
}

func (a *rawApp) url() *url.URL { return &url.URL{Scheme: "http", Host: a.ln.Addr().String()} }

// TestUnsafeRequestIsNeverResent: net/http's Transport resends a request
// it deems replayable (a body it can rewind and an Idempotency-Key
// header, or no body and that header) when a reused keep-alive
// connection dies after the request was written. The app may have run
// it, so the gateway must not let it: the app sees the request once, the
// client gets 502 and a recorded route's record is abandoned.
func TestUnsafeRequestIsNeverResent(t *testing.T) {
	const routes = `routes:
  - {match: "POST /orders", policy: idempotency_key, required: true}
  - {match: "PATCH /orders/{id}", policy: idempotency_key, required: true}
`
	tests := []struct {
		name, method, path, body string
		header                   string // the key's header; Idempotency-Key when ""
		recorded                 bool
	}{
		{"a routed POST with a body", "POST", "/orders", `{"item":"book"}`, "", true},
		{"a routed POST without a body", "POST", "/orders", "", "", true},
		{"a routed PATCH without a body", "PATCH", "/orders/7", "", "", true},
		{"an unrouted POST with a body", "POST", "/comments", "text=hi", "", false},
		{"an unrouted DELETE without a body", "DELETE", "/orders/7", "", "", false},
		{"an unrouted POST without a body, with X-Idempotency-Key", "POST", "/comments", "", "X-Idempotency-Key", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newRawApp(t, `"k2"`)
			// One connection at most, so that the request after the
			// warm-up surely goes on the warm, reused connection.
			tr := gateway.NewTransport()
			tr.MaxConnsPerHost = 1
			t.Cleanup(tr.CloseIdleConnections)
			d := newDeps(t)
			gw := serve(t, a.url(), routes, gateway.WithKeeper(d.keeper), gateway.WithTransport(tr))
			header := cmp.Or(tc.header, "Idempotency-Key")
			send := func(key string) (int, http.Header, string) {
				return do(t, newRequest(t, tc.method, gw.URL+tc.path, tc.body, header, key, "Content-Type", "application/json"))
			}
			if status, _, body := send(`"k1"`); status != http.StatusCreated {
				t.Fatalf("warm-up = %d %s", status, body)
			}
			status, _, body := send(`"k2"`)
			if status != http.StatusBadGateway || problemCode(body) != "upstream_unavailable" {
				t.Fatalf("= %d %s, want 502 upstream_unavailable", status, body)
			}
			if tc.recorded {
				status, _, body := send(`"k2"`)
				if status != http.StatusConflict || problemCode(body) != "request_in_progress" {
					t.Fatalf("duplicate = %d %s, want 409 request_in_progress: the app may have run the request", status, body)
				}
			}
			a.mu.Lock()
			defer a.mu.Unlock()
			got := a.with(`"k2"`)
			if len(got) != 1 || a.conns != 1 {
				t.Fatalf("the app got the request %d times on %d connections, want once on the warm one", len(got), a.conns)
			}
			r := got[0]
			if r.Method != tc.method || r.Body != tc.body || r.Chunked {
				t.Fatalf("the app got %+v, want %s with the body %q, not chunked", r, tc.method, tc.body)
			}
			if tc.method != http.MethodDelete && r.ContentLength != strconv.Itoa(len(tc.body)) {
				t.Fatalf("the app got Content-Length %q, want %d", r.ContentLength, len(tc.body))
			}
		})
	}
}

// raceConn is a connection to the app on which a test stages the race of
// the app closing an idle keep-alive connection just as the gateway sends
// a request on it. Once armed, the read that learns of the app's close is
// held back until a write starts, and that write waits until the
// transport has closed the connection, so that nothing of the request is
// written: the transport learns of the close before it wrote anything.
type raceConn struct {
	net.Conn
	armed                           atomic.Bool
	sawClose, writing, closed       chan struct{}
	sawOnce, writingOnce, closeOnce sync.Once
}

func (c *raceConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && c.armed.Load() {
		c.sawOnce.Do(func() { close(c.sawClose) })
		select {
		case <-c.writing:
		case <-c.closed:
		}
	}
	return n, err
}

func (c *raceConn) Write(p []byte) (int, error) {
	if c.armed.Load() {
		c.writingOnce.Do(func() { close(c.writing) })
		<-c.closed
	}
	return c.Conn.Write(p)
}

// Close closes the connection before it lets a held-back write go on, so
// that the write finds it closed (nothing written) rather than still
// open to a peer that has gone.
func (c *raceConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() { close(c.closed) })
	return err
}

// raceDialer dials raceConns and remembers them.
type raceDialer struct {
	mu    sync.Mutex
	conns []*raceConn
}

func (d *raceDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	rc := &raceConn{Conn: c, sawClose: make(chan struct{}), writing: make(chan struct{}), closed: make(chan struct{})}
	d.mu.Lock()
	d.conns = append(d.conns, rc)
	d.mu.Unlock()
	return rc, nil
}

func (d *raceDialer) dialed() []*raceConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*raceConn(nil), d.conns...)
}

// TestRequestOnAConnectionTheAppClosedIsSentAgain: when the app closes an
// idle keep-alive connection just as the gateway sends a request on it,
// and the transport learns of it before it wrote any of the request, the
// app never saw the request: the transport sends it on a new connection,
// and the app gets it once, whatever its body: none, one a policy read, or
// one streaming from the client (of which the transport sends the headers
// before reading it).
func TestRequestOnAConnectionTheAppClosedIsSentAgain(t *testing.T) {
	const routes = `routes:
  - {match: "POST /orders", policy: idempotency_key, required: true}
  - {match: "POST /checkout", policy: token, purpose: checkout}
`
	type request struct {
		path, body string
		header     []string
		chunked    bool
	}
	tests := []struct {
		name string
		req  func(tok string) request
	}{
		{"a routed POST with a body", func(string) request {
			return request{path: "/orders", body: `{"item":"book"}`, header: []string{"Idempotency-Key", `"k2"`, "Content-Type", "application/json"}}
		}},
		{"a routed POST without a body", func(string) request {
			return request{path: "/orders", header: []string{"Idempotency-Key", `"k2"`}}
		}},
		{"a token in a form field: the body the gateway read", func(tok string) request {
			return request{path: "/checkout", body: "item=book&idempotency_token=" + url.QueryEscape(tok), header: []string{"Content-Type", "application/x-www-form-urlencoded"}}
		}},
		{"an unrouted POST without a body", func(string) request {
			return request{path: "/comments"}
		}},
		{"a token in a header: the body streamed from the client", func(tok string) request {
			return request{path: "/checkout", body: "item=book", header: []string{token.Header, tok, "Content-Type", "application/x-www-form-urlencoded"}}
		}},
		{"an unrouted POST with a body streamed from the client", func(string) request {
			return request{path: "/comments", body: "text=hi", header: []string{"Content-Type", "application/x-www-form-urlencoded"}}
		}},
		{"an unrouted POST with a chunked body", func(string) request {
			return request{path: "/files/1", body: "in chunks", chunked: true}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newApp(t)
			dialer := &raceDialer{}
			tr := gateway.NewTransport()
			tr.DialContext = dialer.DialContext
			tr.MaxConnsPerHost = 1 // the request after the warm-up goes on the warm connection
			t.Cleanup(tr.CloseIdleConnections)
			d := newDeps(t)
			gw := serve(t, a.url(t), routes, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens), gateway.WithTransport(tr))
			is, err := d.tokens.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
			if err != nil {
				t.Fatal(err)
			}
			rq := tc.req(is.Token)
			send := func() (int, string) {
				req := newRequest(t, "POST", gw.URL+rq.path, rq.body, rq.header...)
				if rq.chunked {
					req.Body, req.GetBody, req.ContentLength = io.NopCloser(strings.NewReader(rq.body)), nil, -1
				}
				status, _, body := do(t, req)
				return status, body
			}

			if status, _, body := do(t, newRequest(t, "GET", gw.URL+"/warm-up", "")); status != http.StatusCreated {
				t.Fatalf("warm-up = %d %s", status, body)
			}
			warm := dialer.dialed()
			if len(warm) != 1 {
				t.Fatalf("%d connections after the warm-up, want 1", len(warm))
			}
			warm[0].armed.Store(true)
			a.srv.CloseClientConnections() // the app closes the idle connection
			<-warm[0].sawClose             // and the transport's read learns of it, held back

			status, body := send()
			got := a.requests()[1:]
			if status != http.StatusCreated || len(got) != 1 || got[0].Body != rq.body {
				t.Fatalf("= %d %s; the app got %+v, want the request once", status, body, got)
			}
			if n := len(dialer.dialed()); n != 2 {
				t.Fatalf("%d connections, want 2: the request went out again on a new one", n)
			}
		})
	}
}

// TestAppIsSpokenHTTP1: the default transport talks HTTP/1.1 to the app,
// even to one offering HTTP/2: net/http's HTTP/2 client resends a request
// the app reset with PROTOCOL_ERROR, which the app may have run.
func TestAppIsSpokenHTTP1(t *testing.T) {
	var mu sync.Mutex
	var protos []string
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		protos = append(protos, r.Proto)
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	app.EnableHTTP2 = true
	app.StartTLS()
	t.Cleanup(app.Close)
	tr := gateway.NewTransport()
	tr.TLSClientConfig = app.Client().Transport.(*http.Transport).TLSClientConfig
	if tr.Protocols.HTTP2() || tr.Protocols.UnencryptedHTTP2() || !tr.Protocols.HTTP1() {
		t.Fatalf("NewTransport's protocols = %v, want HTTP/1 only", tr.Protocols)
	}
	u, err := url.Parse(app.URL)
	if err != nil {
		t.Fatal(err)
	}
	d := newDeps(t)
	gw := serve(t, u, "routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n",
		gateway.WithKeeper(d.keeper), gateway.WithTransport(tr))
	for _, req := range []*http.Request{
		newRequest(t, "GET", gw.URL+"/", ""),
		newRequest(t, "POST", gw.URL+"/orders", "{}", "Idempotency-Key", `"k1"`),
	} {
		if status, _, body := do(t, req); status != http.StatusCreated {
			t.Fatalf("%s %s = %d %s", req.Method, req.URL.Path, status, body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(protos, []string{"HTTP/1.1", "HTTP/1.1"}) {
		t.Fatalf("the app was spoken %v, want HTTP/1.1", protos)
	}
}

// TestNeverSent: only an error that proves no byte of the request reached
// the app releases a recorded route's record, and only for a method the
// transport never resends once written.
func TestNeverSent(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := []struct {
		name   string
		method string
		err    error
		want   bool
	}{
		{"a refused dial", "POST", dial, true},
		{"a DNS failure", "POST", &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "app", IsNotFound: true}}, true},
		{"a failed dial to an HTTP proxy", "PATCH", &net.OpError{Op: "proxyconnect", Net: "tcp", Err: dial}, true},
		{"a TLS handshake timeout", "POST", errors.New("net/http: TLS handshake timeout"), true},
		{"a refused dial of a GET, which may follow a written attempt", "GET", dial, false},
		{"a reset after writing", "POST", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{"EOF before the answer", "POST", io.EOF, false},
		{"a broken connection", "POST", fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", io.ErrUnexpectedEOF), false},
		{"the server closed the idle connection", "POST", errors.New("http: server closed idle connection"), false},
		{"a timeout waiting for the answer", "POST", context.DeadlineExceeded, false},
		{"a TLS certificate error", "POST", &tls.CertificateVerificationError{Err: errors.New("x509: unknown authority")}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := gateway.NeverSent(tc.method, tc.err); got != tc.want {
				t.Fatalf("neverSent(%s, %v) = %v, want %v", tc.method, tc.err, got, tc.want)
			}
		})
	}
}

func TestSignaturePolicy(t *testing.T) {
	a := newApp(t)
	secret := bytes.Repeat([]byte{7}, 32)
	keys, err := replay.NewKeys(replay.Key{ID: "partner-1", Alg: replay.AlgHMACSHA256, Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	gw := serve(t, a.url(t), "routes:\n  - {match: \"POST /payments\", policy: signature}\n", gateway.WithVerifier(replay.NewVerifier(keys, st)))
	signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, secret)
	if err != nil {
		t.Fatal(err)
	}
	req := newRequest(t, "POST", gw.URL+"/payments", `{"amount":5}`, "Content-Type", "application/json", "Replayguard-Client-Key-Id", "spoof")
	if err := signer.Sign(req); err != nil {
		t.Fatal(err)
	}
	replayed := req.Clone(context.Background())
	replayed.Body, _ = req.GetBody()

	if status, _, body := do(t, req); status != http.StatusCreated {
		t.Fatalf("= %d %s", status, body)
	}
	got := a.requests()
	if len(got) != 1 || got[0].Body != `{"amount":5}` || got[0].Header.Values(gateway.ClientKeyIDHeader)[0] != "partner-1" || len(got[0].Header.Values(gateway.ClientKeyIDHeader)) != 1 {
		t.Fatalf("the app got %+v", got)
	}
	if status, _, body := do(t, replayed); status != http.StatusUnauthorized || problemCode(body) != "replayed_request" {
		t.Fatalf("replay = %d %s", status, body)
	}
	if status, _, body := do(t, newRequest(t, "POST", gw.URL+"/payments", "{}")); status != http.StatusUnauthorized || problemCode(body) != "signature_missing" {
		t.Fatalf("unsigned = %d %s", status, body)
	}
	if n := len(a.requests()); n != 1 {
		t.Fatalf("the app ran %d times", n)
	}
}

func TestNewRefuses(t *testing.T) {
	up := &url.URL{Scheme: "http", Host: "127.0.0.1:1"}
	d := newDeps(t)
	route := func(policy string) []gateway.Route {
		return []gateway.Route{{Match: "POST /x", Policy: policy, Purpose: "p"}}
	}
	tests := []struct {
		name     string
		upstream *url.URL
		routes   []gateway.Route
		opts     []gateway.Option
		want     string
	}{
		{"no upstream", nil, nil, nil, "upstream"},
		{"a relative upstream", &url.URL{Path: "/app"}, nil, nil, "upstream"},
		{"an ftp upstream", &url.URL{Scheme: "ftp", Host: "x"}, nil, nil, "upstream"},
		{"idempotency_key without a keeper", up, route("idempotency_key"), nil, "WithKeeper"},
		{"fingerprint without a keeper", up, route("fingerprint"), nil, "WithKeeper"},
		{"token without a token service", up, route("token"), []gateway.Option{gateway.WithKeeper(d.keeper)}, "WithTokens"},
		{"signature without a verifier", up, route("signature"), nil, "WithVerifier"},
		{"an unknown policy", up, route("captcha"), nil, "captcha"},
		{"conflicting patterns", up, []gateway.Route{{Match: "/a/{x}", Policy: "signature"}, {Match: "/a/{y}", Policy: "signature"}},
			[]gateway.Option{gateway.WithVerifier(&replay.Verifier{})}, "conflicts with routes[0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.New(tc.upstream, tc.routes, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestScopeIsTheCallersCredentials: two users behind one NAT (one client
// IP) who post the same body to a fingerprint route, or send the same key
// to an idempotency_key route, each get their own execution and never the
// other's response; a client whose IP changes between retries but whose
// credentials do not still gets its replay.
func TestScopeIsTheCallersCredentials(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	var ip atomic.Value
	ip.Store("203.0.113.1")
	gw := serve(t, a.url(t), `routes:
  - match: "POST /cart"
    policy: fingerprint
    window: 1m
  - match: "POST /orders"
    policy: idempotency_key
    required: true
`, gateway.WithKeeper(d.keeper), gateway.WithClientIP(func(*http.Request) string { return ip.Load().(string) }))
	type step struct {
		name       string
		path, ip   string
		header     []string
		wantReplay bool
		wantRuns   int
	}
	const body = `{"item":"book","qty":1}`
	steps := []step{
		{"alice adds to her cart", "/cart", "203.0.113.1", []string{"Cookie", "session=alice"}, false, 1},
		{"bob, behind the same NAT, adds the same", "/cart", "203.0.113.1", []string{"Cookie", "session=bob"}, false, 2},
		{"alice's double submit", "/cart", "203.0.113.1", []string{"Cookie", "session=alice"}, true, 2},
		{"carol orders with key k", "/orders", "203.0.113.1", []string{"Authorization", "Bearer carol", "Idempotency-Key", `"k"`}, false, 3},
		{"dave, behind the same NAT, uses key k too", "/orders", "203.0.113.1", []string{"Authorization", "Bearer dave", "Idempotency-Key", `"k"`}, false, 4},
		{"carol retries from her phone's new IP", "/orders", "198.51.100.9", []string{"Authorization", "Bearer carol", "Idempotency-Key", `"k"`}, true, 4},
	}
	replayed := map[string]string{} // first body each caller got
	for _, s := range steps {
		ip.Store(s.ip)
		status, h, got := do(t, newRequest(t, "POST", gw.URL+s.path, body, append([]string{"Content-Type", "application/json"}, s.header...)...))
		if status != http.StatusCreated || (h.Get("Idempotent-Replayed") == "true") != s.wantReplay || len(a.requests()) != s.wantRuns {
			t.Fatalf("%s: %d, replayed %q, %d runs; want 201, replayed %v, %d runs", s.name, status, h.Get("Idempotent-Replayed"), len(a.requests()), s.wantReplay, s.wantRuns)
		}
		caller := s.path + " " + strings.Join(s.header[:2], "=")
		if first, ok := replayed[caller]; ok && first != got {
			t.Fatalf("%s: got %s, want the caller's own first answer %s", s.name, got, first)
		}
		replayed[caller] = got
	}
}

// TestBodiesThatAreNotUnicodeAreRefused: the canonical form reads a lone
// surrogate escape and a byte that is not UTF-8 as U+FFFD, so
// {"a":"\ud800"} once replayed {"a":"\udbff"}'s answer (and raw 0xfe
// 0xff's) instead of running it or answering 422. Recorded routes refuse
// them with 400 invalid_request before the app runs.
func TestBodiesThatAreNotUnicodeAreRefused(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), `routes:
  - match: "POST /cart"
    policy: fingerprint
    window: 1m
  - match: "POST /orders"
    policy: idempotency_key
    required: true
`, gateway.WithKeeper(d.keeper))
	spellings := [][2]string{
		{`{"a":"\ud800"}`, `{"a":"\udbff"}`},
		{"{\"a\":\"\xff\"}", "{\"a\":\"\xfe\"}"},
	}
	for _, path := range []string{"/cart", "/orders"} {
		header := []string{"Content-Type", "application/json"}
		if path == "/orders" {
			header = append(header, "Idempotency-Key", `"k"`)
		}
		for _, pair := range spellings {
			for _, body := range pair {
				status, _, got := do(t, newRequest(t, "POST", gw.URL+path, body, header...))
				if status != http.StatusBadRequest || problemCode(got) != "invalid_request" {
					t.Errorf("POST %s %q = %d %s, want 400 invalid_request", path, body, status, got)
				}
			}
		}
	}
	if n := len(a.requests()); n != 0 {
		t.Fatalf("the app ran %d times, want 0", n)
	}
}

// TestClientBodyErrorsAreTheClients: a request body that cannot be read
// from the client while it streams to the app is the client's error, not
// the app's: a malformed chunked encoding is 400 invalid_request and a
// body over a limit set in front of the gateway 413 payload_too_large,
// on a pass-through path as on a route that reads the body first; only
// the app's own failures are 502 upstream_unavailable.
func TestClientBodyErrorsAreTheClients(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	routes, err := gateway.ParseRoutes([]byte("routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(a.url(t), routes, quiet, gateway.WithKeeper(d.keeper))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("limit") {
			r.Body = http.MaxBytesReader(w, r.Body, 4)
		}
		gw.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	chunked := func(path, body string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: shop.test\r\nIdempotency-Key: \"k-" + path + "\"\r\nTransfer-Encoding: chunked\r\n\r\n" + body
	}
	for _, tc := range []struct {
		name, request string
		status        int
		code, detail  string
	}{
		{"a chunk size that is not hex, passing through", chunked("/comments", "5\r\nhello\r\nzz\r\n\r\n"), http.StatusBadRequest, "invalid_request", "invalid byte in chunk length"},
		{"a chunk longer than its size, passing through", chunked("/comments", "5\r\nhelloXX\r\n0\r\n\r\n"), http.StatusBadRequest, "invalid_request", "malformed chunked encoding"},
		{"a chunk longer than its size, routed", chunked("/orders", "5\r\nhelloXX\r\n0\r\n\r\n"), http.StatusBadRequest, "invalid_request", "malformed chunked encoding"},
		{"a body over the limit, passing through", "POST /comments?limit HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 10\r\n\r\n0123456789", http.StatusRequestEntityTooLarge, "payload_too_large", "over 4 bytes"},
		{"a chunked body over the limit, passing through", chunked("/comments?limit", "a\r\n0123456789\r\n0\r\n\r\n"), http.StatusRequestEntityTooLarge, "payload_too_large", "over 4 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, h, body := sendRaw(t, addr, tc.request)
			var p problem.Problem
			_ = json.Unmarshal([]byte(body), &p)
			if status != tc.status || h.Get("Content-Type") != "application/problem+json" || p.Code != tc.code || !strings.Contains(p.Detail, tc.detail) {
				t.Fatalf("= %d %v %s, want %d %s with %q", status, h, body, tc.status, tc.code, tc.detail)
			}
		})
	}
}
