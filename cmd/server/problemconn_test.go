package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/problem"
)

// exchange writes raw requests to addr on one connection, byte for byte,
// and reads an answer after each.
func exchange(t *testing.T, addr string, raws ...string) []*http.Response {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var resps []*http.Response
	for _, raw := range raws {
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("reading the answer to %q: %v", raw[:min(len(raw), 60)], err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resps = append(resps, resp)
	}
	return resps
}

// wantProblemAnswer checks that resp is a whole problem+json answer with
// status and code, whose detail contains detail.
func wantProblemAnswer(t *testing.T, resp *http.Response, status int, code, detail string) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	h := resp.Header
	if resp.StatusCode != status || h.Get("Content-Type") != "application/problem+json" ||
		h.Get("Cache-Control") != "no-store" || !resp.Close || h.Get("Content-Length") != strconv.Itoa(len(body)) {
		t.Fatalf("= %d %v %q, want a %d problem+json answer that closes the connection", resp.StatusCode, h, body, status)
	}
	var p problem.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if p.Code != code || p.Status != status || p.Type != problem.TypePrefix+code || p.Title == "" || !strings.Contains(p.Detail, detail) {
		t.Fatalf("problem = %+v, want %d %s with detail %q", p, status, code, detail)
	}
	if p.RequestID != "" {
		t.Fatalf("problem = %+v: a handler answered (it has a request ID), not net/http", p)
	}
}

