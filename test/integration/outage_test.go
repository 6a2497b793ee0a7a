package integration

import (
	"bufio"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/handlers"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/token"
)

// storeTimeout is the outage test's REPLAYGUARD_STORE_TIMEOUT. The calls
// before the outage and after the restart must succeed inside it on a
// loaded machine, where a script's round trip has been seen to take
// 300ms; the calls while Redis hangs wait it out.
const storeTimeout = time.Second

// outageBound is how long a request may take while Redis is down. It is
// far above storeTimeout so the test is not flaky on a loaded machine,
// and far below what a request would take without the store's deadline
// (as long as Redis stays stopped).
const outageBound = 5 * time.Second

// redisServerBinary returns the redis-server to run: the one in
// REPLAYGUARD_TEST_REDIS_SERVER, else the one on PATH. Without one the
// test is skipped, or fails when REPLAYGUARD_TEST_REQUIRE=1 or CI=true.
func redisServerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(envRedisServer); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", envRedisServer, err)
		}
		return p
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		if required() {
			t.Fatalf("no redis-server: set %s or put it on PATH (%v)", envRedisServer, err)
		}
		t.Skipf("no redis-server: set %s or put it on PATH", envRedisServer)
	}
	return p
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// redisProcess is a disposable redis-server, without persistence unless
// asked for.
type redisProcess struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited and been waited for
}

// startRedis runs bin on 127.0.0.1:port in dir and waits until it answers
// PING. extra arguments come last, so they override the defaults (such as
// --appendonly yes for persistence). The test's cleanup kills it if it is
// still running.
func startRedis(t *testing.T, bin string, port int, dir string, extra ...string) *redisProcess {
	t.Helper()
	log := filepath.Join(dir, "redis-"+strconv.FormatInt(time.Now().UnixNano(), 36)+".log")
	out, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no"}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	p := &redisProcess{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})

	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for !pingRedis(addr) {
		select {
		case <-p.done:
			t.Fatalf("redis-server exited at start: %s", p.output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer PING within 10s: %s", addr, p.output())
		}
		time.Sleep(20 * time.Millisecond) // waiting on another process
	}
	return p
}

// stop sends SIGTERM and waits for the process to exit.
func (p *redisProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("redis-server did not exit within 10s of SIGTERM: %s", p.output())
	}
}

func (p *redisProcess) output() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// pingRedis reports whether a Redis at addr answers PING with PONG.
func pingRedis(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "+PONG\r\n"
}

// wantFailsClosed requires send to answer 503 store_unavailable, without
// a token, within outageBound, and logs how long it took.
func wantFailsClosed(t *testing.T, send func() reply) {
	t.Helper()
	start := time.Now()
	r := send()
	took := time.Since(start)
	t.Logf("answered %d in %v", r.Status, took)
	wantProblem(t, r, http.StatusServiceUnavailable, "store_unavailable")
	noToken(t, nil, r, issued{})
	if took >= outageBound {
		t.Errorf("took %v, want under %v (store timeout %v)", took, outageBound, storeTimeout)
	}
}

