package integration

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
)

// The crash test's child process: the test binary run again with
// crashChildEnv=1 and -test.run=^TestIdempotencyCrashChild$.
const (
	crashChildEnv  = "RG_CRASH_CHILD"
	crashPrefixEnv = "RG_CRASH_PREFIX" // the Redis key prefix the child uses
	// crashLockTTL is the lease of both servers' records; the heartbeat
	// renews it every crashLockTTL/3 while a handler runs.
	crashLockTTL = 2 * time.Second
	// crashRetries is how many retries are sent at once, in every round,
	// while the parent waits for the crashed record's lease to end.
	crashRetries = 20
	// crashBound bounds every wait on the child and on the lease's end
	// beyond crashLockTTL.
	crashBound = 30 * time.Second
)

// TestIdempotencyCrashChild is the server TestIdempotencyCrash kills: run
// by it, it serves POST /orders through the Idempotency-Key middleware
// on the Redis at REPLAYGUARD_TEST_REDIS_URL with a crashLockTTL lease,
// reports "listening <addr>" and, for every execution, "started <key>"
// on file descriptor 3, and never answers: the handler blocks until the
// process is killed. It exits when its standard input closes, so it
// cannot outlive the parent. Run on its own, it does nothing.
func TestIdempotencyCrashChild(t *testing.T) {
	if os.Getenv(crashChildEnv) != "1" {
		return // only a helper process for TestIdempotencyCrash
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3) // the parent is gone
	}()
	report := os.NewFile(3, "report")
	if report == nil {
		t.Fatal("no file descriptor 3 to report on")
	}
	st := openRedis(t, os.Getenv(envRedisURL), os.Getenv(crashPrefixEnv))
	idempotent := guard.Idempotent(idempotency.New(st, idempotency.WithLockTTL(crashLockTTL)),
		guard.WithLogger(slog.New(slog.DiscardHandler)))
	mux := http.NewServeMux()
	mux.Handle("POST /orders", idempotent(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = fmt.Fprintf(report, "started %s\n", r.Header.Get(idempotency.KeyHeader))
		select {} // until SIGKILL
	})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fmt.Fprintf(report, "listening %s\n", ln.Addr())
	t.Fatal(http.Serve(ln, mux))
}

// crashChild is a running TestIdempotencyCrashChild process.
type crashChild struct {
	cmd   *exec.Cmd
	stdin io.Closer
	lines chan string   // what it reports, line by line; closed at EOF
	done  chan struct{} // closed when it has exited and been waited for
	err   error         // its exit status, once done is closed
}

// startCrashChild runs TestIdempotencyCrashChild on Redis at url under
// prefix and returns once it reports its address. The test's cleanup
// kills it if it is still running.
func startCrashChild(t *testing.T, url, prefix string) (*crashChild, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestIdempotencyCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashChildEnv+"=1", crashPrefixEnv+"="+prefix, envRedisURL+"="+url)
	cmd.ExtraFiles = []*os.File{pw} // the child's fd 3
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the child server: %v", err)
	}
	_ = pw.Close() // the child holds its own copy
	c := &crashChild{cmd: cmd, stdin: stdin, lines: make(chan string, 16), done: make(chan struct{})}
	go func() {
		defer close(c.lines)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	go func() {
		c.err = cmd.Wait() // also waits for the copy of its output
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		<-c.done
		for range c.lines { // let the reader finish
		}
		if t.Failed() {
			t.Logf("child server output:\n%s", out.String())
		}
	})
	line := c.waitFor(t, "listening ")
	return c, strings.TrimPrefix(line, "listening ")
}

// waitFor returns the first line the child reports that starts with
// prefix, failing the test if the child ends or crashBound passes first.
func (c *crashChild) waitFor(t *testing.T, prefix string) string {
	t.Helper()
	deadline := time.After(crashBound)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				<-c.done
				t.Fatalf("the child server ended (%v) before reporting %q", c.err, prefix)
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
			t.Logf("child: %s", line)
		case <-deadline:
			t.Fatalf("the child server did not report %q within %v", prefix, crashBound)
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *crashChild) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(crashBound):
		t.Fatalf("the child server did not exit within %v of SIGKILL", crashBound)
	}
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child server ended with %v, want killed by SIGKILL", c.err)
	}
}

