package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// summary is the result of one run; it is printed as one line of JSON.
type summary struct {
	Kind  string `json:"kind"` // always "load"
	Label string `json:"label"`
	Mode  string `json:"mode"`
	// Alg is -alg in verify mode: hmac or ed25519.
	Alg string `json:"alg,omitempty"`
	// Name is -name: the run's name of its mode in reports, such as
	// pairs-1conn for pairs at one worker; empty for the default.
	Name    string `json:"name,omitempty"`
	URL     string `json:"url"`
	Workers int    `json:"workers"`
	// NumCPU is runtime.NumCPU() of the machine the run was on.
	NumCPU int `json:"num_cpu"`
	// DurationS is the measured wall time, from the first request to the
	// last answer.
	DurationS float64 `json:"duration_s"`
	// StoppedBy is "duration", "max-requests", "pool" (verify and redeem
	// modes: every prepared request was sent) or "signal".
	StoppedBy string `json:"stopped_by"`
	// Pool is how many signed requests (verify), issued tokens (redeem)
	// or completed requests (replay and fp-replay: one per worker) were
	// prepared before the timed phase, and PrepareS how long that took;
	// neither counts in the figures.
	Pool     int     `json:"pool,omitempty"`
	PrepareS float64 `json:"prepare_s,omitempty"`
	Requests int64   `json:"requests"`
	ReqPerS  float64 `json:"req_per_s"`
	// OK counts successes: 201-then-200 pairs, 401 token_invalid answers
	// to forged tokens, 204 answers, 200 "verified" answers to signed
	// requests, 200 answers to redeems of pre-issued tokens, or in the
	// gateway modes 201 answers with a Location, replayed exactly where
	// the mode wants replays (see gateway.go).
	OK     int64   `json:"ok"`
	OKPerS float64 `json:"ok_per_s"`
	// Latencies over every request (issue and redeem alike), in ms.
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
	// Hist is the latency histogram, so that the report can merge runs:
	// bucket index (see histBucket) to count.
	Hist map[string]int64 `json:"latency_hist"`
	// Non2xx counts answers outside 200-299 (all of them in forged mode,
	// by design); Status5xx those of 500 and above.
	// Replayed counts answers with Idempotent-Replayed: true (gateway
	// modes: every answer in replay and fp-replay, none in the others).
	Replayed   int64            `json:"replayed,omitempty"`
	Non2xx     int64            `json:"non_2xx"`
	Status5xx  int64            `json:"status_5xx"`
	Statuses   map[string]int64 `json:"statuses"`
	Transport  int64            `json:"transport_errors"`
	Unexpected int64            `json:"unexpected"`
	FirstError string           `json:"first_error,omitempty"`
	// CPUS is CPU seconds used during the run: "load" (this process),
	// each watched process, "machine" (all CPUs running processes, from
	// /proc/stat), "irq" (interrupts, softirq included), "steal" (taken by
	// the hypervisor) and "other" (machine less the named processes: other
	// work on the machine). Empty where /proc is absent.
	CPUS map[string]float64 `json:"cpu_s,omitempty"`
	// Clean is false when the run saw a 5xx, a transport error or an
	// unexpected answer, or no success at all.
	Clean bool `json:"clean"`
}

// checkLoopbackURL accepts http URLs whose host is localhost or a loopback
// IP, and returns the host.
func checkLoopbackURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return "", fmt.Errorf("-url %q: want http://host:port", raw)
	}
	host := u.Hostname()
	if host == "localhost" {
		return u.Host, nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return u.Host, nil
	}
	return "", fmt.Errorf("-url %q: only loopback targets (127.0.0.0/8, ::1, localhost) are allowed", raw)
}

// errNotLoopback is returned by the dialer for any non-loopback address.
var errNotLoopback = errors.New("refusing to dial a non-loopback address")

// newClient returns a keep-alive client sized for workers that can only
// dial loopback addresses and never follows redirects.
func newClient(workers int, timeout time.Duration) *http.Client {
	d := &net.Dialer{
		Timeout:   5 * time.Second,
		KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
				return fmt.Errorf("%w: %s", errNotLoopback, address)
			}
			return nil
		},
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         d.DialContext,
		MaxIdleConns:        2 * workers,
		MaxIdleConnsPerHost: 2 * workers,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// tally is one worker's counts; merged after the run.
