package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The Idempotency-Key draft's headers, spelled out here so that the load
// program builds against older commits too (REV=… in run.sh).
const (
	idempotencyKey = "Idempotency-Key"
	replayedHeader = "Idempotent-Replayed"
)

// gatewayMode is one mode of the gateway benchmark (gateway.sh). Every
// one POSTs -path with a small JSON order, as a client of the app in
// test/load/app would, and wants the app's 201 with a Location header.
type gatewayMode struct {
	// keyed sends an Idempotency-Key.
	keyed bool
	// webhook sends a Standard Webhooks delivery, its key the webhook-id
	// (see orderHeaders), for a webhook route.
	webhook bool
	// repeat makes each worker send one request before the timed phase
	// (it must run: 201, not replayed) and then only that request again:
	// every answer must be its replay, byte for byte, with
	// Idempotent-Replayed: true. Without repeat, every request is new (a
	// body of its own, and a fresh key when keyed) and no answer may be a
	// replay.
	repeat bool
	// request names the mode in reports, what the summary's successes.
	request, what string
}

// gatewayModes are the modes by -mode. bare, passthrough and fp-first
// send the same requests; only the target differs (gateway.sh points
// them at the app, an unrouted path of the gateway, and a fingerprint
// route).
var gatewayModes = map[string]gatewayMode{
	"bare":        {request: "bare app (no gateway)", what: "orders created (201)"},
	"passthrough": {request: "pass-through (unrouted path)", what: "orders created through the gateway (201)"},
	"first":       {keyed: true, request: "idempotency_key: first execution", what: "fresh keys executed (201)"},
	"replay":      {keyed: true, repeat: true, request: "idempotency_key: replay", what: "completed keys replayed (201, replayed)"},
	"fp-first":    {request: "fingerprint: first execution", what: "new bodies executed (201)"},
	"fp-replay":   {repeat: true, request: "fingerprint: replay", what: "completed bodies replayed (201, replayed)"},
	"wh-first":    {webhook: true, request: "webhook: verified first delivery", what: "verified deliveries executed (201)"},
	"wh-replay":   {webhook: true, repeat: true, request: "webhook: verified redelivery", what: "verified redeliveries replayed (201, replayed)"},
}

// gatewayOrder lists the modes in the order reports show them.
var gatewayOrder = []string{"bare", "passthrough", "first", "replay", "fp-first", "fp-replay", "wh-first", "wh-replay"}

// repeat is one worker's request in the repeat modes, with the answer of
// its one execution.
type repeat struct {
	key, location string
	body, answer  []byte
}

// orderRequest returns the JSON body of the order ref and its key in
// mode m: an Idempotency-Key (an RFC 8941 sf-string) when keyed, a
// webhook-id for a webhook mode, else none.
func orderRequest(ref string, m gatewayMode) (body []byte, key string) {
	body = []byte(`{"item":"load-test","quantity":1,"ref":"` + ref + `"}`)
	switch {
	case m.keyed:
		key = `"` + ref + `"`
	case m.webhook:
		key = "msg_" + ref
	}
	return body, key
}

// keyHeader is the header name that carries key, or "" for none.
func keyHeader(key string) string {
	if key == "" {
		return ""
	}
	return idempotencyKey
}

// prepareGateway gives the run an ID that makes its keys and bodies its
// own, and in the repeat modes completes one request per worker.
func (r *runner) prepareGateway(ctx context.Context) error {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	r.runID = hex.EncodeToString(b[:])
	m := gatewayModes[r.cfg.mode]
	if !m.repeat {
		return nil
	}
	r.repeats = make([]repeat, r.cfg.workers)
	t := &tally{statuses: map[int]int64{}}
	for i := range r.repeats {
		body, key := orderRequest(r.runID+"-w"+strconv.Itoa(i), m)
		st, h, answer, ok := r.sendOrder(ctx, t, body, key)
		if !ok {
			return fmt.Errorf("preparing worker %d's request: %s", i, t.firstErr)
		}
		if err := checkOrder(st, h, answer, nil); err != nil {
			return fmt.Errorf("preparing worker %d's request: %w", i, err)
		}
		r.repeats[i] = repeat{key: key, location: h.Get("Location"), body: body, answer: answer}
	}
	return nil
}

// checkOrder checks one answer of a gateway mode: 201 with a Location;
// a replay of want's answer (Idempotent-Replayed: true, the same body and
// Location) when want is set, and no replay when it is nil.
func checkOrder(status int, h http.Header, body []byte, want *repeat) error {
	if status != http.StatusCreated {
		return fmt.Errorf("%d %s", status, truncate(body))
	}
	loc := h.Get("Location")
	if loc == "" {
		return fmt.Errorf("201 without a Location: %s", truncate(body))
	}
	replayed := h.Get(replayedHeader)
	switch {
	case want == nil && replayed != "":
		return fmt.Errorf("a new request was answered as a replay (%s: %q, Location %s)", replayedHeader, replayed, loc)
	case want != nil && replayed != "true":
		return fmt.Errorf("a repeated request ran again instead of being replayed (%s: %q, Location %s, first answer's %s)", replayedHeader, replayed, loc, want.location)
	case want != nil && (loc != want.location || !bytes.Equal(body, want.answer)):
		return fmt.Errorf("the replay differs from the first answer: Location %s, %s; want %s, %s", loc, truncate(body), want.location, truncate(want.answer))
	}
	return nil
}

