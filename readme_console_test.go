package replayguard_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
)

// A ```console block of README.md is a transcript: lines that start with
// "$ " are commands (a line ending in a backslash continues on the next),
// the lines after a command are what it prints. TestReadmeConsoleBlocks
// pastes every block, in README order, into one bash session against a
// server of its own, as a reader would into one shell.
//
// A block is run unless the line before its fence is a marker:
//
//	<!-- readme-test: skip <reason> -->
//
// for a block that needs what the test cannot give it (PostgreSQL, the
// npm registry); the reason is required and is logged as the block's
// subtest skips. A fenced block of another language before which
//
//	<!-- readme-test: file <name> -->
//
// stands is a file the reader writes: its text becomes the file <name> in
// the session's directory when the blocks before it have run.
//
// What the README shows is compared with what the commands print after
// both are normalised (readmeVolatile): values that differ on every run
// become placeholders, so the README shows real values from a real run
// and the test ignores only which ones. The README may shorten a token
// with "…". Line endings are compared without the \r of HTTP headers, and
// an output that lacks a final newline (a JSON body from curl -s) counts
// as having one, since the README starts the next "$ " on its own line.

// readmeVolatile are the values that differ on every run, in the order
// they are replaced.
var readmeVolatile = []struct {
	re *regexp.Regexp
	to string
}{
	{regexp.MustCompile(`eyJ[A-Za-z0-9_.…-]+`), "<jwt>"},                                             // a token, whole or shortened
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)`), "<rfc3339>"}, // expires_at, lease_expires_at
	{regexp.MustCompile(`(?m)^Date: .*$`), "Date: <http-date>"},                                      // the Date header
	{regexp.MustCompile(`\b[0-9a-f]{32}\b`), "<hex32>"},                                              // request IDs, leases
	{regexp.MustCompile(`\b\d{16,20}\b`), "<sonyflake>"},                                             // token IDs
}

// normaliseConsole returns s with its volatile values replaced, \r\n as
// \n, and a final newline.
func normaliseConsole(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	for _, v := range readmeVolatile {
		s = v.re.ReplaceAllString(s, v.to)
	}
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s
}

// consoleBlock is a ```console block of README.md, or a file block.
type consoleBlock struct {
	line int    // of its fence
	skip string // the reason of its skip marker, or ""
	cmds []consoleCmd
	// file names the file a block with a file marker is, and content is
	// its text.
	file, content string
}

// consoleCmd is one "$ " command of a block and the output shown for it.
type consoleCmd struct {
	line int    // of its "$ "
	text string // without "$ ", continuation lines included
	want string // what the README shows it print
}

var readmeMarker = regexp.MustCompile(`^<!-- readme-test: (.*) -->$`)