// TestRedisOutage stops a disposable Redis under a running server and
// starts it again: while it is down every store-backed request fails
// closed with 503 store_unavailable, quickly; afterwards the server
// recovers on its own.
func TestRedisOutage(t *testing.T) {
	bin := redisServerBinary(t)
	dir := t.TempDir()
	port := freePort(t)
	rp := startRedis(t, bin, port, dir)

	// Wired as cmd/server's openStore wires REPLAYGUARD_REDIS_URL with
	// REPLAYGUARD_STORE_TIMEOUT set to storeTimeout.
	opt, err := goredis.ParseURL("redis://127.0.0.1:" + strconv.Itoa(port) + "/0")
	if err != nil {
		t.Fatal(err)
	}
	opt.ContextTimeoutEnabled = true
	opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = storeTimeout, storeTimeout, storeTimeout, storeTimeout
	st := redisstore.New(goredis.NewClient(opt), redisstore.WithPrefix(uniquePrefix(t)), redisstore.WithTimeout(storeTimeout))
	// The default issue rate, counted in Redis, as cmd/server runs it.
	// Callers with the API key skip the limiter and reach PutToken.
	s := startServer(t, st, serverConfig{apiOpts: []handlers.Option{
		handlers.WithAPIKeys(apiKey),
		handlers.WithIssueRate(st, handlers.DefaultIssueRate),
	}})

	// Before: everything works.
	before := s.issue(t, "")
	wantRedeemed(t, s.redeem(t, before.Token, "", bearer...), before.ID, token.DefaultPurpose, "")
	pending := s.issue(t, "", bearer...)
	if r := s.do(t, http.MethodGet, "/readyz", ""); r.Status != http.StatusOK {
		t.Fatalf("readyz before the outage: %d %s", r.Status, r.Body)
	}

	// A Redis that stops answering (its socket still accepts): only the
	// context deadline ends the calls.
	hung := s.issue(t, "", bearer...)
	if err := rp.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		send func() reply
	}{
		{"issue", func() reply { return s.do(t, http.MethodPost, "/v1/tokens", "", bearer...) }},
		{"redeem", func() reply { return s.redeem(t, hung.Token, "", bearer...) }},
		{"readyz", func() reply { return s.do(t, http.MethodGet, "/readyz", "") }},
	} {
		t.Run("while Redis hangs: "+c.name, func(t *testing.T) { wantFailsClosed(t, c.send) })
	}
	if err := rp.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}

	rp.stop(t)

	outage := []struct {
		name string
		send func() reply
	}{
		{"issue through the rate limiter", func() reply { return s.do(t, http.MethodPost, "/v1/tokens", "") }},
		{"issue with the API key", func() reply { return s.do(t, http.MethodPost, "/v1/tokens", "", bearer...) }},
		{"redeem", func() reply { return s.redeem(t, pending.Token, "", bearer...) }},
		{"readyz", func() reply { return s.do(t, http.MethodGet, "/readyz", "") }},
		{"redeem again", func() reply { return s.redeem(t, pending.Token, "", bearer...) }},
	}
	for _, c := range outage {
		t.Run("while Redis is down: "+c.name, func(t *testing.T) { wantFailsClosed(t, c.send) })
	}

	rp = startRedis(t, bin, port, dir)
	start := time.Now()
	var after issued
	for attempt := 1; ; attempt++ {
		r := s.do(t, http.MethodPost, "/v1/tokens", "", bearer...)
		if r.Status == http.StatusCreated {
			decode(t, r, &after)
			t.Logf("issue succeeded %v after the restart, on attempt %d", time.Since(start), attempt)
			break
		}
		wantProblem(t, r, http.StatusServiceUnavailable, "store_unavailable")
		if time.Since(start) > 10*time.Second {
			t.Fatalf("issue still fails 10s after Redis restarted: %s", r.Body)
		}
		time.Sleep(100 * time.Millisecond) // waiting on another process
	}

	t.Run("after the restart a new token redeems exactly once", func(t *testing.T) {
		wantRedeemed(t, s.redeem(t, after.Token, "", bearer...), after.ID, token.DefaultPurpose, "")
		wantProblem(t, s.redeem(t, after.Token, "", bearer...), http.StatusConflict, "token_used")
	})
	t.Run("after the restart readyz is ready", func(t *testing.T) {
		if r := s.do(t, http.MethodGet, "/readyz", ""); r.Status != http.StatusOK {
			t.Errorf("readyz: %d %s", r.Status, r.Body)
		}
	})
	t.Run("after the restart the rate-limited path issues again", func(t *testing.T) {
		s.issue(t, "")
	})
	t.Run("a token issued before the outage is gone with the unpersisted data", func(t *testing.T) {
		// The restarted Redis lost it (no persistence): it can never be
		// redeemed, which is the fail-closed side.
		wantProblem(t, s.redeem(t, pending.Token, "", bearer...), http.StatusConflict, "token_used")
	})
	if t.Failed() {
		t.Logf("redis-server log:\n%s", rp.output())
	}
}