// TestNetHTTPErrorsAreProblems: requests net/http refuses before any
// handler runs get problem+json from the server, over real TCP: the
// answers of the running binary (run wires the listener), on a fresh
// connection and after an answered request on a kept-alive one.
func TestNetHTTPErrorsAreProblems(t *testing.T) {
	_, addr, _ := server(t)
	get := func(headers string) string {
		return "GET /v1/tokens HTTP/1.1\r\nHost: rg.test\r\n" + headers + "\r\n"
	}
	tests := []struct {
		name, raw    string
		status       int
		code, detail string
	}{
		{"headers over 16 KiB", get("Cookie: " + strings.Repeat("a", 32<<10) + "\r\n"), 431, "headers_too_large", "16 KiB"},
		{"a control character in Idempotency-Key", "POST /v1/tokens/redeem HTTP/1.1\r\nHost: rg.test\r\nIdempotency-Key: \"a\x01b\"\r\nContent-Length: 0\r\n\r\n", 400, "invalid_request", "malformed"},
		{"a NUL in Idempotency-Key", "POST /v1/tokens/redeem HTTP/1.1\r\nHost: rg.test\r\nIdempotency-Key: \"a\x00b\"\r\nContent-Length: 0\r\n\r\n", 400, "invalid_request", "malformed"},
		{"random bytes in Idempotency-Key", "POST /v1/tokens/redeem HTTP/1.1\r\nHost: rg.test\r\nIdempotency-Key: \x9c\x07\xfe\x1b\x7f\r\nContent-Length: 0\r\n\r\n", 400, "invalid_request", "malformed"},
		{"a control character in Idempotency-Token", "POST /v1/tokens/redeem HTTP/1.1\r\nHost: rg.test\r\nIdempotency-Token: eyJ\x1bhbGc\r\nContent-Length: 0\r\n\r\n", 400, "invalid_request", "malformed"},
		{"a NUL in Idempotency-Token", "POST /v1/tokens/redeem HTTP/1.1\r\nHost: rg.test\r\nIdempotency-Token: eyJ\x00\r\nContent-Length: 0\r\n\r\n", 400, "invalid_request", "malformed"},
		{"a control character in a preflight's Origin", "OPTIONS /v1/tokens HTTP/1.1\r\nHost: rg.test\r\nOrigin: https://shop\x08.test\r\nAccess-Control-Request-Method: POST\r\n\r\n", 400, "invalid_request", "malformed"},
		{"a garbage request line", "GARBAGE\r\n\r\n", 400, "invalid_request", "malformed"},
		{"a request line with a space in the target", "GET /a b HTTP/1.1\r\nHost: rg.test\r\n\r\n", 400, "invalid_request", "malformed"},
		{"an HTTP/1.1 request without Host", "GET /healthz HTTP/1.1\r\n\r\n", 400, "invalid_request", "missing required Host header"},
		{"a malformed Host", "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "invalid_request", "malformed Host header"},
		{"two Host headers", "GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "invalid_request", "malformed"},
		{"a header name with a space", get("Bad Name: x\r\n"), 400, "invalid_request", "invalid header name"},
		{"a transfer coding other than chunked", "POST /v1/tokens HTTP/1.1\r\nHost: rg.test\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "unsupported_transfer_encoding", "chunked"},
		{"HTTP/2.0 in a request line", "GET / HTTP/2.0\r\nHost: rg.test\r\n\r\n", 505, "http_version_not_supported", "HTTP/1.1"},
		{"the HTTP/2 connection preface", h2Preface, 505, "http_version_not_supported", "HTTP/1.1"},
		{"PRI * HTTP/2.0 without the rest of the preface", "PRI * HTTP/2.0\r\n\r\n", 505, "http_version_not_supported", "HTTP/1.1"},
		{"PRI * HTTP/2.0 with a Host", "PRI * HTTP/2.0\r\nHost: rg.test\r\n\r\n", 505, "http_version_not_supported", "HTTP/1.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantProblemAnswer(t, exchange(t, addr, tc.raw)[0], tc.status, tc.code, tc.detail)
		})
		t.Run(tc.name+", after an answered request on the same connection", func(t *testing.T) {
			resps := exchange(t, addr, get(""), tc.raw)
			if resps[0].StatusCode != http.StatusMethodNotAllowed || resps[0].Close {
				t.Fatalf("first answer = %d (close %v), want 405 on a kept-alive connection", resps[0].StatusCode, resps[0].Close)
			}
			wantProblemAnswer(t, resps[1], tc.status, tc.code, tc.detail)
		})
	}
}

// head returns a GET of path whose head (request line, header fields and
// the empty line that ends them, CRLFs included) is exactly n bytes, padded
// with an X-Pad header.
func head(path string, n int) string {
	start := "GET " + path + " HTTP/1.1\r\nHost: rg.test\r\nX-Pad: "
	const end = "\r\n\r\n"
	return start + strings.Repeat("p", n-len(start)-len(end)) + end
}

// TestHeadLimit: a request's head may take 16 KiB (16,384 bytes), counted
// as the README counts it: from the request line's first byte through
// the empty line that ends the header fields, CRLFs included. One byte
// more is 431 problem+json (net/http alone allows 4 KiB more), on a fresh
// connection and on a kept-alive one.
func TestHeadLimit(t *testing.T) {
	_, addr, _ := server(t)
	for _, tc := range []struct {
		name   string
		n      int
		status int
	}{
		{"15,000 bytes are served", 15000, http.StatusOK},
		{"16,384 bytes, the limit, are served", 16384, http.StatusOK},
		{"16,385 bytes are 431", 16385, http.StatusRequestHeaderFieldsTooLarge},
		{"17,000 bytes are 431", 17000, http.StatusRequestHeaderFieldsTooLarge},
	} {
		raw := head("/healthz", tc.n)
		if len(raw) != tc.n {
			t.Fatalf("head is %d bytes, want %d", len(raw), tc.n)
		}
		check := func(t *testing.T, resp *http.Response) {
			t.Helper()
			if tc.status == http.StatusOK {
				if body, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
					t.Fatalf("= %d %s, want 200", resp.StatusCode, body)
				}
				return
			}
			wantProblemAnswer(t, resp, tc.status, "headers_too_large", "16 KiB")
		}
		t.Run(tc.name, func(t *testing.T) { check(t, exchange(t, addr, raw)[0]) })
		t.Run(tc.name+", after an answered request on the same connection", func(t *testing.T) {
			resps := exchange(t, addr, "GET /healthz HTTP/1.1\r\nHost: rg.test\r\n\r\n", raw)
			if resps[0].StatusCode != http.StatusOK || resps[0].Close {
				t.Fatalf("first answer = %d (close %v), want 200 on a kept-alive connection", resps[0].StatusCode, resps[0].Close)
			}
			check(t, resps[1])
		})
	}
	// A pipelined request is read in part with the one before it, which
	// neither count sees: it is served up to the limit, never refused
	// below it.
	t.Run("a pipelined head of 16,384 bytes is served", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		first := "POST /healthz HTTP/1.1\r\nHost: rg.test\r\nContent-Length: 8\r\n\r\n\r\n\r\n\r\n\r\n"
		if _, err := io.WriteString(c, first+head("/healthz", maxHeadBytes)); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		for i, want := range []int{http.StatusMethodNotAllowed, http.StatusOK} {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != want {
				t.Fatalf("answer %d = %d %s, want %d", i, resp.StatusCode, body, want)
			}
		}
	})
}

