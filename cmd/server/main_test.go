package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store"
)

// TestMain lets the tests run this binary's main as a subprocess.
func TestMain(m *testing.M) {
	if os.Getenv("REPLAYGUARD_TEST_RUN_MAIN") == "1" {
		if os.Getenv("REPLAYGUARD_TEST_PANIC_IN_RENEW") == "1" {
			testStore = func(st store.Store) store.Store { return panicOnRenew{st} }
		}
		main()
		return
	}
	os.Exit(m.Run())
}

// server runs main in a subprocess with env and returns it once it
// listens, with its address; stdout collects every log line.
func server(t *testing.T, env ...string) (*exec.Cmd, string, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "REPLAYGUARD_TEST_RUN_MAIN=1", "REPLAYGUARD_ADDR=127.0.0.1:0")
	cmd.Env = append(cmd.Env, env...)
	out := &syncBuffer{lines: make(chan string, 1000)}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			out.add(sc.Text())
		}
		close(out.lines)
	}()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-out.lines:
			if !ok {
				t.Fatalf("server exited before listening:\n%s", out.String())
			}
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "replayguard listening" {
				go func() { // keep draining
					for range out.lines {
					}
				}()
				return cmd, rec["addr"].(string), out
			}
		case <-deadline:
			t.Fatalf("server did not listen:\n%s", out.String())
		}
	}
}

// syncBuffer collects the subprocess's lines for assertions and hands
// each to the reader waiting for the listening line.
type syncBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	n     int           // lines so far
	grown chan struct{} // closed (and replaced) when a line arrives
	lines chan string
}

func (b *syncBuffer) add(line string) {
	b.mu.Lock()
	b.buf.WriteString(line + "\n")
	b.n++
	if b.grown != nil {
		close(b.grown)
		b.grown = nil
	}
	b.mu.Unlock()
	b.lines <- line
}

// count returns how many lines were written so far.
func (b *syncBuffer) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// waitForLog waits up to 10 seconds for a JSON log record with message
// msg among the lines after the first skip, and returns it.
func (b *syncBuffer) waitForLog(t *testing.T, skip int, msg string) map[string]any {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		lines := strings.Split(strings.TrimSuffix(b.buf.String(), "\n"), "\n")
		if b.grown == nil {
			b.grown = make(chan struct{})
		}
		grown := b.grown
		b.mu.Unlock()
		for _, line := range lines[min(skip, len(lines)):] {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
				return rec
			}
		}
		select {
		case <-grown:
		case <-deadline:
			t.Fatalf("no log line %q after line %d:\n%s", msg, skip, b.String())
		}
	}
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestServerLifecycle(t *testing.T) {
	cmd, addr, out := server(t)
	base := "http://" + addr
	resp, err := http.Post(base+"/v1/tokens", "application/json", strings.NewReader(`{"purpose":"checkout"}`))
	if err != nil {
		t.Fatal(err)
	}
	var issued struct{ Token string }
	_ = json.NewDecoder(resp.Body).Decode(&issued)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || issued.Token == "" {
		t.Fatalf("issue = %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/tokens/redeem?purpose=checkout", nil)
	req.Header.Set("Idempotency-Token", issued.Token)
	req.Header.Set("X-Request-ID", "trace-123")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Request-ID") != "trace-123" {
		t.Fatalf("redeem = %d, request id %q", resp.StatusCode, resp.Header.Get("X-Request-ID"))
	}

	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v to stop", d)
	}
	logs := out.String()
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON: %q", line)
		}
	}
	for _, want := range []string{`"request_id":"trace-123"`, `single instance`, `REPLAYGUARD_API_KEYS is not set`, `replayguard stopped`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, issued.Token) {
		t.Error("a token was logged")
	}
}

func TestSecretsAreNeverLogged(t *testing.T) {
	key := "k1:" + strings.Repeat("QUJD", 11) // 33 bytes of base64
	_, _, out := server(t, "REPLAYGUARD_SIGNING_KEYS="+key, "REPLAYGUARD_API_KEYS=super-secret-api-key")
	logs := out.String()
	if strings.Contains(logs, "QUJDQUJD") || strings.Contains(logs, "super-secret-api-key") {
		t.Fatalf("secret in logs:\n%s", logs)
	}
}

