package nginx

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/token"
)

// appConf is nginx as the app behind the gateway: every request it
// serves is answered 201 with how nginx read it, its normalised path
// ($uri: decoded, dot segments resolved, slashes merged) in X-App-Path
// and the virtual host it chose in X-App-Host (shop.test has one of its
// own).
var appConf = template.Must(template.New("app.conf").Parse(`
daemon off;
master_process off;
worker_processes 1;
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/error.log info;

events {
	worker_connections 64;
}

http {
	access_log {{.Dir}}/access.log;
	client_body_temp_path {{.Dir}}/client_body;
	proxy_temp_path {{.Dir}}/proxy;
	fastcgi_temp_path {{.Dir}}/fastcgi;
	uwsgi_temp_path {{.Dir}}/uwsgi;
	scgi_temp_path {{.Dir}}/scgi;

	server {
		listen 127.0.0.1:{{.Port}} default_server;
		server_name _;
		location / {
			add_header X-App-Host default always;
			add_header X-App-Path $uri always;
			return 201 "app ran\n";
		}
	}

	server {
		listen 127.0.0.1:{{.Port}};
		server_name shop.test;
		location / {
			add_header X-App-Host shop.test always;
			add_header X-App-Path $uri always;
			return 201 "app ran\n";
		}
	}
}
`))