// TestHeadScan: a head is measured the same however its bytes are split
// across reads, with CRLF or bare LF line ends, and without the empty
// lines net/http skips before a request line.
func TestHeadScan(t *testing.T) {
	tests := []struct {
		name string
		// before (not counted), head, after (not counted); no end when
		// after is "".
		before, head, after string
		line1               int
	}{
		{"CRLF", "", "GET /a HTTP/1.1\r\nHost: a\r\n\r\n", "body", 15},
		{"bare LF", "", "GET /a HTTP/1.1\nHost: a\n\n", "body", 15},
		{"no header fields", "", "GET /a HTTP/1.0\r\n\r\n", "x", 15},
		{"empty lines before the request line", "\r\n\r\n", "GET /a HTTP/1.1\r\nHost: a\r\n\r\n", "x", 15},
		{"a CR inside a line", "", "GET /a HTTP/1.1\r\nX: a\rb\r\n\r\n", "x", 15},
		{"a body of empty lines", "", "POST /a HTTP/1.1\r\nContent-Length: 6\r\n\r\n", "\r\n\r\nxy", 16},
		{"unfinished", "", "GET /a HTTP/1.1\r\nHost: a\r\n", "", 0},
	}
	for _, tc := range tests {
		raw := tc.before + tc.head + tc.after
		splits := [][]string{{raw}}
		for i := 1; i < len(raw); i++ {
			splits = append(splits, []string{raw[:i], raw[i:]})
		}
		var bytewise []string
		for i := range len(raw) {
			bytewise = append(bytewise, raw[i:i+1])
		}
		splits = append(splits, bytewise)
		t.Run(tc.name, func(t *testing.T) {
			for _, chunks := range splits {
				var h headScan
				ended := false
				for _, c := range chunks {
					if !h.done && h.scan([]byte(c)) {
						ended = true
					}
				}
				if want := tc.after != ""; ended != want || ended && (h.n != len(tc.head) || h.line1 != tc.line1) {
					t.Fatalf("%q: ended %v, n %d, request line %d; want %v, %d, %d", chunks, ended, h.n, h.line1, want, len(tc.head), tc.line1)
				}
			}
		})
	}
	t.Run("it stops past any head net/http reads", func(t *testing.T) {
		var h headScan
		if h.scan([]byte("GET / HTTP/1.1\r\nX: "+strings.Repeat("a", maxScanBytes))) || !h.done {
			t.Fatalf("ended or still scanning: %+v", h)
		}
	})
}