// gatewayLoop sends the requests of a gateway mode.
func (r *runner) gatewayLoop(ctx context.Context, t *tally) {
	var want *repeat
	if len(r.repeats) > 0 {
		i := r.workerSeq.Add(1) - 1
		if i >= int64(len(r.repeats)) {
			return
		}
		want = &r.repeats[i]
	}
	for r.take(ctx, 1) {
		body, key := r.nextOrder(want)
		st, h, answer, ok := r.sendOrder(ctx, t, body, key)
		if !ok {
			continue
		}
		if h.Get(replayedHeader) == "true" {
			t.replayed++
		}
		if err := checkOrder(st, h, answer, want); err != nil {
			t.fail("%s: %v", r.cfg.mode, err)
			continue
		}
		t.ok++
	}
}

// nextOrder returns the next request of a gateway mode: the worker's
// repeated one, or a new one.
func (r *runner) nextOrder(want *repeat) ([]byte, string) {
	if want != nil {
		return want.body, want.key
	}
	n := r.next.Add(1)
	return orderRequest(r.runID+"-"+strconv.FormatUint(n, 10), gatewayModes[r.cfg.mode])
}

// gatewayReport is "load gateway-report": the Markdown tables of the
// gateway benchmark from the JSON lines of its load runs (-runs) and,
// optionally, Go benchmark output (-gobench, comma-separated files). With
// -app-executions, the app's count of its executions, it checks that the
// app ran once per new request and once per worker's repeated request,
// never for a replay, and fails when it did not.
func gatewayReport(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("load gateway-report", flag.ContinueOnError)
	runsFile := fs.String("runs", "", "file of JSON summary lines from load runs")
	goFiles := fs.String("gobench", "", "comma-separated files of go test -bench output")
	appRuns := fs.Int64("app-executions", -1, "executions the app counted over every run (GET /_count); -1: not checked")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *runsFile == "" {
		return errors.New("-runs is required")
	}
	runs, err := readRuns(*runsFile)
	if err != nil {
		return err
	}
	var benches []goBench
	for _, f := range strings.Split(*goFiles, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		b, err := readGoBench(f)
		if err != nil {
			return err
		}
		benches = append(benches, b...)
	}
	var b bytes.Buffer
	b.WriteString("Gateway, rounds merged (successes over total time; percentiles over every request of every round; ratios against the bare app):\n\n")
	writeGatewayTable(&b, mergeRuns(runs))
	b.WriteString("Every round:\n\n")
	writeGatewayRounds(&b, runs)
	var mismatch error
	if *appRuns >= 0 {
		want := expectedExecutions(runs)
		verdict := "as expected"
		if *appRuns != want {
			verdict = "MISMATCH"
			mismatch = fmt.Errorf("the app counted %d executions, want %d", *appRuns, want)
		}
		fmt.Fprintf(&b, "App executions: %d counted by the app, %d expected (one per new request, one per worker's repeated request before its timed phase, none for a replay): %s.\n\n", *appRuns, want, verdict)
	}
	if len(benches) > 0 {
		writeGoTable(&b, benches)
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return err
	}
	return mismatch
}

// expectedExecutions is how often the app must have run for runs: once
// per request of a mode without repeat, once per prepared request (Pool)
// of a mode with repeat.
func expectedExecutions(runs []summary) int64 {
	var n int64
	for _, r := range runs {
		g, ok := gatewayModes[r.Mode]
		switch {
		case !ok:
		case g.repeat:
			n += int64(r.Pool)
		default:
			n += r.Requests
		}
	}
	return n
}

// gatewayCPUPerOK is the CPU, in µs, that the gateway, the app, Redis,
// the load program and interrupts used per success.
func gatewayCPUPerOK(m *merged) float64 {
	if m.ok == 0 {
		return 0
	}
	return (m.cpu["server"] + m.cpu["app"] + m.cpu["redis"] + m.cpu["load"] + m.cpu["irq"]) / float64(m.ok) * 1e6
}

// usPerOK is one watched process's CPU per success in µs, or "-".
func usPerOK(cpu map[string]float64, name string, ok int64) string {
	v, found := cpu[name]
	if !found || ok == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v/float64(ok)*1e6)
}

// ratio formats a/b with format, or "n/a" when b is not positive.
func ratio(format string, a, b float64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf(format, a/b)
}

