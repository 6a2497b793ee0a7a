// Package nginx tests Replayguard's forward-auth endpoint behind a real
// nginx (Debian's package: apt-get install nginx), started by the test with
// its own configuration, prefix and loopback port, and the gateway in
// front of nginx, and of a Node.js app, as its app: no spelling of a
// routed path or host reaches them around the route's policy. Set
// REPLAYGUARD_TEST_NGINX to the nginx binary (usually /usr/sbin/nginx);
// without it the nginx tests skip, or fail when REPLAYGUARD_TEST_REQUIRE=1
// (as the Node.js one does without node).
package nginx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/gin-gonic/gin"
	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// envNginx names the nginx binary the suite runs.
const envNginx = "REPLAYGUARD_TEST_NGINX"

// apiKey is the API key of the Replayguard that requires one.
const apiKey = "nginx-test-api-key"

// startTimeout bounds nginx's start and its stop.
const startTimeout = 10 * time.Second

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	gin.DefaultWriter, gin.DefaultErrorWriter = io.Discard, io.Discard
	goleak.VerifyTestMain(m)
}

// nginxConf is the whole configuration: nothing outside the test's prefix
// directory is read or written (the paths Debian compiled in are all
// overridden), and nginx stays in the foreground as one process, so its
// pid is the one the test started.
//
// Every protected location has its own auth location, each as the README
// shows it, in front of a different Replayguard: the working one, one
// that requires an API key (sent, and not sent), one whose store fails,
// and one that is not running.
var nginxConf = template.Must(template.New("nginx.conf").Parse(`
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
		listen 127.0.0.1:{{.Port}};
{{range .Routes}}
		location = /_replayguard{{.Path}} {
			internal;
			proxy_pass http://{{.Replayguard}}/v1/tokens/forward-auth?purpose=checkout;
			proxy_pass_request_body off;
			proxy_set_header Content-Length "";
{{- if .APIKey}}
			proxy_set_header Authorization "Bearer {{.APIKey}}";
{{- end}}
		}

		location = {{.Path}} {
			auth_request /_replayguard{{.Path}};
			auth_request_set $rg_token_id $upstream_http_replayguard_token_id;
			auth_request_set $rg_problem $upstream_http_replayguard_problem_code;
			error_page 403 /_replayguard_403;
			proxy_set_header Replayguard-Token-Id $rg_token_id;
			proxy_pass http://{{$.Upstream}};
		}
{{end}}
		location = /_replayguard_403 {
			internal;
			default_type application/problem+json;
			add_header Cache-Control no-store always;
			return 403 '{"type":"urn:replayguard:problem:$rg_problem","status":403,"code":"$rg_problem"}\n';
		}
	}
}
`))

type route struct {
	Path        string // the protected location
	Replayguard string // host:port of the Replayguard its auth location asks
	APIKey      string // sent as Authorization: Bearer, when not empty
}

type confData struct {
	Dir      string
	Port     int
	Upstream string
	Routes   []route
}

// upstream is the protected app: it records every request it serves.
type upstream struct {
	mu   sync.Mutex
	seen []seen
}

type seen struct {
	path, tokenID, body string
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.seen = append(u.seen, seen{r.URL.Path, r.Header.Get(token.IDHeader), string(body)})
	u.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, "order placed\n")
}

func (u *upstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.seen...)
}

// redeemFails fails every redemption, like a store that is down.
type redeemFails struct{ store.Store }

func (redeemFails) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, store.Unavailable("redis", errors.New("dial tcp 10.9.8.7:6379: connect: connection refused"))
}

var machineIDs uint16 = 300

