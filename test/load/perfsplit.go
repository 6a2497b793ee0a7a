package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// A category of server CPU time. Each perf sample goes to the first
// category, in this order, that a frame of its stack matches, so that the
// shares add up to 100%: GC first (whatever Go code caused it), then the
// features Replayguard adds (with the system calls they make), then what
// every Gin server does. The Redis client comes before signature
// verification, so that a nonce's round trip inside replay.Verify counts
// as Redis, and signature verification before JWT, so that the crypto
// under replay.Verify counts as signature verification. Feature categories look only at the frames below the innermost
// gin.(*Context).Next, because every middleware (logRequests,
// requestIDs...) is on the stack of every request it wraps: a sample is
// the middleware's own only when it is not inside the handlers it calls.
type category struct {
	name  string
	inner bool // match only the frames below the innermost Context.Next
	match func(sym, dso string) bool
}

func anyPrefix(prefixes ...string) func(sym, dso string) bool {
	return func(sym, _ string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(sym, p) {
				return true
			}
		}
		return false
	}
}

const rg = "github.com/replayguard/replayguard/"

var categories = []category{
	{"Go GC (background marking, assists, sweeping)", false, anyPrefix("runtime.gcBgMarkWorker", "runtime.gcAssistAlloc", "runtime.gcDrain", "runtime.bgsweep", "runtime.bgscavenge", "runtime.markroot", "runtime.scanobject", "runtime.sweepone", "runtime.gcStart", "runtime.(*mheap).reclaim")},
	{"request logging (handlers logRequests, log/slog, its write(2))", true, anyPrefix("log/slog.", rg+"handlers.(*API).Engine.logRequests", rg+"handlers.logRequests")},
	{"sonyflake IDs", true, anyPrefix("github.com/sony/sonyflake")},
	{"metrics (metrics, prometheus)", true, anyPrefix("github.com/prometheus/", rg+"metrics.(*Metrics)", rg+"metrics.(*instrumented).done")},
	{"Redis client (store/redis, go-redis, its socket syscalls)", true, anyPrefix("github.com/redis/go-redis/", rg+"store/redis.")},
	// The gateway (gateway.sh). Proxying runs inside an idempotency
	// record's handler, and the Transport's read and write loops in
	// goroutines of their own, so it looks at every frame and comes before
	// the records; the records look at every frame too, for their lease
	// heartbeat's goroutine, and so take whatever else a guarded request
	// does below the guard (buffering, capture, replay writes).
	{"upstream proxying (gateway forward, httputil, net/http Transport, its socket syscalls)", false, anyPrefix(rg+"gateway.(*Gateway).forward", "net/http/httputil.", "net/http.(*Transport)", "net/http.(*persistConn)", "net/http.persistConnWriter")},
	{"request fingerprint (guard fingerprint: canonical body, SHA-256)", true, anyPrefix(rg+"guard.fingerprint", rg+"guard.canonical")},
	{"idempotency records (guard Idempotent, idempotency, memory store records)", false, anyPrefix(rg+"guard.(*settings).idempotent", rg+"guard.(*settings).record", rg+"guard.(*captureWriter)", rg+"internal/request.ReadBody", rg+"guard.writeStored", rg+"idempotency.", rg+"store/memory.(*Store).Acquire", rg+"store/memory.(*Store).update", rg+"store/memory.(*Store).Renew", rg+"store/memory.(*Store).Complete", rg+"store/memory.(*Store).Release")},
	{"signature verification (replay, httpsfv, its crypto)", true, anyPrefix(rg+"replay.", "github.com/dunglas/httpsfv.")},
	{"JWT sign / verify (token, golang-jwt, crypto)", true, anyPrefix("github.com/golang-jwt/", "github.com/goccy/go-json", rg+"token.(*Service).sign", rg+"token.(*Service).Parse", rg+"token.validMAC", rg+"token.(*macPool)", rg+"token.(*Service).decodeClaims", "crypto/")},
	{"problem answers (problem Write, For)", true, anyPrefix(rg+"problem.", rg+"handlers.fail")},
	{"request IDs (handlers requestIDs)", true, anyPrefix(rg + "handlers.requestIDs")},
	{"request body decoding (handlers readJSON, readVerifyRequest, base64)", true, anyPrefix(rg+"handlers.readJSON", rg+"handlers.readVerifyRequest", "encoding/base64.")},
	{"JSON answers (gin render, encoding/json)", true, anyPrefix("github.com/gin-gonic/gin/render.", "github.com/gin-gonic/gin.(*Context).Render", "github.com/gin-gonic/gin.(*Context).JSON", "encoding/json.")},
	{"other handler code (Replayguard handlers, token, metrics wrappers; the baseline's handlers)", true, anyPrefix(rg, "main.newRouter")},
	{"kernel, outside the above: HTTP socket I/O, loopback TCP, scheduling", false, func(_, dso string) bool { return strings.Contains(dso, "kernel") }},
	{"Gin (routing, context)", false, anyPrefix("github.com/gin-gonic/")},
	{"net/http server (parse, write, conn I/O)", false, anyPrefix("net/http.", "net/textproto.", "bufio.", "net.", "internal/poll.")},
	{"Go scheduler and timers", false, anyPrefix("runtime.schedule", "runtime.findRunnable", "runtime.park_m", "runtime.mcall", "runtime.gopark", "runtime.netpoll", "runtime.stealWork", "runtime.runqgrab", "runtime.checkTimers", "runtime.wakep", "runtime.startm", "runtime.stopm", "runtime.notesleep", "runtime.futexsleep", "runtime.exitsyscall", "runtime.entersyscall", "runtime.goready", "runtime.ready", "runtime.mstart", "runtime.sysmon")},
}

