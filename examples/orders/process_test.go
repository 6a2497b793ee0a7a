package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/internal/pgtest"
)

// TestKilledInsideTheTransaction runs the command as a process and
// SIGKILLs it while an order's transaction is open (the order inserted,
// the supplier call still waiting): the order is gone with the process,
// the key is free, and the retry after a restart makes exactly one order.
func TestKilledInsideTheTransaction(t *testing.T) {
	bin := buildOrders(t)

	t.Run("without DATABASE_URL it exits 1 and says why", func(t *testing.T) {
		cmd := exec.Command(bin)
		cmd.Env = appEnv()
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "DATABASE_URL is not set") {
			t.Errorf("exit %v, output %q; want exit status 1 naming DATABASE_URL", err, out)
		}
	})

	schema := pgtest.NewSchema(t)
	monitor := pgtest.Pool(t, schema, 2)
	name := "orders-kill-" + randomHex(t)
	dsn := withParam(t, pgtest.SchemaURL(t, schema), "application_name", name)
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	const key, body = `"kill-1"`, `{"item":"book","qty":1}`

	p := startOrders(t, bin, "DATABASE_URL="+dsn, "ORDERS_DELAY=10m")
	sent := make(chan answer, 1)
	go func() { sent <- post(client, "http://"+p.addr, "/orders", key, body) }()
	// Inside: the app's session has inserted the order and is idle in its
	// transaction, waiting for the supplier.
	waitFor(t, monitor, "the order's open transaction", `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND state = 'idle in transaction' AND query LIKE 'INSERT INTO orders%'`, name, 1)
	p.kill(t)
	if a := <-sent; a.err == nil {
		t.Fatalf("the request was answered by a killed process: %v", a)
	}
	// PostgreSQL rolls the transaction back when it sees the connection
	// drop; then the session is gone.
	waitFor(t, monitor, "the killed process's sessions to end", `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name, 0)
	if o, r := countRows(t, monitor, "orders"), countRows(t, monitor, "replayguard_records"); o != 0 || r != 0 {
		t.Fatalf("after the kill: %d orders, %d records; want none", o, r)
	}

	p = startOrders(t, bin, "DATABASE_URL="+dsn)
	a := post(client, "http://"+p.addr, "/orders", key, body)
	if a.err != nil || a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("the retry after the restart: %v (%v); want a first 201", a, a.err)
	}
	again := post(client, "http://"+p.addr, "/orders", key, body)
	if again.status != http.StatusCreated || !again.replayed() || string(again.body) != string(a.body) {
		t.Fatalf("a second retry: %v; want %v replayed", again, a)
	}
	if o := countRows(t, monitor, "orders"); o != 1 {
		t.Fatalf("%d orders after the retries, want 1", o)
	}
}

// buildOrders builds this command into a temporary directory.
func buildOrders(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "orders")
	cmd := exec.Command(goBin, "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// appEnv is the test's environment without the command's settings.
func appEnv(set ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "DATABASE_URL", "ADDR", "ORDERS_DELAY":
			continue
		}
		env = append(env, kv)
	}
	return append(env, set...)
}

// ordersProc is a running orders command.
type ordersProc struct {
	cmd  *exec.Cmd
	addr string
	done chan struct{} // closed when its output ends

	mu  sync.Mutex
	out strings.Builder
}

// startOrders runs bin on a free port with env (NAME=value) and returns
// once it listens; the test's cleanup kills it.
func startOrders(t *testing.T, bin string, env ...string) *ordersProc {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = appEnv(append(env, "ADDR=127.0.0.1:0")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &ordersProc{cmd: cmd, done: make(chan struct{})}
	t.Cleanup(func() { p.kill(t) })
	listening := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.out.WriteString(line + "\n")
			p.mu.Unlock()
			if addr, ok := strings.CutPrefix(line, "orders: listening on http://"); ok {
				listening <- addr
			}
		}
	}()
	select {
	case p.addr = <-listening:
	case <-p.done:
		t.Fatalf("orders exited before listening:\n%s", p.output())
	case <-time.After(30 * time.Second):
		t.Fatalf("orders did not listen within 30s:\n%s", p.output())
	}
	return p
}

func (p *ordersProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// kill SIGKILLs the process and waits for it; it may be called again.
func (p *ordersProc) kill(t *testing.T) {
	t.Helper()
	if p.cmd.ProcessState != nil {
		return
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Errorf("kill: %v", err)
	}
	<-p.done
	_ = p.cmd.Wait()
}

// waitFor polls query, which counts something, until it counts want, for
// up to 30 seconds.
func waitFor(t *testing.T, pool *pgxpool.Pool, what, query string, arg any, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := pool.QueryRow(context.Background(), query, arg).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: counted %d, want %d", what, n, want)
		}
		time.Sleep(10 * time.Millisecond) // polling another process's state in the database
	}
}

func countRows(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func withParam(t *testing.T, raw, name, value string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