// h2Preface is the HTTP/2 connection preface (RFC 9113, section 3.4).
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// TestHTTP2LinesAreNeverForwarded: in gateway mode no HTTP/2 request line
// reaches the app, PRI * HTTP/2.0 included (which net/http hands to the
// handler, for servers that take HTTP/2 over from there): each is 505
// problem+json, while an HTTP/1.1 request on an unrouted path passes.
func TestHTTP2LinesAreNeverForwarded(t *testing.T) {
	var reached atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, "app")
	}))
	t.Cleanup(app.Close)
	addr := strings.TrimPrefix(startGateway(t, "REPLAYGUARD_UPSTREAM="+app.URL), "http://")
	for _, raw := range []string{
		h2Preface,
		"PRI * HTTP/2.0\r\n\r\n",
		"PRI * HTTP/2.0\r\nHost: rg.test\r\n\r\n",
		"GET /page HTTP/2.0\r\nHost: rg.test\r\n\r\n",
	} {
		wantProblemAnswer(t, exchange(t, addr, raw)[0], http.StatusHTTPVersionNotSupported, "http_version_not_supported", "HTTP/1.1")
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the app got %d HTTP/2 requests", n)
	}
	if resp := exchange(t, addr, "GET /page HTTP/1.1\r\nHost: rg.test\r\n\r\n")[0]; resp.StatusCode != http.StatusOK || reached.Load() != 1 {
		t.Fatalf("an HTTP/1.1 request = %d, reached the app %d times; want 200, once", resp.StatusCode, reached.Load())
	}
}

// errorSpelling is net/http's own 400 answer, byte for byte.
const errorSpelling = "HTTP/1.1 400 Bad Request" + errorHeaders + "400 Bad Request"

// TestResponsesAreUntouched: only net/http's own error answers change; a
// handler's response passes byte for byte, even one whose body is
// written out on its own and spells such an answer exactly (an app's
// body through the gateway could), and one sent with ReadFrom.
func TestResponsesAreUntouched(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/spelled":
			w.Header().Set("Content-Length", strconv.Itoa(len(errorSpelling)))
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush() // the headers, written alone
			_, _ = io.WriteString(w, errorSpelling)
			w.(http.Flusher).Flush() // the body, written alone
		case "/readfrom":
			_, _ = w.(io.ReaderFrom).ReadFrom(strings.NewReader(strings.Repeat("x", 4096)))
		default:
			http.Error(w, "teapot", http.StatusTeapot)
		}
	})
	srv := newServer(h, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(problemListener{ln}) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := ln.Addr().String()

	resps := exchange(t, addr,
		"GET /spelled HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /readfrom HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /teapot HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /spelled HTTP/1.1\r\nHost: a\r\n\r\n")
	for i, want := range []struct {
		status int
		body   string
	}{
		{200, errorSpelling},
		{200, strings.Repeat("x", 4096)},
		{418, "teapot\n"},
		{200, errorSpelling},
	} {
		body, _ := io.ReadAll(resps[i].Body)
		if resps[i].StatusCode != want.status || string(body) != want.body {
			t.Errorf("answer %d = %d %q, want %d %q", i, resps[i].StatusCode, body, want.status, want.body)
		}
	}
	// The same connection still turns net/http's own answer into a
	// problem.
	c := exchange(t, addr, "GET /teapot HTTP/1.1\r\nHost: a\r\n\r\n", "GARBAGE\r\n\r\n")
	wantProblemAnswer(t, c[1], 400, "invalid_request", "malformed")
}