func TestBadConfigurationExitsNonZero(t *testing.T) {
	tests := []struct{ name, env, want string }{
		{"short signing key", "REPLAYGUARD_SIGNING_KEYS=k1:c2hvcnQ=", "REPLAYGUARD_SIGNING_KEYS"},
		{"bad duration", "REPLAYGUARD_TOKEN_TTL=5 minutes", "REPLAYGUARD_TOKEN_TTL"},
		{"malformed redis URL", "REPLAYGUARD_REDIS_URL=http://nope", "REPLAYGUARD_REDIS_URL"},
		{"bad rate", "REPLAYGUARD_ISSUE_RATE=lots", "REPLAYGUARD_ISSUE_RATE"},
		{"malformed cluster URL", "REPLAYGUARD_REDIS_CLUSTER_URL=redis://:hunter2-cluster@10.0.0.1:7000?nosuch=1", "REPLAYGUARD_REDIS_CLUSTER_URL"},
		{"two Redis settings", "REPLAYGUARD_REDIS_CLUSTER_URL=redis://10.0.0.1:7000 REPLAYGUARD_REDIS_CLUSTER_ADDRS=10.0.0.1:7000", "choose one"},
		{"PostgreSQL and Redis", "REPLAYGUARD_POSTGRES_URL=postgres://u:hunter2@10.0.0.1/db REPLAYGUARD_REDIS_URL=redis://10.0.0.1:6379", "REPLAYGUARD_POSTGRES_URL and REPLAYGUARD_REDIS_URL"},
		{"malformed PostgreSQL URL", "REPLAYGUARD_POSTGRES_URL=postgres://u:hunter2@10.0.0.1:99999999/db", "REPLAYGUARD_POSTGRES_URL"},
		{"unknown propagator, even with tracing off", "OTEL_PROPAGATORS=tracecontext,zipkin", "OTEL_PROPAGATORS"},
		{"an admin key that is also an API key", "REPLAYGUARD_API_KEYS=backend,hunter2 REPLAYGUARD_ADMIN_KEYS=hunter2", "REPLAYGUARD_ADMIN_KEYS"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), "REPLAYGUARD_TEST_RUN_MAIN=1", "REPLAYGUARD_ADDR=127.0.0.1:0")
			cmd.Env = append(cmd.Env, strings.Fields(tc.env)...)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("exit = %v, want non-zero; output %s", err, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("message does not name %s: %s", tc.want, out)
			}
			if strings.Contains(string(out), "hunter2") {
				t.Fatalf("the message reveals the password: %s", out)
			}
			if !json.Valid(bytes.TrimSpace(out)) {
				t.Fatalf("output is not one JSON line: %s", out)
			}
		})
	}
}

// TestClusterURL runs the server on the test cluster given as one
// REPLAYGUARD_REDIS_CLUSTER_URL, seeds as addr= parameters.
func TestClusterURL(t *testing.T) {
	addrs := strings.Split(testenv.Var(t, "REPLAYGUARD_TEST_REDIS_CLUSTER_ADDRS"), ",")
	u := "redis://" + strings.TrimSpace(addrs[0])
	for i, a := range addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + strings.TrimSpace(a)
	}
	_, addr, out := server(t, "REPLAYGUARD_REDIS_CLUSTER_URL="+u, "REPLAYGUARD_STORE_TIMEOUT=5s",
		"REPLAYGUARD_KEY_PREFIX=rg-test-clusterurl-"+strconv.FormatInt(time.Now().UnixNano(), 36)+":")
	if rec := out.waitForLog(t, 0, "store: redis cluster"); rec["tls"] != false {
		t.Fatalf("log = %v", rec)
	}
	resp, err := http.Post("http://"+addr+"/v1/tokens", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	var is struct{ Token string }
	err = json.NewDecoder(resp.Body).Decode(&is)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("issue = %d, %v", resp.StatusCode, err)
	}
	for i, want := range []int{http.StatusOK, http.StatusConflict} {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/tokens/redeem", nil)
		req.Header.Set("Idempotency-Token", is.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("redeem %d = %d, want %d", i+1, resp.StatusCode, want)
		}
	}
}

func TestRedisDownAtStartIsNotFatal(t *testing.T) {
	// Nothing listens on port 1; the server must start, report not ready
	// and refuse with 503.
	_, addr, _ := server(t, "REPLAYGUARD_REDIS_URL=redis://127.0.0.1:1/0", "REPLAYGUARD_STORE_TIMEOUT=100ms")
	for _, c := range []struct{ method, path string }{{"GET", "/readyz"}, {"POST", "/v1/tokens"}} {
		req, _ := http.NewRequest(c.method, "http://"+addr+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s %s = %d, want 503", c.method, c.path, resp.StatusCode)
		}
	}
}

func TestClusterURLSettings(t *testing.T) {
	dir := t.TempDir()
	file := dir + "/cluster-url"
	if err := os.WriteFile(file, []byte("rediss://app:s3cret@10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, key, value string }{
		{"from the variable", "REPLAYGUARD_REDIS_CLUSTER_URL", "rediss://app:s3cret@10.0.0.1:7000?addr=10.0.0.2:7000&addr=10.0.0.3:7000"},
		{"from its file", "REPLAYGUARD_REDIS_CLUSTER_URL_FILE", file},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(nil, func(k string) string {
				if k == tc.key {
					return tc.value
				}
				return ""
			})
			if err != nil {
				t.Fatal(err)
			}
			o := c.RedisClusterURL
			if o == nil || o.Username != "app" || o.Password != "s3cret" || o.TLSConfig == nil ||
				strings.Join(o.Addrs, ",") != "10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000" {
				t.Fatalf("cluster options = %+v", o)
			}
		})
	}
}