// sortGateway orders merged runs: the bare app first, then by store as
// they first appear, each store's modes in gatewayOrder.
func sortGateway(ms []*merged) []*merged {
	var out []*merged
	for _, m := range ms {
		if _, ok := gatewayModes[m.mode]; ok {
			out = append(out, m)
		}
	}
	stores := map[string]int{}
	for _, m := range out {
		if _, ok := stores[m.label]; !ok && m.mode != "bare" {
			stores[m.label] = len(stores)
		}
	}
	rank := func(m *merged) (int, int) {
		if m.mode == "bare" {
			return -1, 0
		}
		return stores[m.label], slices.Index(gatewayOrder, m.mode)
	}
	slices.SortStableFunc(out, func(a, b *merged) int {
		sa, ma := rank(a)
		sb, mb := rank(b)
		if sa != sb {
			return sa - sb
		}
		return ma - mb
	})
	return out
}

func writeGatewayTable(b *bytes.Buffer, all []*merged) {
	ms := sortGateway(all)
	var bare *merged
	for _, m := range ms {
		if m.mode == "bare" {
			bare = m
			break
		}
	}
	b.WriteString("| request | store | rounds | successes/s (each round) | vs bare | vs pass-through | p50 ms | p99 ms | p50 vs bare | p99 vs bare | replayed | errors | CPU µs per success: gateway / app / Redis | all CPU µs per success (+ load, irq) | vs bare by CPU | other processes' share |\n")
	b.WriteString("|---|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|\n")
	for _, m := range ms {
		var each []string
		for _, v := range m.roundOKPerS {
			each = append(each, fmt.Sprintf("%.0f", v))
		}
		store := m.label
		if m.mode == "bare" {
			store = "—"
		}
		vsBare, p50, p99, byCPU := "n/a", "n/a", "n/a", "n/a"
		if bare != nil {
			vsBare = ratio("%.0f%%", m.okPerS*100, bare.okPerS)
			p50 = ratio("%.2f×", m.p50, bare.p50)
			p99 = ratio("%.2f×", m.p99, bare.p99)
			if c := gatewayCPUPerOK(m); c > 0 {
				byCPU = ratio("%.2f×", c, gatewayCPUPerOK(bare))
			}
		}
		all := "n/a"
		if c := gatewayCPUPerOK(m); c > 0 {
			all = fmt.Sprintf("%.0f", c)
		}
		vsPass := "—"
		if pass := find(ms, m.label, "passthrough"); pass != nil && m.mode != "bare" {
			vsPass = ratio("%.0f%%", m.okPerS*100, pass.okPerS)
		}
		fmt.Fprintf(b, "| %s | %s | %d | **%.0f** (%s) | %s | %s | %.2f | %.2f | %s | %s | %d | %d | %s / %s / %s | %s | %s | %s |\n",
			gatewayModes[m.mode].request, store, m.rounds, m.okPerS, strings.Join(each, ", "), vsBare, vsPass, m.p50, m.p99, p50, p99,
			m.replayed, m.bad, usPerOK(m.cpu, "server", m.ok), usPerOK(m.cpu, "app", m.ok), usPerOK(m.cpu, "redis", m.ok), all, byCPU,
			share(m.cpu, m.seconds, m.numCPU))
	}
	b.WriteString("\n")
}

func writeGatewayRounds(b *bytes.Buffer, runs []summary) {
	b.WriteString("| round | store | request | seconds | successes/s | p50 ms | p99 ms | statuses | replayed | errors | CPU s: gateway / app / Redis / load / irq / other |\n")
	b.WriteString("|--:|---|---|--:|--:|--:|--:|---|--:|--:|---|\n")
	round := map[string]int{}
	for _, r := range runs {
		g, ok := gatewayModes[r.Mode]
		if !ok {
			continue
		}
		round[r.Label+"\x00"+r.Mode]++
		store := r.Label
		if r.Mode == "bare" {
			store = "—"
		}
		var st []string
		for _, code := range slices.Sorted(maps.Keys(r.Statuses)) {
			st = append(st, fmt.Sprintf("%s: %d", code, r.Statuses[code]))
		}
		cell := func(k string) string {
			if v, ok := r.CPUS[k]; ok {
				return fmt.Sprintf("%.1f", v)
			}
			return "-"
		}
		fmt.Fprintf(b, "| %d | %s | %s | %.1f | %.0f | %.2f | %.2f | %s | %d | %d | %s / %s / %s / %s / %s / %s |\n",
			round[r.Label+"\x00"+r.Mode], store, g.request, r.DurationS, r.OKPerS, r.P50Ms, r.P99Ms, strings.Join(st, ", "),
			r.Replayed, r.Transport+r.Unexpected, cell("server"), cell("app"), cell("redis"), cell("load"), cell("irq"), cell("other"))
	}
	b.WriteString("\n")
}