type tally struct {
	lat        []time.Duration
	ok         int64
	replayed   int64
	statuses   map[int]int64
	transport  int64
	unexpected int64
	firstErr   string
}

func (t *tally) fail(format string, a ...any) {
	t.unexpected++
	if t.firstErr == "" {
		t.firstErr = fmt.Sprintf(format, a...)
	}
}

// runner holds what every worker shares.
type runner struct {
	cfg      *config
	client   *http.Client
	base     string
	deadline time.Time
	budget   atomic.Int64 // requests left
	capped   atomic.Bool  // the budget ran out
	forged   []string
	next     atomic.Uint64
	// gateway modes: runID makes this run's keys and bodies unique, and
	// repeats holds each worker's request, completed before the timed
	// phase; workerSeq hands them out.
	runID     string
	repeats   []repeat
	workerSeq atomic.Int64
	// pool holds the prepared request bodies (verify) or tokens (redeem),
	// each sent once; drained is set when a worker found none left.
	bodies  [][]byte
	tokens  []string
	drained atomic.Bool
}

// item reserves the next prepared request, or reports that none is left.
func (r *runner) item(n int) (int, bool) {
	i := r.next.Add(1) - 1
	if i >= uint64(n) {
		r.drained.Store(true)
		return 0, false
	}
	return int(i), true
}

// take reserves n requests of the budget, or reports that the run is over.
func (r *runner) take(ctx context.Context, n int64) bool {
	if ctx.Err() != nil || !time.Now().Before(r.deadline) {
		return false
	}
	if r.budget.Add(-n) < 0 {
		r.capped.Store(true)
		return false
	}
	return true
}

// do sends one POST, with a JSON body when body is not nil, and returns
// the status and body. It records the request's latency, and its status
// or transport error, in t.
func (r *runner) do(ctx context.Context, t *tally, path string, header, value string, body []byte) (int, []byte, bool) {
	st, _, answer, ok := r.send(ctx, t, path, header, value, body)
	return st, answer, ok
}

// send is do that returns the answer's headers too.
func (r *runner) send(ctx context.Context, t *tally, path string, header, value string, body []byte) (int, http.Header, []byte, bool) {
	h := http.Header{}
	if header != "" {
		h.Set(header, value)
	}
	return r.sendHeader(ctx, t, path, h, body)
}

// sendHeader is send with the request headers h.
func (r *runner) sendHeader(ctx context.Context, t *tally, path string, h http.Header, body []byte) (int, http.Header, []byte, bool) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.base+path, rd)
	if err != nil {
		t.fail("building request: %v", err)
		return 0, nil, nil, false
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for name, vs := range h {
		req.Header[name] = vs
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			t.transport++
			if t.firstErr == "" {
				t.firstErr = err.Error()
			}
		}
		return 0, nil, nil, false
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.lat = append(t.lat, time.Since(start))
	t.statuses[resp.StatusCode]++
	if err != nil {
		t.transport++
		if t.firstErr == "" {
			t.firstErr = "reading body: " + err.Error()
		}
		return 0, nil, nil, false
	}
	return resp.StatusCode, resp.Header, answer, true
}

func (r *runner) pairs(ctx context.Context, t *tally) {
	for r.take(ctx, 2) {
		st, body, ok := r.do(ctx, t, r.cfg.issuePath, "", "", nil)
		if !ok {
			continue
		}
		if st != http.StatusCreated {
			t.fail("issue: %d %s", st, truncate(body))
			continue
		}
		tok := tokenFrom(body, r.cfg.tokenField)
		if tok == "" {
			t.fail("issue: no %q field in %s", r.cfg.tokenField, truncate(body))
			continue
		}
		st, body, ok = r.do(ctx, t, r.cfg.redeemPath, r.cfg.tokenHeader, tok, nil)
		if !ok {
			continue
		}
		if st != http.StatusOK {
			t.fail("redeem: %d %s", st, truncate(body))
			continue
		}
		t.ok++
	}
}

