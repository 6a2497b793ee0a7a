// Package spelling puts real apps behind the gateway, Express with its
// default options and a Node.js app whose router reads paths as
// leniently as frameworks and servers do (lenient.mjs), and sends the
// spellings of protected paths that they map onto their protected
// handlers (issue 20): none may reach one without the route's policy.
//
// Express comes from this directory's package-lock.json (npm ci, as
// .ci/run does); without node or node_modules the tests skip, unless
// REPLAYGUARD_TEST_REQUIRE=1 or CI=true.
package spelling

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// routes are the issue's: POST /orders needs an Idempotency-Key, and
// everything under /admin/ a token.
const routes = `routes:
  - match: "POST /orders"
    policy: idempotency_key
    required: true
  - match: "/admin/"
    policy: token
    purpose: admin
`

// What the gateway answers a spelling sent without a key or a token.
const (
	key     = "key"     // routed to POST /orders: 400 idempotency_key_missing
	tok     = "token"   // routed to /admin/: 400 invalid_request, no token
	refused = "refused" // refused before routing: 400 invalid_request
)

// spelling is a POST whose target the apps read as a protected path.
type spelling struct {
	target  string
	handler string // the protected handler lenient.mjs runs for it
	express bool   // Express runs that handler too
	gateway string // key, tok or refused
}

// spellings are the issue's, then others an attacker would try: double
// encoding, backslashes, ;parameters, escapes in either case, Unicode
// lookalikes. Each is sent byte for byte.
var spellings = []spelling{
	{"/ORDERS", "orders", true, key},
	{"/orders/", "orders", true, key},
	{"/orders.json", "orders", false, key},
	{"/Admin/x", "admin", true, tok},
	{"/admin./x", "admin", false, tok},
	{"/admin%2e/x", "admin", false, tok},
	{"/admin%20/x", "admin", false, tok},
	{"/orders%20", "orders", false, key},
	{"/orders%2f", "orders", false, key},
	{"/admin%c0%afx", "admin", false, refused},
	{"/%EF%BC%8Fadmin/x", "admin", false, tok},

	{"/ORDERS/", "orders", true, key},
	{"/Orders.JSON", "orders", false, key},
	{"/orders.json/", "orders", false, key},
	{"/orders.tar.gz", "orders", false, key},
	{"/ORDERS%2F", "orders", false, key},
	{"/orders%2E", "orders", false, key},
	{"/ADMIN", "admin", true, tok},
	{"/x/../Orders", "orders", false, key},
	{"//ORDERS", "orders", false, key},
	{"/%4Frders", "orders", false, key},
	{"/%256Frders", "orders", false, key},
	{"/orders%252ejson", "orders", false, refused},
	{"/x/%252e%252e/orders", "orders", false, refused},
	{"/orders%3Fx=1", "orders", false, key},
	{"/orders%23x", "orders", false, key},
	{`/admin\x`, "admin", false, refused},
	{"/admin%5cx", "admin", false, refused},
	{"/admin%5Cx", "admin", false, refused},
	{"/admin;x=1/y", "admin", false, refused},
	{"/x/..;/admin/y", "admin", false, refused},
	{"/.../orders", "orders", false, refused},
	{"/admin%e0%80%afx", "admin", false, refused},
	{"/admin%C0%AFx", "admin", false, refused},
	{"/%EF%BC%AF%EF%BC%B2%EF%BC%A4%EF%BC%A5%EF%BC%B2%EF%BC%B3", "orders", false, key}, // ＯＲＤＥＲＳ
	{"/order%C5%BF", "orders", false, key},                                            // ſ (long s)
	{"/admin%EF%BC%8Fx", "admin", false, tok},                                         // ／ inside
	{"/admin%EF%BC%BCx", "admin", false, refused},                                     // ＼
	{"/x/%E2%80%A5/orders", "orders", false, key},                                     // ‥, NFKC ..
	{"/orders%E2%80%A4", "orders", false, key},                                        // ․, NFKC .
	{"/orders%EF%BC%8Ejson", "orders", false, key},                                    // ．json
	{"/admin%E3%80%80/x", "admin", false, tok},                                        // ideographic space
	{"/admin%C2%A0/x", "admin", false, tok},                                           // no-break space
}

