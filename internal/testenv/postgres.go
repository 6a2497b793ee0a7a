package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PostgresBinVar names the directory holding initdb, pg_ctl and postgres
// that PostgresBin returns.
const PostgresBinVar = "REPLAYGUARD_TEST_POSTGRES_BIN"

// postgresTimeout bounds initdb, the wait for a started server to accept
// connections (crash recovery included) and the wait after a stop signal.
const postgresTimeout = 60 * time.Second

// PostgresBin returns the directory holding PostgreSQL's server programs
// (initdb, pg_ctl, postgres): the one named by REPLAYGUARD_TEST_POSTGRES_BIN,
// else the directory of the initdb on PATH with symlinks resolved (so
// /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb gives
// /usr/lib/postgresql/15/bin), else the newest /usr/lib/postgresql/*/bin
// (Debian's layout, which keeps initdb off PATH). Without one, Missing
// skips t (or fails it when Required). A variable that names a directory
// without those programs fails t.
func PostgresBin(t testing.TB) string {
	t.Helper()
	if d := os.Getenv(PostgresBinVar); d != "" {
		if !isPostgresBin(d) {
			t.Fatalf("%s=%s: no initdb, pg_ctl and postgres there", PostgresBinVar, d)
		}
		return d
	}
	if d := findPostgresBin(); d != "" {
		return d
	}
	Missing(t, "no PostgreSQL server programs: set "+PostgresBinVar+
		" or put initdb on PATH (Debian: apt-get install postgresql)")
	return ""
}

// findPostgresBin looks for the server programs on PATH and then in
// /usr/lib/postgresql/*/bin, newest major version first.
func findPostgresBin() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && isPostgresBin(filepath.Dir(real)) {
			return filepath.Dir(real)
		}
		if isPostgresBin(filepath.Dir(p)) {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		return v
	}
	sort.Slice(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, d := range dirs {
		if isPostgresBin(d) {
			return d
		}
	}
	return ""
}

func isPostgresBin(dir string) bool {
	for _, name := range []string{"initdb", "pg_ctl", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// PostgresProcess is a private PostgreSQL cluster made by StartPostgres:
// its own data directory in a temp dir, its own postgres process on a
// loopback port. The test's cleanup kills it and removes the temp dir.
// Its methods, like t.Fatal, must be called from the goroutine running the
// test.
type PostgresProcess struct {
	t    testing.TB
	bin  string
	dir  string // the temp dir: data/, the socket, postgres.log
	port int
	proc *process
}

// StartPostgres makes a cluster with initdb (superuser postgres, trust
// authentication, UTF8, C locale) in a new temp dir and runs postgres on
// it directly, as a child process, listening on 127.0.0.1 on a free port
// with its Unix socket in the temp dir, and with fsync off (the data is
// thrown away). It returns once the server accepts connections and fails
// t if it does not start. PostgreSQL refuses to run as root: when the
// test runs as root, initdb and postgres run as the postgres user if
// there is one, else as nobody, and the temp dir (mode 0700) is theirs.
// The test's cleanup SIGKILLs the server and its backends, waits, and
// removes the temp dir (and the shared memory a killed server leaves).
func StartPostgres(t testing.TB) *PostgresProcess {
	t.Helper()
	bin := PostgresBin(t)
	cred, err := postgresCredential()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(postgresTempRoot(cred != nil), "replayguard-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	p := &PostgresProcess{
		t:   t,
		bin: bin,
		dir: dir,
		proc: &process{
			bin:  filepath.Join(bin, "postgres"),
			dir:  dir,
			log:  filepath.Join(dir, "postgres.log"),
			env:  postgresEnv(),
			cred: cred,
		},
	}
	t.Cleanup(func() {
		p.proc.kill()
		p.removeSharedMemory()
	})

	if err := p.initdb(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, tail(p.Output(), 30))
	}
	for attempt := 0; attempt < 3; attempt++ {
		p.port = FreePort(t)
		var logStart int
		logStart, err = p.start()
		if err == nil {
			return p
		}
		if !strings.Contains(p.proc.outputFrom(logStart), "Address already in use") {
			break
		}
	}
	t.Fatalf("%v\npostgres log:\n%s", err, tail(p.Output(), 30))
	return nil
}

// postgresCredential returns who initdb and postgres run as: nil (the
// test's user) unless that is root, else the postgres user or nobody.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			errs = append(errs, fmt.Errorf("user %s: uid %q gid %q", name, u.Uid, u.Gid))
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	return nil, fmt.Errorf("running as root, and no user to run PostgreSQL as: %w", errors.Join(errs...))
}