const ginNext = "github.com/gin-gonic/gin.(*Context).Next"

// classify returns the category of one sample; frames run from the leaf
// to the root.
func classify(frames [][2]string) string {
	inner := frames
	for i, f := range frames {
		if f[0] == ginNext {
			inner = frames[:i]
			break
		}
	}
	for _, c := range categories {
		fs := frames
		if c.inner {
			fs = inner
		}
		for _, f := range fs {
			if c.match(f[0], f[1]) {
				return c.name
			}
		}
	}
	return otherCategory
}

const otherCategory = "other (runtime, unattributed)"

// perfSplit counts the samples of `perf script` output per category.
func perfSplit(r io.Reader) (map[string]int64, int64, error) {
	counts := map[string]int64{}
	var total int64
	var frames [][2]string
	flush := func() {
		if len(frames) == 0 {
			return
		}
		total++
		counts[classify(frames)]++
		frames = frames[:0]
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if line[0] != ' ' && line[0] != '\t' {
			flush() // a new sample's header
			continue
		}
		// "<addr> <symbol>+0x<off> (<dso>)"; the symbol may hold spaces.
		f := strings.TrimSpace(line)
		_, rest, ok := strings.Cut(f, " ")
		if !ok {
			continue
		}
		dso := ""
		if i := strings.LastIndex(rest, " ("); i >= 0 {
			rest, dso = rest[:i], strings.Trim(rest[i+2:], ")")
		}
		if i := strings.LastIndex(rest, "+0x"); i >= 0 {
			rest = rest[:i]
		}
		frames = append(frames, [2]string{rest, dso})
	}
	flush()
	return counts, total, sc.Err()
}

// perfSplitCmd is "load perfsplit": it prints a Markdown table of server
// CPU per category for one or more `perf script` outputs, as shares and,
// with the JSON line of the load run each was taken during, as µs per
// success.
//
//	load perfsplit -runs runs.jsonl label:mode=perf-script.txt ...
func perfSplitCmd(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("load perfsplit", flag.ContinueOnError)
	runsFile := fs.String("runs", "", "JSON summary lines of the profiled load runs (for µs per success)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("want label:mode=perf-script-file arguments")
	}
	var runs []summary
	if *runsFile != "" {
		var err error
		if runs, err = readRuns(*runsFile); err != nil {
			return err
		}
	}
	type column struct {
		head   string
		counts map[string]int64
		total  int64
		perOp  float64 // server CPU µs per success, 0 if unknown
	}
	var cols []column
	for _, a := range fs.Args() {
		key, file, ok := strings.Cut(a, "=")
		label, mode, ok2 := strings.Cut(key, ":")
		if !ok || !ok2 {
			return fmt.Errorf("%q: want label:mode=file", a)
		}
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		counts, total, err := perfSplit(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		c := column{head: label + " " + mode, counts: counts, total: total}
		if m := find(mergeRuns(runs), label, mode); m != nil && m.ok > 0 {
			c.perOp = m.cpu["server"] / float64(m.ok) * 1e6
		}
		cols = append(cols, c)
	}
	var b bytes.Buffer
	b.WriteString("| server CPU by category |")
	for _, c := range cols {
		fmt.Fprintf(&b, " %s (%d samples) |", c.head, c.total)
	}
	b.WriteString("\n|---|")
	for range cols {
		b.WriteString("--:|")
	}
	b.WriteString("\n")
	names := make([]string, 0, len(categories)+1)
	for _, c := range categories {
		names = append(names, c.name)
	}
	names = append(names, otherCategory)
	for _, n := range names {
		fmt.Fprintf(&b, "| %s |", n)
		for _, c := range cols {
			share := 0.0
			if c.total > 0 {
				share = float64(c.counts[n]) / float64(c.total)
			}
			if c.perOp > 0 {
				fmt.Fprintf(&b, " %.1f%% = %.0f µs |", share*100, share*c.perOp)
			} else {
				fmt.Fprintf(&b, " %.1f%% |", share*100)
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("| **total server CPU per success** |")
	for _, c := range cols {
		if c.perOp > 0 {
			fmt.Fprintf(&b, " %.0f µs |", c.perOp)
		} else {
			b.WriteString(" n/a |")
		}
	}
	b.WriteString("\n\n")
	_, err := w.Write(b.Bytes())
	return err
}