// passing are paths the apps do not protect: they pass the gateway.
var passing = []string{"/comments", "/orders/7", "/orders7.json", "/static/app.min.js", "/caf%C3%A9"}

// apps are the Node.js apps, by script.
var apps = []struct {
	name, script string
	maps         func(spelling) bool // the spellings the app, asked directly, serves as protected
}{
	{"express", "express.mjs", func(s spelling) bool { return s.express }},
	{"lenient", "lenient.mjs", func(spelling) bool { return true }},
}

// TestSpellingsThroughTheGateway: each app, asked directly, serves the
// spellings it maps from its protected handlers; behind the gateway, no
// spelling reaches one without a key or a token: each is routed to its
// route's policy, which refuses it, or refused as a spelling the gateway
// does not guess at. Paths the apps do not protect still pass.
func TestSpellingsThroughTheGateway(t *testing.T) {
	node := nodeAndExpress(t)
	for _, app := range apps {
		t.Run(app.name, func(t *testing.T) {
			appAddr := startApp(t, node, app.script)
			t.Run("straight to the app", func(t *testing.T) {
				for _, s := range spellings {
					if !app.maps(s) {
						continue
					}
					if a := post(t, appAddr, s.target); a.handler() != s.handler {
						t.Errorf("%s: the app answered %d from handler %q, want its %s handler", s.target, a.StatusCode, a.handler(), s.handler)
					}
				}
			})
			gw := startGateway(t, appAddr)
			for _, s := range spellings {
				t.Run("through the gateway "+s.target, func(t *testing.T) {
					a := post(t, gw.addr, s.target)
					if h := a.handler(); h == "orders" || h == "admin" {
						t.Fatalf("the app's %s handler ran without its policy", h)
					}
					a.isRefusal(t, s.gateway)
				})
			}
			for _, p := range passing {
				t.Run("passes "+p, func(t *testing.T) {
					if a := post(t, gw.addr, p); a.StatusCode != http.StatusNotFound || a.handler() != "none" {
						t.Fatalf("= %d from handler %q %s, want the app's 404", a.StatusCode, a.handler(), a.body)
					}
				})
			}
		})
	}
}

// TestSpellingsGetTheirRoutesPolicy: behind the gateway, a spelling with
// what its route's policy asks for reaches the protected handler, once:
// the retry of a key, or of a token, gets the first answer replayed.
func TestSpellingsGetTheirRoutesPolicy(t *testing.T) {
	node := nodeAndExpress(t)
	for _, app := range apps {
		t.Run(app.name, func(t *testing.T) {
			gw := startGateway(t, startApp(t, node, app.script))
			target := "/ORDERS/"
			if app.name == "lenient" {
				target = "/Orders.json"
			}
			first := post(t, gw.addr, target, "Idempotency-Key: k-"+app.name)
			again := post(t, gw.addr, target, "Idempotency-Key: k-"+app.name)
			if first.StatusCode != http.StatusCreated || first.handler() != "orders" || first.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("first %s = %d from %q, want the orders handler", target, first.StatusCode, first.handler())
			}
			if again.StatusCode != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || again.Header.Get("X-App-Runs") != first.Header.Get("X-App-Runs") {
				t.Fatalf("retry %s = %d replayed=%q runs %q, want the first answer replayed", target, again.StatusCode, again.Header.Get("Idempotent-Replayed"), again.Header.Get("X-App-Runs"))
			}
			is, err := gw.tokens.Issue(context.Background(), token.IssueRequest{Purpose: "admin"})
			if err != nil {
				t.Fatal(err)
			}
			first = post(t, gw.addr, "/Admin/x", "Idempotency-Token: "+is.Token)
			if first.StatusCode != http.StatusCreated || first.handler() != "admin" {
				t.Fatalf("/Admin/x with a token = %d from %q %s, want the admin handler", first.StatusCode, first.handler(), first.body)
			}
			again = post(t, gw.addr, "/Admin/x", "Idempotency-Token: "+is.Token)
			if again.Header.Get("Idempotent-Replayed") != "true" || again.Header.Get("X-App-Runs") != first.Header.Get("X-App-Runs") {
				t.Fatalf("/Admin/x with the used token = %d replayed=%q runs %q, want the first answer replayed", again.StatusCode, again.Header.Get("Idempotent-Replayed"), again.Header.Get("X-App-Runs"))
			}
		})
	}
}