// startReplayguard serves the standalone engine over st on a loopback
// port until the test ends.
func startReplayguard(t *testing.T, st store.Store, opts ...handlers.Option) *httptest.Server {
	t.Helper()
	machineIDs++
	svc, err := token.New(st, []token.Key{{ID: "k1", Secret: bytes.Repeat([]byte("n"), token.MinKeyLen)}},
		token.WithMachineID(machineIDs))
	if err != nil {
		t.Fatal(err)
	}
	e, err := handlers.New(svc, append(opts, handlers.WithLogger(slog.New(slog.DiscardHandler)))...).Engine()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

func newMemory(t *testing.T) *memory.Store {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// closedAddr returns a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// startNginx runs bin with the configuration for data in a temp dir, on a
// free loopback port, and stops it (by its pid, then waits for it) when
// the test ends. It returns nginx's base URL and its error log's path.
func startNginx(t *testing.T, bin string, data confData) (url, errLog string) {
	t.Helper()
	return startNginxConf(t, bin, nginxConf, data)
}

// startNginxConf is startNginx with the configuration conf.
func startNginxConf(t *testing.T, bin string, conf *template.Template, data confData) (url, errLog string) {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		data.Dir = t.TempDir()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		data.Port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		url, err := runNginx(t, bin, conf, data)
		if err == nil {
			return url, filepath.Join(data.Dir, "error.log")
		}
		lastErr = err
		if !strings.Contains(err.Error(), "Address already in use") {
			break // only a lost race for the port is worth another try
		}
	}
	t.Fatalf("starting nginx: %v", lastErr)
	return "", ""
}

func runNginx(t *testing.T, bin string, tmpl *template.Template, data confData) (string, error) {
	conf := filepath.Join(data.Dir, "nginx.conf")
	errLog := filepath.Join(data.Dir, "error.log")
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, data); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	// -e: the error log before the configuration is read, which would
	// otherwise be Debian's /var/log/nginx/error.log.
	cmd := exec.Command(bin, "-c", conf, "-p", data.Dir+"/", "-e", errLog)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	report := func() string {
		log, _ := os.ReadFile(errLog)
		return fmt.Sprintf("output:\n%s\nerror log:\n%s", out.Bytes(), log)
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(startTimeout):
			_ = cmd.Process.Kill()
			<-exited
		}
	}

	// nginx is an outside process: poll its port until it answers, it
	// exits, or the deadline passes.
	addr := fmt.Sprintf("127.0.0.1:%d", data.Port)
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			return "", fmt.Errorf("nginx exited at start (%v); %s", cmd.ProcessState, report())
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			stop()
			return "", fmt.Errorf("nginx did not listen on %s within %v; %s", addr, startTimeout, report())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("nginx %s", report())
		}
	})
	return "http://" + addr, nil
}