// postgresTempRoot returns where to make the cluster's temp dir: the
// usual temp dir, unless another user must reach into it and one of its
// ancestors does not let others through (a private TMPDIR), then /tmp.
func postgresTempRoot(otherUser bool) string {
	root := os.TempDir()
	if !otherUser {
		return root
	}
	for d := root; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if d == filepath.Dir(d) {
			return root
		}
	}
}

// postgresEnv is the test's environment without the PG* variables that
// would steer initdb or postgres elsewhere, and with the C locale.
func postgresEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C", "LANG=C")
}

// initdb makes the cluster in DataDir, as the server's user, writing to
// the server's log.
func (p *PostgresProcess) initdb() error {
	ctx, cancel := context.WithTimeout(context.Background(), postgresTimeout)
	defer cancel()
	out, err := os.OpenFile(p.proc.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(p.bin, "initdb"),
		"-D", p.DataDir(), "-U", "postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	cmd.Dir = p.dir
	cmd.Env = p.proc.env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.proc.cred}
	return cmd.Run()
}

// start runs postgres on p.port and waits until it accepts connections.
// It returns the size the log had before, so that callers can read what
// this run wrote.
func (p *PostgresProcess) start() (int, error) {
	logStart := p.proc.logSize()
	err := p.proc.start([]string{
		"-D", p.DataDir(), "-p", strconv.Itoa(p.port), "-k", p.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
	})
	if err != nil {
		return logStart, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), postgresTimeout)
	defer cancel()
	var last error
	for {
		if last = pgReady(ctx, p.Addr()); last == nil {
			if last = p.checkPidFile(); last == nil {
				return logStart, nil
			}
		}
		select {
		case <-p.proc.exited():
			return logStart, fmt.Errorf("postgres on %s exited at start", p.Addr())
		case <-ctx.Done():
			p.proc.kill()
			return logStart, fmt.Errorf("postgres on %s did not accept connections within %v: %v",
				p.Addr(), postgresTimeout, last)
		case <-time.After(20 * time.Millisecond): // polling another process
		}
	}
}

// removeSharedMemory removes the System V shared memory segment that a
// killed server leaves behind (a clean shutdown removes it, and so does
// the next start on the same data directory, but the cleanup removes the
// directory). The segment is the one named in postmaster.pid, which only
// a server that did not shut down cleanly leaves. Best effort: it needs
// ipcrm (util-linux); a leftover segment is 56 bytes.
func (p *PostgresProcess) removeSharedMemory() {
	b, err := os.ReadFile(filepath.Join(p.DataDir(), "postmaster.pid"))
	if err != nil {
		return
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 7 {
		return
	}
	f := strings.Fields(lines[6]) // shared memory key, segment id
	if len(f) != 2 {
		return
	}
	if _, err := strconv.Atoi(f[1]); err != nil {
		return
	}
	if ipcrm, err := exec.LookPath("ipcrm"); err == nil {
		_ = exec.Command(ipcrm, "-m", f[1]).Run()
	}
}

// checkPidFile checks that postmaster.pid names the running postgres as
// ready: if another server holds the port, ours fails to bind it and
// exits, and must not be taken for started because the other one answers.
func (p *PostgresProcess) checkPidFile() error {
	b, err := os.ReadFile(filepath.Join(p.DataDir(), "postmaster.pid"))
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 8 || strings.TrimSpace(lines[0]) != strconv.Itoa(p.proc.pid()) ||
		strings.TrimSpace(lines[3]) != strconv.Itoa(p.port) || strings.TrimSpace(lines[7]) != "ready" {
		return fmt.Errorf("postmaster.pid does not show this server ready: %q", b)
	}
	return nil
}

// URL returns the connection URL for the superuser postgres and database
// postgres over TCP: postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable.
func (p *PostgresProcess) URL() string {
	return "postgres://postgres@" + p.Addr() + "/postgres?sslmode=disable"
}

// Addr returns the server's address, 127.0.0.1:PORT.
func (p *PostgresProcess) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port))
}

// Port returns the server's loopback port, the same after Start.
func (p *PostgresProcess) Port() int { return p.port }

// Dir returns the temp dir that holds the data directory, the server's
// Unix socket and its log.
func (p *PostgresProcess) Dir() string { return p.dir }

// DataDir returns the cluster's data directory.
func (p *PostgresProcess) DataDir() string { return filepath.Join(p.dir, "data") }

// Bin returns the directory of the PostgreSQL programs in use (PostgresBin).
func (p *PostgresProcess) Bin() string { return p.bin }

