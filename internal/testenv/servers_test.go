package testenv

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// These tests start real servers: they skip without redis-server or the
// PostgreSQL programs, and fail then under REPLAYGUARD_TEST_REQUIRE=1 or
// CI=true.

func do(t *testing.T, addr string, args ...string) any {
	t.Helper()
	v, err := respDoTimeout(context.Background(), 15*time.Second, addr, args...)
	if err != nil {
		t.Fatalf("%s %v: %v", addr, args, err)
	}
	return v
}

// setAndWait sets key to value on the master at addr and waits (WAIT, on
// the same connection) until one replica has acknowledged it.
func setAndWait(t *testing.T, addr, key, value string, s *SentinelSetup) {
	t.Helper()
	v, err := respPipeline(context.Background(), 15*time.Second, addr,
		[]string{"SET", key, value}, []string{"WAIT", "1", "10000"})
	if err != nil {
		t.Fatalf("SET %s and WAIT on %s: %v", key, addr, err)
	}
	if v[1] != int64(1) {
		t.Fatalf("WAIT 1 after SET %s on %s = %v: no replica acknowledged it\n%s", key, addr, v[1], s.Logs())
	}
}

func TestRedisStopRestartKill(t *testing.T) {
	t.Parallel()
	r := StartRedis(t, RedisServer(t), "--appendonly", "yes")
	addr, dir := r.Addr(), r.Dir()
	if !strings.HasPrefix(addr, "127.0.0.1:") || r.Port() == 0 {
		t.Fatalf("Addr %q Port %d", addr, r.Port())
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("Dir %q: %v", dir, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Another process answering on the port is not taken for this one.
	if !isRedisProcess(ctx, addr, r.proc.pid()) || isRedisProcess(ctx, addr, r.proc.pid()+1) {
		t.Fatal("isRedisProcess does not tell this server from another")
	}
	do(t, addr, "SET", "k", "v1")

	// A clean stop keeps the append-only file, so the key survives.
	r.Stop()
	if r.Running() {
		t.Fatal("still running after Stop")
	}
	if pingRedis(ctx, addr) {
		t.Fatal("PING answered after Stop")
	}
	r.Restart()
	if r.Addr() != addr || r.Dir() != dir {
		t.Fatalf("Restart moved to %s %s, want %s %s", r.Addr(), r.Dir(), addr, dir)
	}
	if got := do(t, addr, "GET", "k"); got != "v1" {
		t.Fatalf("GET k after Stop and Restart = %v, want v1", got)
	}

	// Kill is a crash: the process is gone at once, and comes back.
	r.Kill()
	if r.Running() || pingRedis(ctx, addr) {
		t.Fatal("still answering after Kill")
	}
	r.Kill() // a second Kill does nothing
	r.Restart("--appendonly", "no")
	if got := do(t, addr, "CONFIG", "GET", "appendonly"); !strings.Contains(strings.Join(toStrings(got), " "), "no") {
		t.Fatalf("Restart extra arguments not applied: appendonly = %v", got)
	}
	// Restart of a running server stops it first.
	r.Restart()
	if got := do(t, addr, "CONFIG", "GET", "appendonly"); !strings.Contains(strings.Join(toStrings(got), " "), "yes") {
		t.Fatalf("StartRedis arguments lost on Restart: appendonly = %v", got)
	}
	if out := r.Output(); strings.Count(out, "Ready to accept connections") < 4 {
		t.Fatalf("Output should hold the log of all four runs:\n%s", out)
	}
}

func toStrings(v any) []string {
	a, _ := v.([]any)
	var out []string
	for _, e := range a {
		s, _ := e.(string)
		out = append(out, s)
	}
	return out
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s := StartSentinel(t, RedisServer(t))
	t.Logf("sentinel setup ready in %v", time.Since(start).Round(time.Millisecond))
	if s.MasterName == "" || len(s.SentinelAddrs()) != 3 {
		t.Fatalf("MasterName %q, SentinelAddrs %v", s.MasterName, s.SentinelAddrs())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	old := s.Master().Addr()
	if cur, err := s.CurrentMaster(ctx); err != nil || cur != old {
		t.Fatalf("CurrentMaster = %q, %v; want %s", cur, err, old)
	}
	setAndWait(t, old, "k", "before", s)

	// The master crashes; the sentinels promote the replica.
	start = time.Now()
	s.Master().Kill()
	newMaster, err := s.WaitForNewMaster(ctx, old)
	if err != nil {
		t.Fatalf("%v\n%s", err, s.Logs())
	}
	t.Logf("failover done in %v", time.Since(start).Round(time.Millisecond))
	if newMaster != s.Replica().Addr() {
		t.Fatalf("new master %s, want the replica %s", newMaster, s.Replica().Addr())
	}
	if cur, err := s.CurrentMaster(ctx); err != nil || cur != newMaster {
		t.Fatalf("CurrentMaster = %q, %v; want %s", cur, err, newMaster)
	}
	if got := do(t, newMaster, "GET", "k"); got != "before" {
		t.Fatalf("GET k on the new master = %v, want before\n%s", got, s.Logs())
	}

	// The old master comes back as a replica of the new one.
	host, port, _ := net.SplitHostPort(newMaster)
	s.Master().Restart("--replicaof", host, port)
	setAndWait(t, newMaster, "k", "after", s)
	if got := do(t, old, "GET", "k"); got != "after" {
		t.Fatalf("GET k on the old master, now a replica = %v, want after\n%s", got, s.Logs())
	}
}

func TestPostgresKillStopStart(t *testing.T) {
	t.Parallel()
	start := time.Now()
	p := StartPostgres(t)
	t.Logf("initdb and start in %v", time.Since(start).Round(time.Millisecond))
	want := "postgres://postgres@127.0.0.1:" + strconv.Itoa(p.Port()) + "/postgres?sslmode=disable"
	if p.URL() != want {
		t.Fatalf("URL = %q, want %q", p.URL(), want)
	}
	if fi, err := os.Stat(p.Dir()); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("temp dir %s: %v, mode %v; want 0700", p.Dir(), err, fi.Mode().Perm())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	psql := func(sql string) string {
		t.Helper()
		out, err := p.Psql(ctx, sql)
		if err != nil {
			t.Fatalf("%v\n%s", err, tail(p.Output(), 20))
		}
		return strings.TrimSpace(out)
	}
	if got := psql("SELECT 1"); got != "1" {
		t.Fatalf("SELECT 1 = %q", got)
	}
	psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")

	// A crash: everything is gone at once; Start runs crash recovery.
	p.Kill()
	if p.Running() {
		t.Fatal("still running after Kill")
	}
	if err := pgReady(ctx, p.Addr()); err == nil {
		t.Fatal("accepting connections after Kill")
	}
	start = time.Now()
	p.Start()
	t.Logf("start after Kill in %v", time.Since(start).Round(time.Millisecond))
	if got := psql("SELECT 1"); got != "1" {
		t.Fatalf("SELECT 1 after Kill and Start = %q", got)
	}

	// A fast shutdown keeps what was committed.
	psql("CREATE TABLE IF NOT EXISTS t (v int); INSERT INTO t VALUES (2)")
	p.Stop()
	if p.Running() {
		t.Fatal("still running after Stop")
	}
	p.Start()
	if got := psql("SELECT count(*) FROM t WHERE v = 2"); got != "1" {
		t.Fatalf("rows kept after Stop and Start = %q, want 1", got)
	}
}

func TestFindPostgresBin(t *testing.T) {
	d := findPostgresBin()
	if d == "" {
		Missing(t, "no PostgreSQL server programs found")
	}
	if !isPostgresBin(d) {
		t.Fatalf("findPostgresBin = %s, which lacks the server programs", d)
	}
	// The real directory, not that of a symlink to initdb on PATH.
	if real, err := filepath.EvalSymlinks(filepath.Join(d, "initdb")); err != nil || filepath.Dir(real) != d {
		t.Fatalf("findPostgresBin = %s, but initdb there is %s (%v)", d, real, err)
	}
	t.Setenv(PostgresBinVar, d)
	if got := PostgresBin(t); got != d {
		t.Fatalf("PostgresBin with %s=%s = %s", PostgresBinVar, d, got)
	}
}

func TestRedisPauseContinue(t *testing.T) {
	t.Parallel()
	r := StartRedis(t, RedisServer(t))
	addr := r.Addr()
	do(t, addr, "SET", "k", "v1")

	r.Pause()
	ctx := context.Background()
	// A command sent while paused gets no answer; its client gives up.
	if v, err := respDoTimeout(ctx, 200*time.Millisecond, addr, "SET", "k", "v2"); err == nil {
		t.Fatalf("SET answered %v while paused", v)
	}
	if !r.Running() {
		t.Fatal("a paused server is not running")
	}
	r.Pause() // a second Pause does nothing more

	r.Continue()
	// The paused server carried out the command its client gave up on.
	if got := do(t, addr, "GET", "k"); got != "v2" {
		t.Fatalf("GET k after Continue = %v, want v2", got)
	}
	r.Continue() // a server that runs is unaffected
	if got := do(t, addr, "PING"); got != "PONG" {
		t.Fatalf("PING = %v", got)
	}
}
