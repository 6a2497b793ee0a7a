// Package webhook_test runs Replayguard's server (cmd/server, built once
// per run) as a gateway with webhook routes in front of an app that
// counts its executions, and delivers signed webhooks through it: the
// issue 12 end-to-end test, on the memory store, Redis and PostgreSQL.
package webhook_test

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/problem"
)

// repoRoot is the repository, from this package's directory.
const repoRoot = "../.."

// serverBin is cmd/server, built by TestMain.
var serverBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "replayguard-webhook-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		serverBin = filepath.Join(dir, "server")
		cmd := exec.Command(goBin, "build", "-o", serverBin, "./cmd/server")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building cmd/server: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// randomHex returns n random bytes in hex.
func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// server is a running cmd/server.
type server struct {
	base string
	cmd  *exec.Cmd
	out  *testenv.LockedBuffer
	done chan struct{}
	err  error // the process's exit, once done is closed
}

// runServer starts cmd/server with env (NAME=value) and no other
// variable but PATH and HOME, listening on a free loopback port.
func runServer(t *testing.T, env ...string) *server {
	t.Helper()
	cmd := exec.Command(serverBin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "REPLAYGUARD_ADDR=127.0.0.1:0"}, env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, out: &testenv.LockedBuffer{}, done: make(chan struct{})}
	cmd.Stderr = s.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = s.out.Write(append(append([]byte(nil), line...), '\n'))
			var l struct{ Msg, Addr string }
			if json.Unmarshal(line, &l) == nil && l.Msg == "replayguard listening" {
				select {
				case listening <- l.Addr:
				default:
				}
			}
		}
		s.err = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			t.Logf("server output:\n%s", s.out.String())
		}
	})
	select {
	case addr := <-listening:
		s.base = "http://" + addr
	case <-s.done:
		t.Fatalf("the server exited at start: %v\n%s", s.err, s.out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not listen\n%s", s.out.String())
	}
	return s
}

// exit runs cmd/server with env and returns its output and exit error,
// for a server that must not start.
func exit(t *testing.T, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, serverBin)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "REPLAYGUARD_ADDR=127.0.0.1:0"}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// stop sends SIGTERM and waits for the server to drain and exit.
func (s *server) stop() {
	if s.cmd.Process == nil {
		return
	}
	// A connection the client dialed but never used would hold the
	// server's drain for 5s (net/http waits that long for a new
	// connection's first request).
	client.CloseIdleConnections()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// countingApp is the app behind the gateway: it counts its executions
// per Replayguard-Webhook-Id (or "unrouted <path>" without one) and
// answers 200 with {"id", "run"}. Some IDs fail their first execution
// with 500, and some hold it until released.
type countingApp struct {
	srv       *httptest.Server
	mu        sync.Mutex
	runs      map[string]int
	headers   map[string]http.Header // the last request's, by key
	failFirst map[string]bool
	hold      map[string]chan struct{}
	started   chan string
}

func newCountingApp(t *testing.T) *countingApp {
	t.Helper()
	a := &countingApp{runs: map[string]int{}, headers: map[string]http.Header{}, failFirst: map[string]bool{},
		hold: map[string]chan struct{}{}, started: make(chan string, 64)}
	a.srv = httptest.NewServer(a)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *countingApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Replayguard-Webhook-Id")
	if key == "" {
		key = "unrouted " + r.URL.Path
	}
	a.mu.Lock()
	a.runs[key]++
	n := a.runs[key]
	a.headers[key] = r.Header.Clone()
	fail := a.failFirst[key] && n == 1
	hold := a.hold[key]
	a.mu.Unlock()
	if hold != nil {
		a.started <- key
		<-hold
	}
	if fail {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "the app failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": key, "run": n})
}

func (a *countingApp) count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.runs[key]
}

func (a *countingApp) header(key string) http.Header {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.headers[key]
}

// answer is one response of the gateway.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

func (a answer) code() string {
	var p problem.Problem
	_ = json.Unmarshal([]byte(a.body), &p)
	return p.Code
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

func (a answer) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	return fmt.Sprintf("%d %s", a.status, strings.TrimSpace(a.body))
}

var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}

// send sends req. It never fails the test, so goroutines may call it.
func send(req *http.Request) answer {
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(body), err: err}
}

// post builds a POST of body to target with headers (name, value pairs,
// kept as written).
func post(t *testing.T, target, body string, headers ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header[headers[i]] = append(req.Header[headers[i]], headers[i+1])
	}
	return req
}

func hmacHex(key, msg string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil))
}

// stripeSignature is Stripe-Signature for body at ts, as Stripe writes
// it.
func stripeSignature(secret string, ts time.Time, body string) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	return "t=" + t + ",v1=" + hmacHex(secret, t+"."+body)
}

// slackHeaders are Slack's headers for body at ts.
func slackHeaders(secret string, ts time.Time, body string) []string {
	t := strconv.FormatInt(ts.Unix(), 10)
	return []string{"X-Slack-Signature", "v0=" + hmacHex(secret, "v0:"+t+":"+body), "X-Slack-Request-Timestamp", t}
}

// githubHeaders are GitHub's headers for delivery id of body.
func githubHeaders(secret, id, body string) []string {
	return []string{"X-Hub-Signature-256", "sha256=" + hmacHex(secret, body), "X-GitHub-Delivery", id, "X-GitHub-Event", "push"}
}