// bypassRoutes are the gateway's routes in front of the apps.
const bypassRoutes = `routes:
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

// routed reports whether an app that read a request as host and path
// would serve a path bypassRoutes protects.
func routed(host, path string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	return path == "/checkout" || strings.HasPrefix(path, "/admin/") || (host == "shop.test" && path == "/cart")
}

// spelling is a request to the gateway, written byte for byte.
type spelling struct {
	target, host string // no Host header when host is ""
	// refused: the gateway must answer 400 invalid_request; else the app
	// may serve it, as long as it does not read it as a routed path.
	refused bool
}

func (s spelling) raw() string {
	var b strings.Builder
	proto := "HTTP/1.1"
	if s.host == "" {
		proto = "HTTP/1.0"
	}
	b.WriteString("POST " + s.target + " " + proto + "\r\n")
	if s.host != "" {
		b.WriteString("Host: " + s.host + "\r\n")
	}
	b.WriteString("Content-Length: 0\r\nConnection: close\r\n\r\n")
	return b.String()
}

// spellings are the ways around a route's policy found in issue 10, and
// the spellings the gateway redirects or routes, sent without any
// credential: a request the gateway routes is refused by its policy, so
// an app that answers one of them and read a routed path was reached
// around the policy.
var spellings = []spelling{
	{"/checkout", "app.test", false},
	{"/x/..;/checkout", "app.test", true},
	{"/.;/checkout", "app.test", true},
	{"/;/checkout", "app.test", true},
	{"/checkout;", "app.test", true},
	{"/checkout%3B", "app.test", true},
	{"/admin;/x", "app.test", true},
	{`/x/..\checkout`, "app.test", true},
	{"/x/..%5Ccheckout", "app.test", true},
	{"/x/%252e%252e/checkout", "app.test", true},
	{"/x%252F..%252Fcheckout", "app.test", true},
	{"/checkout%00", "app.test", true},
	{"/x/%2e%2e/checkout", "app.test", false},
	{"/x/%2E%2E/checkout", "app.test", false},
	{"/x/.%2e/checkout", "app.test", false},
	{"/%2e/checkout", "app.test", false},
	{"/x%2F..%2Fcheckout", "app.test", false},
	{"/x/../checkout", "app.test", false},
	{"/./checkout", "app.test", false},
	{"//checkout", "app.test", false},
	{"/%63heckout", "app.test", false},
	{"/checkout/", "app.test", false},
	{"/checkout%2F", "app.test", false},
	{"/CHECKOUT", "app.test", false},
	{"/admin", "app.test", false},
	{"/admin%2Fx", "app.test", false},
	{"/cart", "shop.test", false},
	{"/cart", "SHOP.TEST", false},
	{"/cart", "shop.test.", false},
	{"/cart", "shop.test:80", false},
	{"/cart", "[shop.test]", true},
	{"/cart", "shop.test,evil", true},
	{"/cart", "shop.test:80:80", true},
	{"/cart", ".shop.test", true},
	{"/cart", "shop.test..", true},
	{"/cart", "", true},
	{"/cart", "shop.test.evil", false},
	{"/x/../cart", "shop.test", false},
}

// TestGatewayBypassSpellings puts real servers behind the gateway as the
// app, nginx and a Node.js app reading paths with the WHATWG URL parser,
// and sends every spelling above: none may reach the app as a routed path
// or host, which the gateway would have refused without credentials.
// Before that, each app is asked directly, to show that it reads the
// spellings the gateway refuses or redirects as the routed path.
func TestGatewayBypassSpellings(t *testing.T) {
	apps := []struct {
		name  string
		start func(t *testing.T) *url.URL
		// readsAsRouted are spellings the app, asked directly, reads as
		// a routed host and path.
		readsAsRouted []spelling
		// host: the app learns the client's host from the Host header
		// (nginx), so the gateway's requests carry it there, as a
		// deployment that keeps the Host does; else from
		// X-Forwarded-Host.
		keepHost bool
	}{
		{"nginx", startNginxApp, []spelling{
			{target: "/x/%2e%2e/checkout", host: "app.test"},
			{target: "/x%2F..%2Fcheckout", host: "app.test"},
			{target: "/%63heckout", host: "app.test"},
			{target: "//checkout", host: "app.test"},
			{target: "/cart", host: "shop.test:80:80"},
			{target: "/cart", host: "SHOP.TEST."},
		}, true},
		{"node", startNodeApp, []spelling{
			{target: `/x/..\checkout`, host: "app.test"},
			{target: "/x/%2e%2e/checkout", host: "app.test"},
			{target: "/x/.%2e/checkout", host: "app.test"},
		}, false},
	}
	for _, app := range apps {
		t.Run(app.name, func(t *testing.T) {
			appURL := app.start(t)
			t.Run("the app reads these as routed paths", func(t *testing.T) {
				for _, s := range app.readsAsRouted {
					raw := s.raw()
					if !app.keepHost {
						raw = strings.Replace(raw, "\r\n\r\n", "\r\nX-Forwarded-Host: "+s.host+"\r\n\r\n", 1)
					}
					host, path, read := appReading(sendRaw(t, appURL.Host, raw))
					if !read || !routed(host, path) {
						t.Errorf("%s with Host %s: the app read %q %q (answered: %v), want a routed path", s.target, s.host, host, path, read)
					}
				}
			})

			gw := startGateway(t, appURL, app.keepHost)
			for _, s := range spellings {
				t.Run(fmt.Sprintf("%s with Host %q", s.target, s.host), func(t *testing.T) {
					resp := sendRaw(t, gw, s.raw())
					host, path, read := appReading(resp)
					t.Logf("%d, the app read: %v %q %q", resp.StatusCode, read, host, path)
					if read && routed(host, path) {
						t.Fatalf("the app served %q %q without the route's policy", host, path)
					}
					if s.refused && (resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/problem+json" ||
						!bytes.Contains(resp.body, []byte(`"code":"invalid_request"`))) {
						t.Fatalf("= %d %s, want 400 invalid_request", resp.StatusCode, resp.body)
					}
				})
			}
		})
	}
}

// rawAnswer is a response with its body read.
type rawAnswer struct {
	*http.Response
	body []byte
}

// sendRaw writes raw to addr, byte for byte, and reads the answer.
func sendRaw(t *testing.T, addr, raw string) rawAnswer {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, raw); err != nil {
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
	return rawAnswer{resp, body}
}

// appReading is how the app read the request it answered, if it did.
func appReading(a rawAnswer) (host, path string, read bool) {
	path, read = a.Header.Get("X-App-Path"), a.Header.Get("X-App-Path") != ""
	return a.Header.Get("X-App-Host"), path, read
}

// startGateway runs a gateway to app with bypassRoutes on a loopback
// port; with keepHost, the app gets the client's Host (from
// X-Forwarded-Host, which the gateway sets to it) instead of its own.
func startGateway(t *testing.T, app *url.URL, keepHost bool) string {
	t.Helper()
	st := newMemory(t)
	svc, err := token.New(st, []token.Key{{ID: "k1", Secret: bytes.Repeat([]byte("g"), token.MinKeyLen)}}, token.WithMachineID(machineIDs+100))
	if err != nil {
		t.Fatal(err)
	}
	routes, err := gateway.ParseRoutes([]byte(bypassRoutes))
	if err != nil {
		t.Fatal(err)
	}
	tr := gateway.NewTransport()
	t.Cleanup(tr.CloseIdleConnections)
	var rt http.RoundTripper = tr
	if keepHost {
		rt = keepHostTransport{tr}
	}
	gw, err := gateway.New(app, routes,
		gateway.WithKeeper(idempotency.New(st)),
		gateway.WithTokens(svc),
		gateway.WithTransport(rt),
		gateway.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// keepHostTransport sends the app the client's Host, as a gateway
// configured to keep it would.
type keepHostTransport struct{ base http.RoundTripper }

func (k keepHostTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r2 := r.Clone(r.Context())
	r2.Host = r.Header.Get("X-Forwarded-Host")
	return k.base.RoundTrip(r2)
}

// startNginxApp runs nginx as the app (appConf).
func startNginxApp(t *testing.T) *url.URL {
	bin := testenv.Var(t, envNginx)
	base, _ := startNginxConf(t, bin, appConf, confData{})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// startNodeApp runs testdata/app.mjs with node until the test ends.
func startNodeApp(t *testing.T) *url.URL {
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node is not installed: "+err.Error())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, node, "testdata/app.mjs")
	var stderr bytes.Buffer
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
	// node prints its port once it listens, or exits.
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("node did not start: %v: %s", err, stderr.Bytes())
	}
	return &url.URL{Scheme: "http", Host: "127.0.0.1:" + strings.TrimSpace(line)}
}