var invalidCode = []byte(`"code":"token_invalid"`)

func (r *runner) forgedLoop(ctx context.Context, t *tally) {
	for r.take(ctx, 1) {
		tok := r.forged[r.next.Add(1)%uint64(len(r.forged))]
		st, body, ok := r.do(ctx, t, r.cfg.redeemPath, r.cfg.tokenHeader, tok, nil)
		if !ok {
			continue
		}
		if st != http.StatusUnauthorized || !bytes.Contains(body, invalidCode) {
			t.fail("forged redeem: %d %s", st, truncate(body))
			continue
		}
		t.ok++
	}
}

func (r *runner) noop(ctx context.Context, t *tally) {
	for r.take(ctx, 1) {
		st, body, ok := r.do(ctx, t, r.cfg.noopPath, "", "", nil)
		if !ok {
			continue
		}
		if st != http.StatusNoContent {
			t.fail("noop: %d %s", st, truncate(body))
			continue
		}
		t.ok++
	}
}

var verifiedStatus = []byte(`"status":"verified"`)

// verify sends each prepared signed request once; only 200 with
// "status":"verified" counts.
func (r *runner) verify(ctx context.Context, t *tally) {
	for r.take(ctx, 1) {
		i, ok := r.item(len(r.bodies))
		if !ok {
			return
		}
		st, body, ok := r.do(ctx, t, r.cfg.verifyPath, "", "", r.bodies[i])
		if !ok {
			continue
		}
		if st != http.StatusOK || !bytes.Contains(body, verifiedStatus) {
			t.fail("verify: %d %s", st, truncate(body))
			continue
		}
		t.ok++
	}
}

// redeemLoop redeems each pre-issued token once; only 200 counts.
func (r *runner) redeemLoop(ctx context.Context, t *tally) {
	for r.take(ctx, 1) {
		i, ok := r.item(len(r.tokens))
		if !ok {
			return
		}
		st, body, ok := r.do(ctx, t, r.cfg.redeemPath, r.cfg.tokenHeader, r.tokens[i], nil)
		if !ok {
			continue
		}
		if st != http.StatusOK {
			t.fail("redeem: %d %s", st, truncate(body))
			continue
		}
		t.ok++
	}
}

// tokenFrom returns the string field name of the JSON object body. It
// scans for "name":"..." first (tokens hold no quotes or escapes) and
// falls back to decoding the body.
func tokenFrom(body []byte, name string) string {
	key := `"` + name + `":"`
	if i := bytes.Index(body, []byte(key)); i >= 0 {
		rest := body[i+len(key):]
		if j := bytes.IndexByte(rest, '"'); j > 0 && bytes.IndexByte(rest[:j], '\\') < 0 {
			return string(rest[:j])
		}
	}
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return ""
	}
	s, _ := m[name].(string)
	return s
}

func truncate(b []byte) string {
	const n = 200
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = s[:n] + "..."
	}
	return strconv.Quote(s)
}

