package gateway_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/problem"
)

// targetRoutes protect a path, a subtree and a host's path: the routes
// the spellings below tried to reach around their policy.
const targetRoutes = `routes:
  - match: "POST /checkout"
    policy: token
    purpose: checkout
  - match: "POST /admin/"
    policy: idempotency_key
    required: true
  - match: "POST shop.test/cart"
    policy: idempotency_key
    required: true
`

// sendRaw writes request to addr as it is, byte for byte, and returns
// the answer's status and body.
func sendRaw(t *testing.T, addr, request string) (int, http.Header, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
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

// rawRequestLine builds a request with target and host as given; an
// empty host sends no Host header.
func rawRequestLine(target, host, proto string) string {
	var b strings.Builder
	b.WriteString("POST " + target + " " + proto + "\r\n")
	if host != "" {
		b.WriteString("Host: " + host + "\r\n")
	}
	b.WriteString("Content-Length: 0\r\nConnection: close\r\n\r\n")
	return b.String()
}

// TestRefusedSpellings: spellings of a routed path or host that servers
// read in ways of their own (Tomcat, Jetty and Spring drop ;parameters
// and read ..; as .., some servers decode twice or read \ as /, nginx
// reads shop.test:80:80 as shop.test) are refused with 400
// invalid_request, routed or not, and never reach the app. Requests are
// written byte for byte, so each target and Host arrives as listed.
func TestRefusedSpellings(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), targetRoutes, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens))
	addr := strings.TrimPrefix(gw.URL, "http://")
	tests := []struct {
		name, target, host, proto string
		why                       string // in the problem's detail
	}{
		{"..; as a dot-dot segment", "/x/..;/checkout", "app.test", "HTTP/1.1", "semicolon"},
		{".; as a dot segment", "/.;/checkout", "app.test", "HTTP/1.1", "semicolon"},
		{"an empty segment with a parameter", "/;/checkout", "app.test", "HTTP/1.1", "semicolon"},
		{"a parameter on a subtree's segment", "/admin;/x", "app.test", "HTTP/1.1", "semicolon"},
		{"a parameter on the routed path", "/checkout;jsessionid=1", "app.test", "HTTP/1.1", "semicolon"},
		{"an encoded semicolon", "/x/..%3B/checkout", "app.test", "HTTP/1.1", "semicolon"},
		{"a semicolon on an unrouted path", "/static/a;b.css", "app.test", "HTTP/1.1", "semicolon"},
		{"a raw backslash", `/x/..\checkout`, "app.test", "HTTP/1.1", "backslash"},
		{"an encoded backslash", "/x/..%5Ccheckout", "app.test", "HTTP/1.1", "backslash"},
		{"an encoded backslash in lower case", "/x/..%5ccheckout", "app.test", "HTTP/1.1", "backslash"},
		{"double-encoded dots", "/x/%252e%252e/checkout", "app.test", "HTTP/1.1", "percent-encoded"},
		{"double-encoded dots in capitals", "/x/%252E%252E/checkout", "app.test", "HTTP/1.1", "percent-encoded"},
		{"a double-encoded slash", "/x%252F..%252Fcheckout", "app.test", "HTTP/1.1", "percent-encoded"},
		{"a double-encoded slash in lower case", "/admin%252fx", "app.test", "HTTP/1.1", "percent-encoded"},
		{"a double-encoded backslash", "/x/..%255Ccheckout", "app.test", "HTTP/1.1", "percent-encoded"},
		{"a double-encoded semicolon", "/x/..%253B/checkout", "app.test", "HTTP/1.1", "percent-encoded"},
		{"an encoded NUL", "/checkout%00.html", "app.test", "HTTP/1.1", "control character"},
		{"an encoded newline", "/checkout%0A", "app.test", "HTTP/1.1", "control character"},
		{"an absolute-form target with a parameter", "http://app.test/x/..;/checkout", "app.test", "HTTP/1.1", "semicolon"},
		{"an overlong slash", "/admin%c0%afx", "app.test", "HTTP/1.1", "not UTF-8"},
		{"an overlong slash in capitals", "/admin%C0%AFx", "app.test", "HTTP/1.1", "not UTF-8"},
		{"a three-byte overlong slash", "/admin%e0%80%afx", "app.test", "HTTP/1.1", "not UTF-8"},
		{"an overlong dot-dot segment", "/x/%c0%ae%c0%ae/checkout", "app.test", "HTTP/1.1", "not UTF-8"},
		{"a double-encoded overlong slash", "/admin%25c0%25afx", "app.test", "HTTP/1.1", "not UTF-8"},
		{"a Latin-1 path, not routed", "/caf%E9", "app.test", "HTTP/1.1", "not UTF-8"},
		{"a raw byte that is not UTF-8", "/admin\xc0\xafx", "app.test", "HTTP/1.1", "not UTF-8"},
		{"three dots", "/.../checkout", "app.test", "HTTP/1.1", "only dots and spaces"},
		{"a dot-dot and a space", "/x/..%20/checkout", "app.test", "HTTP/1.1", "only dots and spaces"},
		{"a fullwidth backslash", "/x/..%EF%BC%BCcheckout", "app.test", "HTTP/1.1", "backslash"},
		{"a triple-encoded backslash", "/x/..%25255Ccheckout", "app.test", "HTTP/1.1", "backslash"},
		{"a fullwidth semicolon", "/x/..%EF%BC%9B/checkout", "app.test", "HTTP/1.1", "semicolon"},
		{"a double-encoded NUL", "/checkout%2500", "app.test", "HTTP/1.1", "control character"},
		{"a host in brackets", "/cart", "[shop.test]", "HTTP/1.1", "malformed Host header"},
		{"a host with a comma", "/cart", "shop.test,evil", "HTTP/1.1", "malformed Host header"},
		{"a host with two ports", "/cart", "shop.test:80:80", "HTTP/1.1", "malformed Host header"},
		{"a host with a leading dot", "/cart", ".shop.test", "HTTP/1.1", "malformed Host header"},
		{"a host with an empty label", "/cart", "shop..test", "HTTP/1.1", "malformed Host header"},
		{"a host with two trailing dots", "/cart", "shop.test..", "HTTP/1.1", "malformed Host header"},
		{"a host with an empty port", "/cart", "shop.test:", "HTTP/1.1", "malformed Host header"},
		{"a host with a port over 65535", "/cart", "shop.test:65536", "HTTP/1.1", "malformed Host header"},
		{"a host with a port of letters", "/cart", "shop.test:http", "HTTP/1.1", "malformed Host header"},
		{"a host with a percent-encoded dot", "/cart", "shop%2Etest", "HTTP/1.1", "malformed Host header"},
		{"an IPv6 literal without brackets", "/cart", "::1", "HTTP/1.1", "malformed Host header"},
		{"brackets around an IPv4 address", "/cart", "[127.0.0.1]", "HTTP/1.1", "malformed Host header"},
		{"an IPv6 literal with a zone", "/cart", "[fe80::1%25eth0]", "HTTP/1.1", "malformed Host header"},
		{"text after the brackets", "/cart", "[::1]x", "HTTP/1.1", "malformed Host header"},
		{"HTTP/1.0 without a Host, when a route has a host", "/cart", "", "HTTP/1.0", "a Host header is required"},
		{"an empty Host, when a route has a host", "/cart", " ", "HTTP/1.1", "a Host header is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(a.requests())
			status, h, body := sendRaw(t, addr, rawRequestLine(tc.target, tc.host, tc.proto))
			var p problem.Problem
			if err := json.Unmarshal([]byte(body), &p); err != nil || status != http.StatusBadRequest ||
				p.Code != "invalid_request" || !strings.Contains(p.Detail, tc.why) {
				t.Fatalf("= %d %s, want 400 invalid_request saying %q", status, body, tc.why)
			}
			if ct := h.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("Content-Type = %q", ct)
			}
			if got := a.requests()[before:]; len(got) != 0 {
				t.Fatalf("the app ran: %+v", got)
			}
		})
	}
}