// readmeConsole returns README.md's console blocks.
func readmeConsole(t *testing.T) []consoleBlock {
	t.Helper()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	var blocks []consoleBlock
	marker, markerLine := "", 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := readmeMarker.FindStringSubmatch(line); m != nil {
			marker, markerLine = m[1], i+1
			continue
		}
		if name, ok := strings.CutPrefix(marker, "file "); ok && strings.HasPrefix(line, "```") && line != "```console" {
			b := consoleBlock{line: i + 1, file: strings.TrimSpace(name)}
			if b.file == "" || b.file != filepath.Base(b.file) {
				t.Errorf("README.md:%d: marker %q: want \"file <name>\", a name without a directory", markerLine, marker)
			}
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				b.content += lines[i] + "\n"
			}
			blocks, marker = append(blocks, b), ""
			continue
		}
		if line == "```console" {
			b := consoleBlock{line: i + 1}
			if marker != "" {
				reason, ok := strings.CutPrefix(marker, "skip ")
				if !ok || strings.TrimSpace(reason) == "" {
					t.Errorf("README.md:%d: marker %q: want \"skip <reason>\" before a console block", markerLine, marker)
				}
				b.skip, marker = strings.TrimSpace(reason), ""
			}
			for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				switch text, ok := strings.CutPrefix(lines[i], "$ "); {
				case ok:
					c := consoleCmd{line: i + 1, text: text}
					for strings.HasSuffix(c.text, `\`) && i+1 < len(lines) {
						i++
						c.text += "\n" + lines[i]
					}
					b.cmds = append(b.cmds, c)
				case len(b.cmds) == 0:
					t.Errorf("README.md:%d: console block shows output before any \"$ \" command", i+1)
				default:
					b.cmds[len(b.cmds)-1].want += lines[i] + "\n"
				}
			}
			blocks = append(blocks, b)
			continue
		}
		if marker != "" && strings.TrimSpace(line) != "" {
			t.Errorf("README.md:%d: marker not followed by a fenced block", markerLine)
			marker = ""
		}
	}
	return blocks
}

// readmeShell is a bash session commands are pasted into one at a time.
type readmeShell struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string // bash's stdout and stderr, line by line
}

const shellDone = "__readme_test_done__"

func startShell(t *testing.T, dir string, env []string) *readmeShell {
	t.Helper()
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir, cmd.Env = dir, env
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	sh := &readmeShell{cmd: cmd, in: in, lines: make(chan string, 64)}
	go func() {
		defer close(sh.lines)
		br := bufio.NewReader(r)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				sh.lines <- line
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return sh
}

// run pastes text into the session and returns what it printed. Its
// stdin is /dev/null, so that no command reads the commands after it.
func (sh *readmeShell) run(text string, timeout time.Duration) (string, error) {
	if _, err := fmt.Fprintf(sh.in, "{ %s\n} </dev/null\nprintf '\\n%s\\n'\n", text, shellDone); err != nil {
		return "", fmt.Errorf("bash has exited: %w", err)
	}
	var out strings.Builder
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-sh.lines:
			if !ok {
				return out.String(), errors.New("bash has exited")
			}
			if line == shellDone+"\n" {
				s := out.String()
				return strings.TrimSuffix(s, "\n"), nil // the newline before the marker is printf's
			}
			out.WriteString(line)
		case <-deadline:
			sh.cmd.Process.Kill()
			return out.String(), fmt.Errorf("no end after %v: bash killed", timeout)
		}
	}
}

// readmeServer is a server the session started in the background.
type readmeServer struct {
	pid  int
	addr string
	log  string
}

// startServer runs command, a command line that starts the server in the
// foreground, in the background of sh with its output to log, and waits
// until the server answers /healthz.
func startServer(sh *readmeShell, command, addr, log string) (*readmeServer, error) {
	out, err := sh.run(command+" >"+strconv.Quote(log)+" 2>&1 & echo $!", 10*time.Second)
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return nil, fmt.Errorf("printed %q, not its PID", out)
	}
	s := &readmeServer{pid: pid, addr: addr, log: log}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get("http://" + addr + "/healthz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if syscall.Kill(pid, 0) != nil {
			break
		}
	}
	s.stop()
	return nil, fmt.Errorf("server did not answer /healthz on %s:\n%s", addr, s.output())
}

// stop ends the server with SIGTERM, as Ctrl-C would, and waits until
// its port is free again.
func (s *readmeServer) stop() {
	if syscall.Kill(s.pid, syscall.SIGTERM) != nil {
		return
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		res, err := http.Get("http://" + s.addr + "/healthz")
		if err != nil {
			return
		}
		res.Body.Close()
	}
	syscall.Kill(s.pid, syscall.SIGKILL)
}

func (s *readmeServer) output() string {
	b, _ := os.ReadFile(s.log)
	return string(b)
}

// TestReadmeConsoleBlocks runs README.md's console blocks against a real
// server and compares what they print with what the README shows, so the
// README's examples cannot drift from the server (the rules for blocks,
// markers and placeholders are at the top of this file).
//
// The server is the one "go run ./cmd/server" builds, started with the
// default settings before the first block; a block command that runs
// "go run ./cmd/server" stops it and starts the binary with that
// command's own settings, as a reader restarts it. The README's
// localhost:8080 becomes a free loopback port in every command, and the
// server is given that port with REPLAYGUARD_ADDR; nothing else of the
// test's environment reaches the session but PATH.
func TestReadmeConsoleBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the server")
	}
	blocks := readmeConsole(t)
	if len(blocks) == 0 {
		t.Fatal("README.md has no console blocks")
	}
	for _, tool := range []string{"bash", "curl", "sed", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "README console blocks need "+tool)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "replayguard-server")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/server").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/server: %v\n%s", err, out)
	}
	addr := "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "TMPDIR=" + dir, "LC_ALL=C"}
	sh := startShell(t, dir, env)
	runServer := "REPLAYGUARD_ADDR=" + addr + " " + strconv.Quote(bin)
	starts := 0
	srv, err := startServer(sh, runServer, addr, filepath.Join(dir, "server-0.log"))
	if err != nil {
		t.Fatalf("fresh server with the default settings: %v", err)
	}
	t.Cleanup(func() { srv.stop() })
	local := strings.NewReplacer("localhost:8080", addr, "127.0.0.1:8080", addr)

	for _, b := range blocks {
		if b.file != "" {
			if err := os.WriteFile(filepath.Join(dir, b.file), []byte(b.content), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Run(fmt.Sprintf("README.md:%d", b.line), func(t *testing.T) {
			if b.skip != "" {
				t.Skip(b.skip)
			}
			for _, c := range b.cmds {
				if strings.Contains(c.text, "go run ./cmd/server") {
					if c.want != "" {
						t.Errorf("README.md:%d: a command that starts the server shows output; the test does not compare server logs", c.line)
					}
					srv.stop()
					starts++
					next, err := startServer(sh, strings.Replace(c.text, "go run ./cmd/server", runServer, 1), addr, filepath.Join(dir, fmt.Sprintf("server-%d.log", starts)))
					if err != nil {
						t.Fatalf("README.md:%d: %v", c.line, err)
					}
					srv = next
					continue
				}
				got, err := sh.run(local.Replace(c.text), 30*time.Second)
				if err != nil {
					t.Fatalf("README.md:%d: $ %s\n%v; printed:\n%s", c.line, c.text, err, got)
				}
				if g, w := normaliseConsole(got), normaliseConsole(c.want); g != w {
					t.Errorf("README.md:%d: $ %s\nprints (normalised):\n%s\nthe README shows (normalised):\n%s\nit printed:\n%s", c.line, c.text, g, w, got)
				}
			}
		})
	}
}