// run performs one load run as cfg says.
func run(ctx context.Context, cfg *config) (*summary, error) {
	watch, err := parseWatch(cfg.watch)
	if err != nil {
		return nil, err
	}
	r := &runner{
		cfg:    cfg,
		client: newClient(cfg.workers, cfg.timeout),
		base:   strings.TrimRight(cfg.url, "/"),
	}
	defer r.client.CloseIdleConnections()
	if cfg.mode == "forged" {
		kid := cfg.kid
		if kid == "" {
			if kid, err = fetchKid(ctx, r.client, r.base+cfg.issuePath, cfg.tokenField); err != nil {
				return nil, err
			}
		}
		if r.forged, err = forgeTokens(kid, cfg.forgedPool, time.Now()); err != nil {
			return nil, err
		}
	}
	// The prepared requests of verify and redeem are made before the
	// timed phase and before the CPU is first sampled, so that neither
	// signing nor issuing counts.
	prepStart := time.Now()
	switch cfg.mode {
	case "verify":
		signer, err := newSigner(cfg.alg, cfg.keyID)
		if err != nil {
			return nil, err
		}
		if r.bodies, err = signedBodies(ctx, signer, cfg.verifyURL, cfg.pool); err != nil {
			return nil, err
		}
	case "redeem":
		if r.tokens, err = issueTokens(ctx, r.client, r.base+cfg.issuePath, cfg.tokenField, cfg.pool, cfg.workers); err != nil {
			return nil, err
		}
	}
	if _, ok := gatewayModes[cfg.mode]; ok {
		if err := r.prepareGateway(ctx); err != nil {
			return nil, err
		}
	}
	prepare := time.Since(prepStart)
	r.budget.Store(cfg.maxRequests)
	loop := map[string]func(context.Context, *tally){
		"pairs":  r.pairs,
		"forged": r.forgedLoop,
		"noop":   r.noop,
		"verify": r.verify,
		"redeem": r.redeemLoop,
	}[cfg.mode]
	if _, ok := gatewayModes[cfg.mode]; ok {
		loop = r.gatewayLoop
	}

	// Requests still in flight at the deadline finish (within -timeout);
	// no new one starts after it.
	if cfg.readyFile != "" {
		if err := os.WriteFile(cfg.readyFile, []byte("timed phase started\n"), 0o644); err != nil {
			return nil, err
		}
	}
	tallies := make([]*tally, cfg.workers)
	cpu0 := sampleCPU(watch)
	start := time.Now()
	r.deadline = start.Add(cfg.duration)
	var wg sync.WaitGroup
	for i := range tallies {
		t := &tally{statuses: map[int]int64{}, lat: make([]time.Duration, 0, 4096)}
		tallies[i] = t
		wg.Go(func() { loop(ctx, t) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := sampleCPU(watch).since(cpu0)

	s := &summary{
		Kind: "load", Label: cfg.label, Mode: cfg.mode, URL: cfg.url, Workers: cfg.workers, NumCPU: runtime.NumCPU(),
		DurationS: elapsed.Seconds(), StoppedBy: "duration", Statuses: map[string]int64{}, CPUS: cpu,
	}
	if cfg.mode == "verify" {
		s.Alg = cfg.alg
	}
	s.Name = cfg.name
	if cfg.mode == "verify" || cfg.mode == "redeem" {
		s.Pool, s.PrepareS = cfg.pool, prepare.Seconds()
	}
	if len(r.repeats) > 0 {
		s.Pool, s.PrepareS = len(r.repeats), prepare.Seconds()
	}
	switch {
	case ctx.Err() != nil:
		s.StoppedBy = "signal"
	case r.capped.Load():
		s.StoppedBy = "max-requests"
	case r.drained.Load():
		s.StoppedBy = "pool"
	}
	var lat []time.Duration
	for _, t := range tallies {
		lat = append(lat, t.lat...)
		s.OK += t.ok
		s.Replayed += t.replayed
		s.Transport += t.transport
		s.Unexpected += t.unexpected
		if s.FirstError == "" {
			s.FirstError = t.firstErr
		}
		for code, n := range t.statuses {
			s.Statuses[strconv.Itoa(code)] += n
			s.Requests += n
			if code < 200 || code > 299 {
				s.Non2xx += n
			}
			if code >= 500 {
				s.Status5xx += n
			}
		}
	}
	slices.Sort(lat)
	s.Hist = histogram(lat)
	s.P50Ms, s.P90Ms, s.P99Ms, s.P999Ms = ms(quantile(lat, .50)), ms(quantile(lat, .90)), ms(quantile(lat, .99)), ms(quantile(lat, .999))
	if len(lat) > 0 {
		s.MaxMs = ms(lat[len(lat)-1])
	}
	if secs := elapsed.Seconds(); secs > 0 {
		s.ReqPerS = float64(s.Requests) / secs
		s.OKPerS = float64(s.OK) / secs
	}
	s.Clean = s.OK > 0 && s.Status5xx == 0 && s.Transport == 0 && s.Unexpected == 0
	return s, nil
}

// histGrowth is the ratio between the bounds of one latency bucket: 2%.
const histGrowth = 1.02

// histBucket is the index of the bucket that holds d: bucket i holds
// latencies in [histGrowth^i, histGrowth^(i+1)) microseconds.
func histBucket(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us < 1 {
		return 0
	}
	return int(math.Log(us) / math.Log(histGrowth))
}

// histValue is the geometric middle of bucket i.
func histValue(i int) time.Duration {
	return time.Duration(math.Pow(histGrowth, float64(i)+0.5) * float64(time.Microsecond))
}

func histogram(lat []time.Duration) map[string]int64 {
	h := map[string]int64{}
	for _, d := range lat {
		h[strconv.Itoa(histBucket(d))]++
	}
	return h
}

// histQuantile returns the q-quantile of merged histograms (within the
// bucket width, 2%) by the nearest-rank method.
func histQuantile(hists []map[string]int64, q float64) time.Duration {
	counts := map[int]int64{}
	var total int64
	for _, h := range hists {
		for k, n := range h {
			i, err := strconv.Atoi(k)
			if err != nil {
				continue
			}
			counts[i] += n
			total += n
		}
	}
	if total == 0 {
		return 0
	}
	keys := slices.Sorted(maps.Keys(counts))
	rank := int64(math.Ceil(float64(total) * q))
	var seen int64
	for _, i := range keys {
		seen += counts[i]
		if seen >= rank {
			return histValue(i)
		}
	}
	return histValue(keys[len(keys)-1])
}

// quantile returns the q-quantile of sorted by the nearest-rank method.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// writeSummary prints the human summary and the JSON line to w, and
// appends the JSON line to jsonFile when it is set.
func writeSummary(w io.Writer, jsonFile string, s *summary) error {
	line, err := json.Marshal(s)
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d workers, %.2fs (stopped by %s)\n", s.Label, modeName(s), s.Workers, s.DurationS, s.StoppedBy)
	if s.Pool > 0 {
		fmt.Fprintf(&b, "  prepared %d %s in %.2fs before the timed phase\n", s.Pool, map[string]string{"verify": "signed requests", "redeem": "issued tokens", "replay": "completed keys", "fp-replay": "completed bodies"}[s.Mode], s.PrepareS)
	}
	what := map[string]string{
		"pairs":  "pairs (201 then 200)",
		"forged": "forged tokens refused (401 token_invalid)",
		"noop":   "no-op answers (204)",
		"verify": "signed requests verified (200 verified)",
		"redeem": "pre-issued tokens redeemed (200)",
	}[s.Mode]
	if g, ok := gatewayModes[s.Mode]; ok {
		what = g.what
	}
	fmt.Fprintf(&b, "  %-42s %10d  %10.0f/s\n", what, s.OK, s.OKPerS)
	fmt.Fprintf(&b, "  %-42s %10d  %10.0f/s\n", "requests", s.Requests, s.ReqPerS)
	fmt.Fprintf(&b, "  latency ms: p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f\n", s.P50Ms, s.P90Ms, s.P99Ms, s.P999Ms, s.MaxMs)
	fmt.Fprintf(&b, "  statuses %v  replayed %d  non-2xx %d  5xx %d  transport errors %d  unexpected %d\n", s.Statuses, s.Replayed, s.Non2xx, s.Status5xx, s.Transport, s.Unexpected)
	if len(s.CPUS) > 0 {
		fmt.Fprintf(&b, "  cpu seconds %v\n", roundMap(s.CPUS))
	}
	if s.FirstError != "" {
		fmt.Fprintf(&b, "  first error: %s\n", s.FirstError)
	}
	if !s.Clean {
		b.WriteString("  NOT CLEAN: 5xx, transport errors, unexpected answers or no success\n")
	}
	b.Write(line)
	b.WriteByte('\n')
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if jsonFile == "" {
		return nil
	}
	f, err := os.OpenFile(jsonFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// modeName names a run's mode in reports: its -name if it has one, else
// the mode, and for verify its algorithm ("verify/hmac").
func modeName(s *summary) string {
	if s.Name != "" {
		return s.Name
	}
	if s.Alg != "" {
		return s.Mode + "/" + s.Alg
	}
	return s.Mode
}

func roundMap(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = float64(int64(v*100+0.5)) / 100
	}
	return out
}