// client talks to nginx without keeping connections, so no transport
// goroutine outlives the test.
var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// issue asks rg for a token for purpose.
func issue(t *testing.T, rg *httptest.Server, purpose string) (tok, id string) {
	t.Helper()
	res, err := client.Post(rg.URL+"/v1/tokens?purpose="+purpose, "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct{ Token, ID string }
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil || res.StatusCode != http.StatusCreated || body.Token == "" || body.ID == "" {
		t.Fatalf("issue: %d, %+v, %v", res.StatusCode, body, err)
	}
	return body.Token, body.ID
}

type answer struct {
	status int
	header http.Header
	body   string
}

// checkout POSTs an order form to nginx at path with the token (none when
// empty) and a forged Replayguard-Token-Id, as a client might send.
func checkout(t *testing.T, base, path, tok string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader("item=book&qty=1"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set(token.IDHeader, "forged-by-the-client")
	if tok != "" {
		req.Header.Set(token.Header, tok)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{res.StatusCode, res.Header, string(b)}
}

// wantProblem checks nginx's error_page answer for a forward-auth 403.
func wantProblem(t *testing.T, a answer, code string) {
	t.Helper()
	if a.status != http.StatusForbidden {
		t.Fatalf("status %d, want 403; body %s", a.status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, a.body)
	}
	var p problem.Problem
	if err := json.Unmarshal([]byte(a.body), &p); err != nil {
		t.Fatalf("problem body %q: %v", a.body, err)
	}
	if p.Code != code || p.Status != http.StatusForbidden || p.Type != problem.TypePrefix+code {
		t.Fatalf("problem %+v, want code %s", p, code)
	}
}

// wantLogged checks that nginx's error log says why it answered 500.
// nginx writes the line before it answers, so it is there already.
func wantLogged(t *testing.T, errLog, want string) {
	t.Helper()
	b, err := os.ReadFile(errLog)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(want)) {
		t.Fatalf("nginx's error log does not say %q:\n%s", want, b)
	}
}

func TestNginxAuthRequest(t *testing.T) {
	bin := testenv.Var(t, envNginx)

	app := &upstream{}
	appSrv := httptest.NewServer(app)
	t.Cleanup(appSrv.Close)

	rg := startReplayguard(t, newMemory(t))
	keyed := startReplayguard(t, newMemory(t), handlers.WithAPIKeys(apiKey))
	broken := startReplayguard(t, redeemFails{newMemory(t)})
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

	base, errLog := startNginx(t, bin, confData{
		Upstream: host(appSrv),
		Routes: []route{
			{Path: "/checkout", Replayguard: host(rg)},
			{Path: "/keyed/checkout", Replayguard: host(keyed), APIKey: apiKey},
			{Path: "/nokey/checkout", Replayguard: host(keyed)},
			{Path: "/broken/checkout", Replayguard: host(broken)},
			{Path: "/down/checkout", Replayguard: closedAddr(t)},
		},
	})

	// wantRuns checks the app has served exactly want so far.
	wantRuns := func(t *testing.T, want int) []seen {
		t.Helper()
		got := app.requests()
		if len(got) != want {
			t.Fatalf("the app served %d requests, want %d: %+v", len(got), want, got)
		}
		return got
	}

	tok, id := issue(t, rg, "checkout")

	t.Run("a fresh token reaches the app once, with its ID and the body", func(t *testing.T) {
		a := checkout(t, base, "/checkout", tok)
		if a.status != http.StatusCreated || a.body != "order placed\n" {
			t.Fatalf("got %d %q, want the app's 201", a.status, a.body)
		}
		got := wantRuns(t, 1)[0]
		if got.tokenID != id {
			t.Fatalf("the app saw %s %q, want the token's ID %q (not the client's forged one)", token.IDHeader, got.tokenID, id)
		}
		if got.body != "item=book&qty=1" || got.path != "/checkout" {
			t.Fatalf("the app got %+v", got)
		}
	})

	t.Run("the same token again is 403 token_used and the app does not run", func(t *testing.T) {
		wantProblem(t, checkout(t, base, "/checkout", tok), "token_used")
		wantRuns(t, 1)
	})

	t.Run("no token is 403 invalid_request", func(t *testing.T) {
		wantProblem(t, checkout(t, base, "/checkout", ""), "invalid_request")
		wantRuns(t, 1)
	})

	t.Run("a forged token is 403 token_invalid", func(t *testing.T) {
		fresh, _ := issue(t, rg, "checkout")
		forged := fresh[:strings.LastIndexByte(fresh, '.')+1] + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
		wantProblem(t, checkout(t, base, "/checkout", forged), "token_invalid")
		wantRuns(t, 1)
	})

	t.Run("a token for another purpose is 403 purpose_mismatch", func(t *testing.T) {
		other, _ := issue(t, rg, "refund")
		wantProblem(t, checkout(t, base, "/checkout", other), "purpose_mismatch")
		wantRuns(t, 1)
	})

	t.Run("the configured API key is sent and accepted", func(t *testing.T) {
		ktok, kid := issue(t, keyed, "checkout")
		a := checkout(t, base, "/keyed/checkout", ktok)
		if a.status != http.StatusCreated {
			t.Fatalf("got %d %q, want the app's 201", a.status, a.body)
		}
		if got := wantRuns(t, 2)[1]; got.tokenID != kid || got.path != "/keyed/checkout" {
			t.Fatalf("the app got %+v, want token ID %q", got, kid)
		}
	})

	t.Run("without the API key nginx answers 401 and the app does not run", func(t *testing.T) {
		ktok, _ := issue(t, keyed, "checkout")
		a := checkout(t, base, "/nokey/checkout", ktok)
		if a.status != http.StatusUnauthorized {
			t.Fatalf("got %d %q, want 401", a.status, a.body)
		}
		wantRuns(t, 2)
	})

	t.Run("a store that fails is a 500 from nginx and the app does not run", func(t *testing.T) {
		btok, _ := issue(t, broken, "checkout")
		if a := checkout(t, base, "/broken/checkout", btok); a.status != http.StatusInternalServerError {
			t.Fatalf("got %d %q, want 500", a.status, a.body)
		}
		wantRuns(t, 2)
		wantLogged(t, errLog, "auth request unexpected status: 503")
	})

	t.Run("Replayguard down is a 500 from nginx and the app does not run", func(t *testing.T) {
		dtok, _ := issue(t, rg, "checkout")
		if a := checkout(t, base, "/down/checkout", dtok); a.status != http.StatusInternalServerError {
			t.Fatalf("got %d %q, want 500", a.status, a.body)
		}
		wantRuns(t, 2)
		wantLogged(t, errLog, "Connection refused")
	})
}