// nodeAndExpress returns the node program, after checking that Express
// is installed here; without them it skips (or fails when required).
func nodeAndExpress(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join("node_modules", "express", "package.json"))
	}
	if err != nil {
		testenv.Missing(t, "the spelling tests need node and test/spelling/node_modules (run npm ci in test/spelling): "+err.Error())
	}
	return node
}

// startApp runs script with node until the test ends and returns its
// address.
func startApp(t *testing.T, node, script string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, node, script)
	var stderr testenv.LockedBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel() // kills the process, by its pid
		_ = cmd.Wait()
	})
	// The app prints its port once it listens, or exits.
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%s did not start: %v: %s", script, err, stderr.String())
	}
	return "127.0.0.1:" + strings.TrimSpace(line)
}

// gw is a gateway in front of an app.
type gw struct {
	addr   string
	tokens *token.Service
}

// startGateway runs a gateway with routes in front of the app at
// appAddr, on the memory store.
func startGateway(t *testing.T, appAddr string) gw {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	svc, err := token.New(st, []token.Key{{ID: "k1", Secret: bytes.Repeat([]byte("s"), token.MinKeyLen)}}, token.WithMachineID(20))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := gateway.ParseRoutes([]byte(routes))
	if err != nil {
		t.Fatal(err)
	}
	tr := gateway.NewTransport()
	t.Cleanup(tr.CloseIdleConnections)
	g, err := gateway.New(&url.URL{Scheme: "http", Host: appAddr}, rs,
		gateway.WithKeeper(idempotency.New(st)),
		gateway.WithTokens(svc),
		gateway.WithTransport(tr),
		gateway.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g)
	t.Cleanup(srv.Close)
	return gw{addr: strings.TrimPrefix(srv.URL, "http://"), tokens: svc}
}

// answer is a response with its body read.
type answer struct {
	*http.Response
	body []byte
}

// handler is the app handler that answered, or "" when the app did not.
func (a answer) handler() string { return a.Header.Get("X-App-Handler") }

// isRefusal checks that a is the gateway's 400 of kind want (key, tok or
// refused).
func (a answer) isRefusal(t *testing.T, want string) {
	t.Helper()
	var p problem.Problem
	if err := json.Unmarshal(a.body, &p); err != nil || a.StatusCode != http.StatusBadRequest || a.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("= %d %s, want the gateway's 400 problem", a.StatusCode, a.body)
	}
	got := refused
	switch {
	case p.Code == "idempotency_key_missing":
		got = key
	case p.Code == "invalid_request" && strings.HasPrefix(p.Detail, "no token"):
		got = tok
	case p.Code != "invalid_request":
		got = p.Code
	}
	if got != want {
		t.Fatalf("= %s (%s %q), want %s", got, p.Code, p.Detail, want)
	}
}

// post writes POST target to addr byte for byte, with extra header
// lines, and reads the answer.
func post(t *testing.T, addr, target string, header ...string) answer {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("POST " + target + " HTTP/1.1\r\nHost: app.test\r\n")
	for _, h := range header {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp, body}
}
