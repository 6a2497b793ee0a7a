package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePort returns a loopback TCP port that was free a moment ago. Another
// process may take it before the caller binds it; StartRedis and
// StartPostgres retry on a new port when that happens.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("finding a free loopback port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// process is one server child process that can be started again after it
// exits. It runs in its own process group, and kill reaches every process
// it forked. It writes stdout and stderr, start after start, to one log
// file.
type process struct {
	bin  string
	dir  string              // working directory
	log  string              // log file, appended to by every start
	env  []string            // nil: the test's environment
	cred *syscall.Credential // nil: run as the test's user

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited and been waited for
}

// start runs p.bin with args. The previous run, if any, must have exited.
func (p *process) start(args []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("%s is still running", filepath.Base(p.bin))
		}
	}
	out, err := os.OpenFile(p.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close() // the child has its own copy
	fmt.Fprintf(out, "--- testenv: %s %s\n", p.bin, strings.Join(args, " "))
	cmd := exec.Command(p.bin, args...)
	cmd.Dir = p.dir
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// exited returns a channel closed once the current run has exited; for a
// process never started it is already closed.
func (p *process) exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return p.done
}

// pid returns the pid of the current run (0 before the first).
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// running reports whether the current run has not exited yet.
func (p *process) running() bool {
	select {
	case <-p.exited():
		return false
	default:
		return true
	}
}

// signal sends sig to the main process of the current run, if it runs.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// waitExit waits up to d for the current run to exit.
func (p *process) waitExit(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.exited():
		return true
	case <-timer.C:
		return false
	}
}

// kill SIGKILLs the current run with everything it forked and waits until
// its main process has been waited for and none of the others is alive
// (bounded: a few seconds). The children are found by parent pid while the
// main process is held with SIGSTOP, so that it cannot fork meanwhile:
// PostgreSQL's backends, for one, each call setsid, so the process group
// alone would miss them, and one left attached to the shared memory would
// keep the next postgres from starting. It does nothing once the run has
// exited and been waited for.
func (p *process) kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	// Signal through os.Process, which never reaches a reused pid.
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		<-done
		return
	}
	pid := cmd.Process.Pid
	kids := descendants(pid)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = syscall.Kill(-pid, syscall.SIGKILL) // its process group: a Redis fork
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	<-done
	deadline := time.Now().Add(5 * time.Second)
	for _, k := range kids {
		for alive(k) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling the kernel for another process
		}
	}
}

// procStat returns the state and the parent pid of process pid, from
// /proc/PID/stat.
func procStat(pid string) (state string, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return "", 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0], ppid, err == nil
}

// descendants returns the pids of every live descendant of pid, from
// /proc (none where there is no /proc).
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid, ok := procStat(e.Name()); ok && state != "Z" && state != "X" {
			children[ppid] = append(children[ppid], n)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		c := children[queue[0]]
		queue = append(queue[1:], c...)
		out = append(out, c...)
	}
	return out
}

// alive reports whether process pid exists and is not a zombie. Orphans
// are reparented to init, which may leave them zombies for a while; a
// zombie holds no memory, ports or locks.
func alive(pid int) bool {
	state, _, ok := procStat(strconv.Itoa(pid))
	return ok && state != "Z" && state != "X"
}

// output returns the log of every run so far.
func (p *process) output() string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// outputFrom returns the log from byte n on: what the runs since the log
// had n bytes wrote.
func (p *process) outputFrom(n int) string {
	s := p.output()
	if n < 0 || n > len(s) {
		return s
	}
	return s[n:]
}

// logSize returns the size of the log so far (0 before the first run).
func (p *process) logSize() int {
	fi, err := os.Stat(p.log)
	if err != nil {
		return 0
	}
	return int(fi.Size())
}

// tail returns the last n lines of s, for error messages.
func tail(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append([]string{"..."}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
