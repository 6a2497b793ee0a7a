package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RedisServerVar names the redis-server binary that RedisServer returns.
const RedisServerVar = "REPLAYGUARD_TEST_REDIS_SERVER"

// redisStartTimeout bounds how long a started redis-server (or sentinel)
// may take to answer PING, and how long Stop waits after SIGTERM.
const redisStartTimeout = 10 * time.Second

// RedisServer returns the redis-server binary to run: the one named by
// REPLAYGUARD_TEST_REDIS_SERVER, else the one on PATH. Without one, Missing
// skips t (or fails it when Required). A variable that names no file
// fails t.
func RedisServer(t testing.TB) string {
	t.Helper()
	if p := os.Getenv(RedisServerVar); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", RedisServerVar, err)
		}
		return p
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		Missing(t, "no redis-server: set "+RedisServerVar+" or put it on PATH")
	}
	return p
}

// RedisProcess is a private redis-server (or Redis Sentinel) started by
// StartRedis or StartSentinel, on a loopback port and in a temp dir of its
// own. The test's cleanup kills it. Its methods, like t.Fatal, must be
// called from the goroutine running the test.
type RedisProcess struct {
	t    testing.TB
	proc *process
	port int

	// args returns the command line for port: the defaults and the
	// extra arguments given to StartRedis. Restart appends its own.
	args func(port int) ([]string, error)
	// ready, if set, runs after the server answers PING (sentinels use it
	// to shorten their periods).
	ready func(ctx context.Context, addr string)
}

// StartRedis runs bin (a redis-server) on a free loopback port with its
// own temp dir (t.TempDir) as working and data directory, and returns once
// it answers PING. By default it keeps nothing on disk (--save ""
// --appendonly no) and, as a master, starts a full sync to a new replica
// at once (--repl-diskless-sync-delay 0, not after 5s). extra arguments
// come last, so they override the defaults (--appendonly yes) or add to
// them (--replicaof 127.0.0.1 PORT).
// If another process takes the port first, it retries on another one. The
// test's cleanup SIGKILLs it and waits for it to exit. It fails t if the
// server does not start.
func StartRedis(t testing.TB, bin string, extra ...string) *RedisProcess {
	t.Helper()
	dir := t.TempDir()
	extra = append([]string(nil), extra...)
	args := func(port int) ([]string, error) {
		a := []string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--daemonize", "no", "--save", "", "--appendonly", "no",
			"--repl-diskless-sync-delay", "0",
			"--dir", dir, "--logfile", ""}
		return append(a, extra...), nil
	}
	return startRedisProcess(t, bin, dir, "redis.log", args, nil)
}

// startRedisProcess starts the server that args describes and waits for
// PING, trying up to three free ports.
func startRedisProcess(t testing.TB, bin, dir, logName string,
	args func(port int) ([]string, error), ready func(ctx context.Context, addr string)) *RedisProcess {
	t.Helper()
	r := &RedisProcess{
		t:     t,
		proc:  &process{bin: bin, dir: dir, log: filepath.Join(dir, logName)},
		args:  args,
		ready: ready,
	}
	t.Cleanup(r.proc.kill)
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		r.port = FreePort(t)
		var logStart int
		logStart, err = r.start(nil)
		if err == nil {
			return r
		}
		if !strings.Contains(r.proc.outputFrom(logStart), "Address already in use") {
			break
		}
	}
	t.Fatalf("%v\nlog of %s:\n%s", err, filepath.Base(bin), tail(r.proc.output(), 30))
	return nil
}

// start starts the server on r.port with the extra arguments appended and
// waits for PING. It returns the size the log had before, so that callers
// can read what this run wrote.
func (r *RedisProcess) start(more []string) (int, error) {
	logStart := r.proc.logSize()
	args, err := r.args(r.port)
	if err != nil {
		return logStart, err
	}
	args = append(args, more...)
	if err := r.proc.start(args); err != nil {
		return logStart, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), redisStartTimeout)
	defer cancel()
	addr := r.Addr()
	for !isRedisProcess(ctx, addr, r.proc.pid()) {
		select {
		case <-r.proc.exited():
			return logStart, fmt.Errorf("%s on %s exited at start", filepath.Base(r.proc.bin), addr)
		case <-ctx.Done():
			r.proc.kill()
			return logStart, fmt.Errorf("%s on %s did not answer PING within %v",
				filepath.Base(r.proc.bin), addr, redisStartTimeout)
		case <-time.After(20 * time.Millisecond): // polling another process
		}
	}
	if r.ready != nil {
		r.ready(ctx, addr)
	}
	return logStart, nil
}