// Output returns what initdb and every run of the server have logged.
func (p *PostgresProcess) Output() string { return p.proc.output() }

// Running reports whether the postgres process has not exited.
func (p *PostgresProcess) Running() bool { return p.proc.running() }

// Kill SIGKILLs the server and all its backends, like a crash or an
// out-of-memory kill, and waits until they are gone. Start afterwards runs
// crash recovery. It does nothing if the server has already exited.
func (p *PostgresProcess) Kill() { p.proc.kill() }

// Stop asks for a fast shutdown (SIGINT: open transactions are rolled
// back, clients disconnected) and waits up to a minute for the server to
// exit; past that it kills it and fails t. It does nothing if the server
// has already exited.
func (p *PostgresProcess) Stop() {
	p.t.Helper()
	if err := p.proc.signal(syscall.SIGINT); err != nil {
		p.t.Fatalf("stopping postgres on %s: %v", p.Addr(), err)
	}
	if !p.proc.waitExit(postgresTimeout) {
		p.proc.kill()
		p.t.Fatalf("postgres on %s did not exit within %v of SIGINT; log:\n%s",
			p.Addr(), postgresTimeout, tail(p.Output(), 30))
	}
	p.proc.kill() // nothing left but, belt and braces, the group
}

// Start starts the server again, on the same data directory and port,
// after Kill or Stop, and waits until it accepts connections. It fails t
// if the server is still running or does not start (for instance because
// another process took the port meanwhile).
func (p *PostgresProcess) Start() {
	p.t.Helper()
	if p.proc.running() {
		p.t.Fatalf("postgres on %s is already running", p.Addr())
	}
	if logStart, err := p.start(); err != nil {
		p.t.Fatalf("%v; log of this run:\n%s", err, tail(p.proc.outputFrom(logStart), 30))
	}
}

// Psql runs sql with psql (from Bin, else PATH) against the server,
// unaligned and without headers, stopping at the first error, and returns
// its standard output; the error includes psql's standard error. It is
// for test set-up and checks that need no Go driver.
func (p *PostgresProcess) Psql(ctx context.Context, sql string) (string, error) {
	psql := filepath.Join(p.bin, "psql")
	if _, err := os.Stat(psql); err != nil {
		if psql, err = exec.LookPath("psql"); err != nil {
			return "", fmt.Errorf("no psql in %s or on PATH", p.bin)
		}
	}
	cmd := exec.CommandContext(ctx, psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
		"-d", p.URL(), "-c", sql)
	cmd.Env = postgresEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("psql -c %q: %w: %s", sql, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// pgReady reports (nil) whether the PostgreSQL server at addr lets the
// user postgres into the database postgres: it sends a protocol 3.0
// startup message and reads until ReadyForQuery. An error response, such
// as 57P03 while the server starts or recovers, is returned as an error.
// This is what pg_isready checks, without a process per poll or a driver.
func pgReady(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	params := "user\x00postgres\x00database\x00postgres\x00\x00"
	msg := make([]byte, 8, 8+len(params))
	binary.BigEndian.PutUint32(msg[0:], uint32(8+len(params)))
	binary.BigEndian.PutUint32(msg[4:], 3<<16) // protocol 3.0
	msg = append(msg, params...)
	if _, err := c.Write(msg); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint32(hdr[1:])) - 4
		if n < 0 || n > 1<<20 {
			return fmt.Errorf("postgres: bad message length %d", n)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return err
		}
		switch hdr[0] {
		case 'R': // authentication request; 0 is AuthenticationOk
			if n >= 4 && binary.BigEndian.Uint32(body) != 0 {
				return fmt.Errorf("postgres asks for authentication (method %d)", binary.BigEndian.Uint32(body))
			}
		case 'E':
			return fmt.Errorf("postgres: %s", pgErrorText(body))
		case 'Z': // ReadyForQuery
			_, _ = c.Write([]byte{'X', 0, 0, 0, 4}) // Terminate
			return nil
		}
	}
}

// pgErrorText renders an ErrorResponse body: its severity, code and message.
func pgErrorText(body []byte) string {
	var sev, code, msg string
	for _, f := range bytes.Split(body, []byte{0}) {
		if len(f) < 1 {
			continue
		}
		switch f[0] {
		case 'S':
			sev = string(f[1:])
		case 'C':
			code = string(f[1:])
		case 'M':
			msg = string(f[1:])
		}
	}
	return fmt.Sprintf("%s %s %s", sev, code, msg)
}