// TestAcceptedSpellings: what real clients send still passes: host names
// in any case, with a trailing dot and a port, IP literals, and paths
// with percent-encoded characters other than the refused ones.
func TestAcceptedSpellings(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), targetRoutes, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens))
	addr := strings.TrimPrefix(gw.URL, "http://")
	tests := []struct {
		name, target, host, proto string
		status                    int
		code                      string // problem code, when the route's policy refuses
	}{
		{"the routed host", "/cart", "shop.test", "HTTP/1.1", 400, "idempotency_key_missing"},
		{"the routed host in capitals, with a trailing dot and a port", "/cart", "SHOP.TEST.:8080", "HTTP/1.1", 400, "idempotency_key_missing"},
		{"another host", "/cart", "app.test", "HTTP/1.1", 201, ""},
		{"a host with a hyphen and an underscore", "/cart", "my-app_1.internal", "HTTP/1.1", 201, ""},
		{"an IPv4 address and a port", "/cart", "127.0.0.1:8080", "HTTP/1.1", 201, ""},
		{"an IPv6 literal", "/cart", "[::1]", "HTTP/1.1", 201, ""},
		{"an IPv6 literal and a port", "/cart", "[2001:db8::1]:443", "HTTP/1.1", 201, ""},
		{"an absolute-form target to the routed host", "http://shop.test/cart", "app.test", "HTTP/1.1", 400, "idempotency_key_missing"},
		{"an encoded percent", "/discount/100%25", "app.test", "HTTP/1.1", 201, ""},
		{"an encoded percent before other hex", "/x/%2541", "app.test", "HTTP/1.1", 201, ""},
		{"an encoded space", "/a%20b", "app.test", "HTTP/1.1", 201, ""},
		{"a semicolon in the query", "/search?a=1;b=2", "app.test", "HTTP/1.1", 201, ""},
		{"a backslash in the query", "/search?q=a%5Cb", "app.test", "HTTP/1.1", 201, ""},
		{"letters of other scripts", "/caf%C3%A9/%E6%97%A5%E6%9C%AC", "app.test", "HTTP/1.1", 201, ""},
		{"a file with a suffix", "/static/app.min.js", "app.test", "HTTP/1.1", 201, ""},
		{"a leading dot", "/.well-known/security.txt", "app.test", "HTTP/1.1", 201, ""},
		{"a space inside a segment", "/files/my%20file.pdf", "app.test", "HTTP/1.1", 201, ""},
		{"a percent-encoded path in capitals", "/Files/%E6%97%A5", "app.test", "HTTP/1.1", 201, ""},
		{"invalid UTF-8 in the query", "/search?q=%c0%af", "app.test", "HTTP/1.1", 201, ""},
		{"an absolute-form target without a path", "http://app.test", "app.test", "HTTP/1.1", 201, ""},
		{"an absolute-form target to a spelling of a route", "http://app.test/ADMIN./x", "app.test", "HTTP/1.1", 400, "idempotency_key_missing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(a.requests())
			status, _, body := sendRaw(t, addr, rawRequestLine(tc.target, tc.host, tc.proto))
			if status != tc.status || problemCode(body) != tc.code {
				t.Fatalf("= %d %s, want %d %q", status, body, tc.status, tc.code)
			}
			got := a.requests()[before:]
			if reached := len(got) > 0; reached != (tc.status == 201) {
				t.Fatalf("reached the app: %v", reached)
			}
		})
	}
}

// TestHostlessRequestsWithoutHostRoutes: without a host pattern the Host
// decides nothing, so an HTTP/1.0 request without one is routed by its
// path as any other.
func TestHostlessRequestsWithoutHostRoutes(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), `routes:
  - {match: "POST /orders", policy: idempotency_key, required: true}
`, gateway.WithKeeper(d.keeper))
	addr := strings.TrimPrefix(gw.URL, "http://")
	for _, tc := range []struct {
		name, target string
		status       int
		code         string
	}{
		{"routed", "/orders", 400, "idempotency_key_missing"},
		{"unrouted", "/comments", 201, ""},
		{"still refused for a semicolon", "/x/..;/orders", 400, "invalid_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := sendRaw(t, addr, rawRequestLine(tc.target, "", "HTTP/1.0"))
			if status != tc.status || problemCode(body) != tc.code {
				t.Fatalf("= %d %s, want %d %q", status, body, tc.status, tc.code)
			}
		})
	}
}