// TestProblemAnswer: exactly net/http's error answers are rewritten.
func TestProblemAnswer(t *testing.T) {
	tests := []struct {
		name, write string
		status      int // 0: left as it is
		code        string
	}{
		{"431", "HTTP/1.1 431 Request Header Fields Too Large" + errorHeaders + "431 Request Header Fields Too Large", 431, "headers_too_large"},
		{"400", errorSpelling, 400, "invalid_request"},
		{"400 with a reason", "HTTP/1.1 400 Bad Request: invalid header value" + errorHeaders + "400 Bad Request: invalid header value", 400, "invalid_request"},
		{"501", "HTTP/1.1 501 Not Implemented" + errorHeaders + "Unsupported transfer encoding", 501, "unsupported_transfer_encoding"},
		{"505", "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version" + errorHeaders + "505 HTTP Version Not Supported: unsupported protocol version", 505, "http_version_not_supported"},
		{"a handler's 400", "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Mon, 02 Jan 2006 15:04:05 GMT\r\nContent-Length: 15\r\n\r\n400 Bad Request", 0, ""},
		{"a 200", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 0, ""},
		{"a body that differs from the status", "HTTP/1.1 400 Bad Request" + errorHeaders + "something else", 0, ""},
		{"a reason without its status text", "HTTP/1.1 400 Nope: x" + errorHeaders + "400 Nope: x", 0, ""},
		{"a statusError of another code", "HTTP/1.1 418 I'm a teapot: x" + errorHeaders + "418 I'm a teapot: x", 0, ""},
		{"HTTP/1.0", "HTTP/1.0 400 Bad Request" + errorHeaders + "400 Bad Request", 0, ""},
		{"too long to be net/http's", "HTTP/1.1 400 Bad Request: " + strings.Repeat("x", 600) + errorHeaders + "400 Bad Request: " + strings.Repeat("x", 600), 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			answer := problemAnswer([]byte(tc.write))
			if tc.status == 0 {
				if answer != nil {
					t.Fatalf("rewritten into %q", answer)
				}
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(answer)), nil)
			if err != nil {
				t.Fatalf("%q: %v", answer, err)
			}
			wantProblemAnswer(t, resp, tc.status, tc.code, "")
		})
	}
}

// countConn is a connection that only counts what is written to it.
type countConn struct {
	net.Conn
	n int
}

func (c *countConn) Write(p []byte) (int, error) { c.n += len(p); return len(p), nil }

// BenchmarkProblemConn: what a response's writes cost through a
// problemConn (a check of the first write of each response), against
// the bare connection. Both allocate nothing.
func BenchmarkProblemConn(b *testing.B) {
	head := []byte("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nDate: Mon, 02 Jan 2006 15:04:05 GMT\r\nContent-Length: 64\r\n\r\n")
	body := bytes.Repeat([]byte("x"), 64)
	b.Run("bare", func(b *testing.B) {
		var c net.Conn = &countConn{}
		b.ReportAllocs()
		for b.Loop() {
			_, _ = c.Write(head)
			_, _ = c.Write(body)
		}
	})
	b.Run("problemConn", func(b *testing.B) {
		c := &problemConn{Conn: &countConn{}}
		b.ReportAllocs()
		for b.Loop() {
			_, _ = c.Write(head)
			_, _ = c.Write(body)
			problemConnState(c, http.StateIdle)
		}
	})
}

// BenchmarkServe: a kept-alive client's requests to a small handler,
// served on a bare listener and on a problemListener with the server's
// timeouts, and on a bare listener without them: what the problemConn
// and net/http's deadlines cost (cpu-ns/op, client and server). On the
// 2-core VM the three are within a few percent of each other, inside the
// scatter of runs (issue 13: net/http sets eight deadlines a request,
// which the profile prices at about 3% of the server's CPU).
func BenchmarkServe(b *testing.B) {
	for _, tc := range []struct {
		name       string
		wrap       func(net.Listener) net.Listener
		noTimeouts bool
	}{
		{"bare", func(l net.Listener) net.Listener { return l }, false},
		{"problemListener", func(l net.Listener) net.Listener { return problemListener{l} }, false},
		{"bare without timeouts", func(l net.Listener) net.Listener { return l }, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := newServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"status":"redeemed"}`)
			}), 0)
			if tc.noTimeouts {
				srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout = 0, 0, 0, 0
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = srv.Serve(tc.wrap(ln)) }()
			defer srv.Close()
			req := []byte("GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
			b.SetParallelism(8) // 16 kept-alive connections on 2 CPUs, as under load
			b.ReportAllocs()
			cpu0 := processCPU(b)
			b.RunParallel(func(pb *testing.PB) {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Error(err)
					return
				}
				defer c.Close()
				br := bufio.NewReader(c)
				for pb.Next() {
					if _, err := c.Write(req); err != nil {
						b.Error(err)
						return
					}
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			})
			// CPU (client and server, in this process) per request: the
			// variants differ only in the server.
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU returns the CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