// TestIdempotencyCrash kills a server with SIGKILL while its handler runs
// under an Idempotency-Key, on real Redis: the processing record the
// dead server left (its heartbeat died with it) blocks duplicates with
// 409 request_in_progress until its lease ends, not for the record's
// retention; then, of crashRetries retries sent at once, exactly one
// runs, and every later duplicate gets its replay.
func TestIdempotencyCrash(t *testing.T) {
	url := requireEnv(t, envRedisURL)
	prefix := uniquePrefix(t)
	child, addr := startCrashChild(t, url, prefix)
	key := "crash-" + randomHex(t, 8)

	// The first request: the child starts its handler, which never ends.
	req, err := orderRequest("http://"+addr, key)
	if err != nil {
		t.Fatal(err)
	}
	toChild := newClient(t, 1)
	firstErr := make(chan error, 1)
	sent := time.Now()
	go func() {
		r, err := send(toChild, req)
		if err == nil {
			err = fmt.Errorf("want no answer, got %d: %s", r.Status, r.Body)
		}
		firstErr <- err
	}()
	child.waitFor(t, "started "+strconv.Quote(key))
	child.kill(t)
	killed := time.Now()
	if err := <-firstErr; strings.HasPrefix(err.Error(), "want no answer") {
		t.Fatalf("the killed server answered: %v", err)
	}

	// A second server on the same Redis and prefix takes over.
	app := &orderApp{}
	s := startIdemServer(t, openRedis(t, url, prefix), app, nil, crashRetries, idempotency.WithLockTTL(crashLockTTL))

	t.Run("a duplicate right after the crash gets 409 request_in_progress", func(t *testing.T) {
		wantInProgress(t, s.order(t, key))
		if got := app.total.Load(); got != 0 {
			t.Errorf("the handler ran %d times, want 0", got)
		}
	})

	// Rounds of crashRetries retries at once, until one runs: the lease
	// ends by the Redis server's clock, so this polls real time.
	var first reply
	for round := 1; ; round++ {
		answers := s.orders(key, crashRetries)
		counts := map[string]int{}
		var ran time.Time // when the execution's answer arrived
		for _, a := range answers {
			counts[describeOrder(a.reply, a.err)]++
			if a.err == nil && isFresh(a.reply) {
				first, ran = a.reply, a.at
			}
		}
		if counts["409 request_in_progress"] == crashRetries {
			if time.Since(killed) > crashLockTTL+crashBound {
				t.Fatalf("retries still get 409 %v after the kill; the lease is %v", time.Since(killed), crashLockTTL)
			}
			time.Sleep(100 * time.Millisecond) // waiting for the lease to end in Redis
			continue
		}
		t.Logf("round %d, %v after the first request, %v after the kill:\n%s", round, ran.Sub(sent), ran.Sub(killed), formatCounts(counts))
		if got := app.runs(strconv.Quote(key)); got != 1 {
			t.Fatalf("%d retries at once ran the handler %d times, want exactly once", crashRetries, got)
		}
		if counts["fresh 201"] != 1 {
			t.Fatalf("%d answers are an execution's own, want exactly 1", counts["fresh 201"])
		}
		wantFresh(t, first)
		for i, a := range answers {
			switch {
			case a.err != nil:
				t.Errorf("retry %d: %v", i, a.err)
			case isFresh(a.reply):
			case isReplay(a.reply):
				wantReplayOf(t, first, a.reply)
			default:
				wantInProgress(t, a.reply)
			}
		}
		// The record was opened after the first request was sent, with
		// a crashLockTTL lease: no retry may run before that has passed.
		// (A few milliseconds of slack for Redis's clock against ours.)
		if d := ran.Sub(sent); d < crashLockTTL-10*time.Millisecond {
			t.Errorf("a retry ran %v after the first request was sent, inside the %v lease", d, crashLockTTL)
		}
		break
	}

	t.Run("later duplicates get the replay", func(t *testing.T) {
		for i, a := range s.orders(key, crashRetries) {
			if a.err != nil {
				t.Fatalf("duplicate %d: %v", i, a.err)
			}
			wantReplayOf(t, first, a.reply)
		}
		if got := app.total.Load(); got != 1 {
			t.Errorf("the handler ran %d times in all, want 1", got)
		}
	})
}
