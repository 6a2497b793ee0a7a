package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store"
)

// panicOnRenew is the store of TestLogsAreFlushedWhenTheServerEnds's
// panic case: the heartbeat's first renewal panics.
type panicOnRenew struct{ store.Store }

func (panicOnRenew) Renew(context.Context, string, string, time.Duration) (bool, error) {
	panic("test: Renew panics")
}

// logRecords parses out's lines, failing on a line that is not JSON
// (Go's panic trace aside, which goes to stderr).
func logRecords(t *testing.T, out string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		recs = append(recs, rec)
	}
	return recs
}

// TestLogsAreFlushedWhenTheServerEnds: log lines are written in batches,
// up to 100ms late. A fatal error at start, SIGTERM and a panic in a
// background goroutine (a record's heartbeat) each end the process with
// every line written, the last one saying why.
func TestLogsAreFlushedWhenTheServerEnds(t *testing.T) {
	t.Run("fatal error at start", func(t *testing.T) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		stdout, _, code := runMain(t, nil, "REPLAYGUARD_ADDR="+taken.Addr().String())
		if code != 1 {
			t.Fatalf("exit %d, want 1:\n%s", code, stdout)
		}
		recs := logRecords(t, stdout)
		var msgs []string
		for _, r := range recs {
			msgs = append(msgs, r["msg"].(string))
		}
		// The start-up warnings, batched before the error, are there.
		for _, want := range []string{"REPLAYGUARD_SIGNING_KEYS is not set", "store: embedded memory"} {
			if !strings.Contains(strings.Join(msgs, "\n"), want) {
				t.Errorf("no %q line before the error: %q", want, msgs)
			}
		}
		last := recs[len(recs)-1]
		if last["msg"] != "replayguard stopped" || !strings.Contains(last["error"].(string), "REPLAYGUARD_ADDR") {
			t.Errorf("last line = %v, want replayguard stopped naming REPLAYGUARD_ADDR", last)
		}
	})

	t.Run("SIGTERM", func(t *testing.T) {
		cmd, addr, out := server(t)
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/healthz", nil)
		req.Header.Set("X-Request-ID", "just-before-sigterm")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// At once: the request's line is still in the batch.
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
		}
		recs := logRecords(t, out.String())
		found := false
		for _, r := range recs {
			found = found || r["request_id"] == "just-before-sigterm"
		}
		if !found {
			t.Errorf("the request's line is missing:\n%s", out.String())
		}
		if last := recs[len(recs)-1]; last["msg"] != "replayguard stopped" {
			t.Errorf("last line = %v, want replayguard stopped", last)
		}
	})

	t.Run("panic in a record's heartbeat", func(t *testing.T) {
		release := make(chan struct{})
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select { // long enough for the heartbeat to tick
			case <-release:
			case <-r.Context().Done():
			}
		}))
		defer up.Close()
		defer close(release)
		routes := filepath.Join(t.TempDir(), "routes.yaml")
		if err := os.WriteFile(routes, []byte("routes:\n  - match: \"POST /orders\"\n    policy: idempotency_key\n    required: true\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd, addr, out := server(t, "REPLAYGUARD_TEST_PANIC_IN_RENEW=1", "REPLAYGUARD_UPSTREAM="+up.URL,
			"REPLAYGUARD_ROUTES="+routes, "REPLAYGUARD_IDEMPOTENCY_LOCK_TTL=1s") // a heartbeat every 333ms
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", `"order-1"`)
		req.Header.Set("X-Request-ID", "panicking-request")
		client := &http.Client{Timeout: 10 * time.Second}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("the request got %d, want the connection dropped by the crash", resp.StatusCode)
		}
		err := cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Fatalf("exit = %v, want 2 (a panic):\n%s", err, out.String())
		}
		logs := out.String() // stdout and stderr: JSON lines, then Go's trace
		i := strings.Index(logs, `"msg":"panic"`)
		if i < 0 || !strings.Contains(logs, `"panic":"test: Renew panics"`) || !strings.Contains(logs, "heartbeat") {
			t.Fatalf("no panic line with its value and stack:\n%s", logs)
		}
		if j := strings.Index(logs, "panic: test: Renew panics"); j < i {
			t.Fatalf("Go's panic trace is missing or comes before the panic line:\n%s", logs)
		}
	})
}