// isRedisProcess reports whether the server at addr answers PING and is
// process pid: if another process holds the port, ours fails to bind it
// and exits, and must not be taken for started meanwhile.
func isRedisProcess(ctx context.Context, addr string, pid int) bool {
	if !pingRedis(ctx, addr) {
		return false
	}
	v, err := respDo(ctx, addr, "INFO", "server")
	info, _ := v.(string)
	return err == nil && strings.Contains(info, "\nprocess_id:"+strconv.Itoa(pid)+"\r\n")
}

// Addr returns the server's address, 127.0.0.1:PORT.
func (r *RedisProcess) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Port returns the server's loopback port, the same after Restart.
func (r *RedisProcess) Port() int { return r.port }

// Dir returns the server's own temp dir: its working and data directory,
// which also holds its log (and a sentinel's config file).
func (r *RedisProcess) Dir() string { return r.proc.dir }

// Output returns what the server has logged so far, over every run.
func (r *RedisProcess) Output() string { return r.proc.output() }

// Running reports whether the server process has not exited.
func (r *RedisProcess) Running() bool { return r.proc.running() }

// Kill SIGKILLs the server (and anything it forked) and waits for it to
// exit, like a crash: nothing is saved. It does nothing if the server has
// already exited.
func (r *RedisProcess) Kill() {
	r.proc.kill()
}

// Pause sends SIGSTOP: the server stalls, as one descheduled or stuck on
// a slow disk does. It keeps its port and its connections, and the
// kernel still accepts new ones and the commands sent on them, but
// nothing is read or answered until Continue. It does nothing if the
// server has exited.
func (r *RedisProcess) Pause() {
	r.t.Helper()
	if err := r.proc.signal(syscall.SIGSTOP); err != nil {
		r.t.Fatalf("pausing %s: %v", r.Addr(), err)
	}
}

// Continue sends SIGCONT: a paused server runs again and carries out the
// commands that arrived meanwhile, even those whose clients gave up
// waiting. It does nothing if the server has exited.
func (r *RedisProcess) Continue() {
	r.t.Helper()
	if err := r.proc.signal(syscall.SIGCONT); err != nil {
		r.t.Fatalf("continuing %s: %v", r.Addr(), err)
	}
}

// Stop sends SIGTERM, the clean shutdown (which saves if persistence is
// on), and waits up to 10s for the server to exit; past that it kills
// the server and fails t. It does nothing if the server has exited.
func (r *RedisProcess) Stop() {
	r.t.Helper()
	if err := r.proc.signal(syscall.SIGTERM); err != nil {
		r.t.Fatalf("stopping %s: %v", r.Addr(), err)
	}
	if !r.proc.waitExit(redisStartTimeout) {
		r.proc.kill()
		r.t.Fatalf("%s on %s did not exit within %v of SIGTERM; log:\n%s",
			filepath.Base(r.proc.bin), r.Addr(), redisStartTimeout, tail(r.Output(), 30))
	}
}

// Restart starts the server again on the same port and in the same dir,
// with the arguments it was started with plus extra (which replace the
// extra arguments of an earlier Restart), and waits for PING: for
// example Restart("--replicaof", "127.0.0.1", "6390") brings a killed
// master back as a replica. A server still running is stopped first (as
// by Stop). It fails t if the server does not start, for instance because
// another process took the port meanwhile.
func (r *RedisProcess) Restart(extra ...string) {
	r.t.Helper()
	if r.proc.running() {
		r.Stop()
	}
	logStart, err := r.start(extra)
	if err != nil {
		r.t.Fatalf("restarting: %v; log of this run:\n%s", err, tail(r.proc.outputFrom(logStart), 30))
	}
}
