package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

func TestCheckLoopbackURL(t *testing.T) {
	tests := []struct {
		name, url string
		ok        bool
	}{
		{"IPv4 loopback is accepted", "http://127.0.0.1:8080", true},
		{"anywhere in 127.0.0.0/8 is accepted", "http://127.8.9.10:80/", true},
		{"IPv6 loopback is accepted", "http://[::1]:8080", true},
		{"localhost is accepted", "http://localhost:8080", true},
		{"a private address is refused", "http://10.0.0.1:8080", false},
		{"a public name is refused", "http://example.com", false},
		{"an unspecified address is refused", "http://0.0.0.0:8080", false},
		{"https is refused (the program speaks plain HTTP)", "https://127.0.0.1:8443", false},
		{"a URL without a host is refused", "http:///v1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := checkLoopbackURL(tt.url)
			if (err == nil) != tt.ok {
				t.Fatalf("checkLoopbackURL(%q) = %v, want ok=%v", tt.url, err, tt.ok)
			}
		})
	}
}

func TestParseFlagsRefusesUnboundedRuns(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"duration over ten minutes", []string{"-duration", "11m"}},
		{"zero duration", []string{"-duration", "0s"}},
		{"no workers", []string{"-workers", "0"}},
		{"no request budget", []string{"-max-requests", "0"}},
		{"unknown mode", []string{"-mode", "flood"}},
		{"unknown algorithm", []string{"-mode", "verify", "-alg", "rsa"}},
		{"empty pool", []string{"-mode", "verify", "-pool", "0"}},
		{"non-loopback target", []string{"-url", "http://192.168.1.1:8080"}},
		{"watch without a pid", []string{"-watch", "server"}},
		{"a relative path for the gateway modes", []string{"-mode", "first", "-path", "orders"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parseFlags(tt.args, io.Discard); err == nil {
				t.Fatalf("parseFlags(%q) accepted it", tt.args)
			}
		})
	}
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.workers != 64 || c.duration != 10*time.Second || c.mode != "pairs" {
		t.Fatalf("defaults = %d workers, %v, %s; want 64, 10s, pairs", c.workers, c.duration, c.mode)
	}
}

func TestDialerRefusesNonLoopback(t *testing.T) {
	c := newClient(1, time.Second)
	req, err := http.NewRequest(http.MethodGet, "http://192.0.2.1:9/", nil) // TEST-NET-1: never routed
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Do(req)
	if !errors.Is(err, errNotLoopback) {
		t.Fatalf("dialing 192.0.2.1 = %v, want errNotLoopback before any packet is sent", err)
	}
}

func TestForgedTokensAreWellFormedButUnsigned(t *testing.T) {
	key := token.Key{ID: "current", Secret: []byte("0123456789abcdef0123456789abcdef")}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, []token.Key{key}, token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	forged, err := forgeTokens(key.ID, 3, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(forged) != 3 || forged[0] == forged[1] {
		t.Fatalf("forgeTokens gave %d tokens, want 3 distinct ones", len(forged))
	}
	for _, tok := range forged {
		if _, err := svc.Parse(tok); !errors.Is(err, token.ErrInvalid) {
			t.Fatalf("Parse(forged) = %v, want ErrInvalid", err)
		}
		if kid, err := kidOf(tok); err != nil || kid != key.ID {
			t.Fatalf("kidOf(forged) = %q, %v; want %q", kid, err, key.ID)
		}
	}
	// The same claims signed with the real key pass Parse: only the
	// signature is wrong in a forged token.
	genuine, err := signToken(key.ID, key.Secret, "123456789", now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Parse(genuine); err != nil {
		t.Fatalf("Parse(same shape, real key) = %v, want nil", err)
	}
	// And the header is the one the server writes, so the server's
	// fastest rejection path is what gets measured.
	issued, err := svc.Issue(context.Background(), token.IssueRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h := strings.Split(issued.Token, ".")[0]; h != strings.Split(forged[0], ".")[0] {
		t.Fatalf("forged header %q differs from the server's %q", strings.Split(forged[0], ".")[0], h)
	}
	if _, _, err := jwt.NewParser().ParseUnverified(forged[0], jwt.MapClaims{}); err != nil {
		t.Fatalf("forged token does not parse as a JWT: %v", err)
	}
}

func TestTokenFrom(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"compact JSON", `{"token":"a.b.c","id":"1"}`, "a.b.c"},
		{"spaced JSON falls back to decoding", `{ "token" : "a.b.c" }`, "a.b.c"},
		{"escaped value falls back to decoding", `{"token":"a\/b"}`, "a/b"},
		{"missing field", `{"id":"1"}`, ""},
		{"not JSON", `oops`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tokenFrom([]byte(tt.body), "token"); got != tt.want {
				t.Fatalf("tokenFrom(%s) = %q, want %q", tt.body, got, tt.want)
			}
		})
	}
}

func TestQuantile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	tests := []struct {
		q    float64
		want time.Duration
	}{{.50, 50 * time.Millisecond}, {.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}, {0, time.Millisecond}}
	for _, tt := range tests {
		if got := quantile(d, tt.q); got != tt.want {
			t.Errorf("quantile(1..100ms, %v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if got := quantile(nil, .5); got != 0 {
		t.Errorf("quantile(nil) = %v, want 0", got)
	}
}

// TestRunModes drives each mode for a moment against a real Replayguard
// stack on the memory store (pairs, forged) and a 204 route (noop).
func TestRunModes(t *testing.T) {
	st := memory.New()
	defer st.Close()
	rg := httptest.NewServer(newStack(t, "engine", st))
	defer rg.Close()
	noop := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	defer noop.Close()

	tests := []struct {
		name, mode, url string
		status          string
		flags           []string
	}{
		{"pairs are issued then redeemed", "pairs", rg.URL, "201", nil},
		{"forged tokens are refused as token_invalid", "forged", rg.URL, "401", nil},
		{"noop answers 204", "noop", noop.URL, "204", nil},
		{"hmac-signed requests are verified", "verify", rg.URL, "200", []string{"-alg", "hmac"}},
		{"ed25519-signed requests are verified", "verify", rg.URL, "200", []string{"-alg", "ed25519"}},
		{"pre-issued tokens are redeemed", "redeem", rg.URL, "200", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"-url", tt.url, "-mode", tt.mode, "-workers", "4", "-duration", "10s", "-max-requests", "200", "-forged-pool", "8", "-pool", "300"}, tt.flags...)
			cfg, err := parseFlags(args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			s, err := run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !s.Clean || s.StoppedBy != "max-requests" || s.Statuses[tt.status] == 0 {
				t.Fatalf("summary = %+v, want a clean run stopped by max-requests with %s answers", s, tt.status)
			}
			if s.Requests > 200 {
				t.Fatalf("%d requests sent, over the budget of 200", s.Requests)
			}
			if tt.mode == "pairs" && (s.OK != s.Statuses["200"] || s.Statuses["201"] != s.Statuses["200"]) {
				t.Fatalf("pairs: %d ok, statuses %v; want every 201 followed by a 200", s.OK, s.Statuses)
			}
			if (tt.mode == "verify" || tt.mode == "redeem") && (s.OK != s.Requests || s.Pool != 300) {
				t.Fatalf("%s: %d ok of %d requests from a pool of %d; want every request a success", tt.mode, s.OK, s.Requests, s.Pool)
			}
		})
	}
}

// TestPooledModesSendEachRequestOnce checks that verify and redeem stop
// when their prepared requests run out rather than send one twice: a
// second use would be a replay, or a token already redeemed.
func TestPooledModesSendEachRequestOnce(t *testing.T) {
	st := memory.New()
	defer st.Close()
	rg := httptest.NewServer(newStack(t, "engine", st))
	defer rg.Close()
	for _, mode := range []string{"verify", "redeem"} {
		t.Run(mode, func(t *testing.T) {
			ready := filepath.Join(t.TempDir(), "ready")
			cfg, err := parseFlags([]string{"-url", rg.URL, "-mode", mode, "-workers", "8", "-duration", "1m", "-pool", "50", "-ready-file", ready}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			s, err := run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if !s.Clean || s.StoppedBy != "pool" || s.OK != 50 || s.Requests != 50 {
				t.Fatalf("summary = %+v, want 50 successes out of 50 requests, stopped by pool", s)
			}
			if _, err := os.Stat(ready); err != nil {
				t.Fatalf("-ready-file: %v", err)
			}
		})
	}
}

// TestSignedBodyIsWhatTheEndpointTakes checks a prepared verify body
// against the README's shape and the replay package's Verifier directly:
// the method, the URL, the three headers and the base64 body, signed so
// that it verifies once and is a replay the second time.
func TestSignedBodyIsWhatTheEndpointTakes(t *testing.T) {
	file, err := clientKeysFile()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := replay.ParseKeys(file)
	if err != nil {
		t.Fatalf("the client keys file does not parse: %v\n%s", err, file)
	}
	st := memory.New()
	defer st.Close()
	v := replay.NewVerifier(keys, st)
	const target = "https://api.example.com/v1/orders?id=7"
	for alg, want := range verifyAlgs {
		t.Run(alg, func(t *testing.T) {
			s, err := newSigner(alg, "")
			if err != nil {
				t.Fatal(err)
			}
			b, err := signedBody(s, target)
			if err != nil {
				t.Fatal(err)
			}
			var got verifyRequest
			dec := json.NewDecoder(bytes.NewReader(b))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("body %s: %v", b, err)
			}
			if got.Method != http.MethodPost || got.URL != target || len(got.Headers) != 3 {
				t.Fatalf("body %s: want POST %s with three headers", b, target)
			}
			payload, err := base64.StdEncoding.DecodeString(got.Body)
			if err != nil || string(payload) != verifyPayload {
				t.Fatalf("body %q decodes to %q, %v; want %q", got.Body, payload, err, verifyPayload)
			}
			h := http.Header{}
			for k, val := range got.Headers {
				h.Set(k, val)
			}
			u, err := url.Parse(got.URL)
			if err != nil {
				t.Fatal(err)
			}
			m := replay.Message{Method: got.Method, URL: u, Header: h, Body: payload}
			res, err := v.Verify(context.Background(), m)
			if err != nil || res.KeyID != want.keyID {
				t.Fatalf("Verify = %+v, %v; want key %s", res, err, want.keyID)
			}
			if _, err := v.Verify(context.Background(), m); !errors.Is(err, replay.ErrReplayed) {
				t.Fatalf("second Verify = %v, want ErrReplayed", err)
			}
		})
	}
}

func TestRunCountsUnexpectedAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/tokens" {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"token":"x"}`)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	cfg, err := parseFlags([]string{"-url", srv.URL, "-workers", "2", "-max-requests", "20"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Clean || s.OK != 0 || s.Status5xx != 10 || s.Unexpected != 10 || s.Non2xx != 10 {
		t.Fatalf("summary = %+v, want 10 unexpected 503s and no pairs", s)
	}
}

func TestReport(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.jsonl")
	// Two rounds of Replayguard pairs: 1000/s and 800/s over 5 s each,
	// p99 from the merged histograms (bucket 465 holds 9.98-10.18 ms and
	// reads as 10.078 ms).
	lines := []string{
		`{"kind":"load","label":"replayguard","mode":"pairs","duration_s":5,"ok":5000,"ok_per_s":1000,"p99_ms":10,"latency_hist":{"0":90,"465":10},"cpu_s":{"server":1,"other":1},"num_cpu":2}`,
		`{"kind":"load","label":"baseline","mode":"pairs","duration_s":10,"ok":10000,"ok_per_s":1000,"p99_ms":9,"cpu_s":{"server":0.5,"redis":0.5,"load":1}}`,
		`{"kind":"load","label":"replayguard","mode":"forged","duration_s":10,"ok":5000,"ok_per_s":500}`,
		`{"kind":"load","label":"baseline","mode":"noop","duration_s":10,"ok":10000,"ok_per_s":1000}`,
		`{"kind":"load","label":"replayguard","mode":"verify","alg":"hmac","duration_s":8,"ok":5600,"ok_per_s":700,"stopped_by":"pool"}`,
		`{"kind":"load","label":"baseline","mode":"redeem","duration_s":10,"ok":10000,"ok_per_s":1000}`,
		`{"kind":"load","label":"replayguard","mode":"pairs","duration_s":5,"ok":4000,"ok_per_s":800,"p99_ms":10,"latency_hist":{"0":90,"465":10},"cpu_s":{"server":0.8,"other":0},"num_cpu":2}`,
		// The PostgreSQL instance, in the same rounds: 450 pairs/s, p50 in
		// bucket 418 (3.97 ms), p99 in bucket 500 (20.16 ms).
		`{"kind":"load","label":"replayguard-postgres","mode":"pairs","duration_s":5,"ok":2000,"ok_per_s":400,"p50_ms":4,"p99_ms":20,"latency_hist":{"418":90,"500":10},"cpu_s":{"server":1,"postgres":2.5,"load":0.5,"other":0},"num_cpu":2}`,
		// The memory-store instance (no store process), a Cluster instance
		// and pairs at one connection (-name pairs-1conn).
		`{"kind":"load","label":"replayguard-memory","mode":"pairs","workers":64,"duration_s":10,"ok":25000,"ok_per_s":2500,"cpu_s":{"server":2,"load":0.5}}`,
		`{"kind":"load","label":"replayguard-cluster","mode":"pairs","workers":64,"duration_s":10,"ok":8000,"ok_per_s":800,"p50_ms":1,"p99_ms":12}`,
		`{"kind":"load","label":"replayguard","mode":"pairs","name":"pairs-1conn","workers":1,"duration_s":10,"ok":3000,"ok_per_s":300,"p50_ms":0.3,"p90_ms":0.5,"p99_ms":1}`,
		`{"kind":"load","label":"baseline","mode":"pairs","name":"pairs-1conn","workers":1,"duration_s":10,"ok":3500,"ok_per_s":350,"p50_ms":0.25,"p90_ms":0.4,"p99_ms":0.8}`,
		`{"kind":"load","label":"replayguard-postgres","mode":"pairs","duration_s":5,"ok":2500,"ok_per_s":500,"p50_ms":4,"p99_ms":20,"latency_hist":{"418":90,"500":10},"cpu_s":{"server":1,"postgres":2.5,"load":0.5,"other":0},"num_cpu":2}`,
	}
	if err := os.WriteFile(runs, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	gob := filepath.Join(dir, "go.txt")
	if err := os.WriteFile(gob, []byte("pkg: github.com/replayguard/replayguard/store/memory\nBenchmarkRedeemParallel-2   \t 1000\t 300.0 ns/op\t 3000000 redeems/s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rb := filepath.Join(dir, "redis.txt")
	if err := os.WriteFile(rb, []byte("SET: rps=1\rSET: 100000.00 requests per second, p50=0.200 msec\n# a note\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := report([]string{"-runs", runs, "-gobench", gob, "-redisbench", rb}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"| replayguard | pairs | 2 | 10.0 | **900** (1000, 800) |",
		// 1.8 s of CPU over 9000 pairs against 2 s over 10000: 200 µs each.
		"| pairs/s ≥ 1.0× the baseline's | 900 vs 1000 pairs/s | 0.90× | 1.00× | **MISS** |",
		"| stretch: pairs/s ≥ 1.2× the baseline's | 900 vs 1000 pairs/s | 0.90× | 1.00× | stretch: not met |",
		"| p99 (issue + redeem) < 25 ms (older target) | 10.08 ms | - | - | **pass** |",
		"| p99 (issue + redeem) ≤ 1.0× the baseline's | 10.08 vs 9.00 ms | 1.12× | - | **MISS** |",
		"| 200 | 5% |", // server CPU µs per pair: 1.8 s / 9000; other: 1 s of 2 CPUs × 10 s
		"| forged rejections/s ≥ 0.80 of the baseline's bare 204 | 500 vs 1000 req/s | 0.50× | n/a | **MISS** |",
		"| forged answer from a bare Gin handler (bound401) against the baseline's 204 (no target: the ceiling of the forged ratio) | not run | - | - | listed |",
		"| memory store in-process ≥ 2M redeems/s (BenchmarkRedeemParallel) | 3,000,000 redeems/s (lowest of 1 runs) | - | - | **pass** |",
		"| verify/hmac: verified signed requests/s ≥ 0.80 of the baseline's GETDEL redeems/s | 700 vs 1000 req/s | 0.70× | n/a | **MISS** |",
		// 2.5 s of CPU over 25000 pairs: 100 µs, half the baseline's.
		"| embedded server (memory store) pairs/s ≥ 2× the baseline's on Redis | 2500 vs 1000 pairs/s | 2.50× | 2.00× | **pass** |",
		"| p50 at 1 connection (no target: must not rise, compare runs) | p50 0.300 vs 0.250 ms, p99 1.000 vs 0.800 ms; 300 vs 350 pairs/s | p50 1.20× | n/a | listed |",
		"| Redis Cluster pairs/s (no target) | 800 pairs/s, p50 1.00 ms, p99 12.00 ms (baseline 1000 pairs/s) | 0.80× | n/a | listed |",
		"| PostgreSQL pairs/s (no target) | 450 pairs/s, p50 3.97 ms, p99 20.16 ms (baseline 1000 pairs/s) | 0.45× | 0.11× | listed |",
		"| replayguard | **300** (300) | 0.300 | 0.500 | 1.000 | 1.20× | 1.25× | n/a |",
		"| baseline | **350** (350) | 0.250 | 0.400 | 0.800 | 1.00× | 1.00× | n/a |",
		"| replayguard | pairs-1conn | baseline pairs-1conn | 86% |",
		"| memory (embedded) | replayguard-memory | **2500** (2500) | 0.00 | 0.00 | 278% | 0.00× | 100 | 2.50× | 2.00× |",
		"| Redis Cluster (3 masters) | replayguard-cluster | **800** (800) |",
		"Sonyflake (replayguard-memory): 2500 issues/s",
		"| replayguard | verify/hmac | baseline redeem | 70% |",
		"1 of 1 rounds of replayguard verify/hmac sent every prepared request",
		"| `SET` | 100,000 | 0.200 |",
		"| replayguard-postgres | pairs | 2 | 10.0 | **450** (400, 500) |", // its rounds merged by label
		"| 1.0 / 2.5 / 0.5 / - / 0.0 / - |",                                // its store's CPU in the store column
		"| Redis | replayguard | **900** (1000, 800) | 0.00 | 10.08 | 100% | 1.00× |",
		// 4500 pairs over 10 s; 8 s of CPU over 4500 pairs is 1778 µs.
		"| PostgreSQL | replayguard-postgres | **450** (400, 500) | 3.97 | 20.16 | 50% | 2.00× | 1778 | 0.45× | 0.11× |",
		"- a note",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	// pairs, p99 against the baseline's, forged and verify/hmac.
	if n := strings.Count(got, "**MISS**"); n != 4 {
		t.Errorf("report has %d misses, want 4:\n%s", n, got)
	}
}

// TestReportBound checks the rows of bound401, the forged answer from a
// bare Gin handler: listed against the baseline's 204, and Replayguard's
// forged rate as a share of it; neither counts as a miss.
func TestReportBound(t *testing.T) {
	const (
		// 6400 rejections in 10 s on 1.92 s of CPU: 300 µs each.
		forged = `{"kind":"load","label":"replayguard","mode":"forged","duration_s":10,"ok":6400,"ok_per_s":640,"cpu_s":{"server":0.92,"redis":0,"load":1}}`
		// 10000 204s in 10 s on 1.5 s: 150 µs each.
		noop = `{"kind":"load","label":"baseline","mode":"noop","duration_s":10,"ok":10000,"ok_per_s":1000,"cpu_s":{"server":0.5,"redis":0,"load":1}}`
		// 8000 401s in 10 s on 1.6 s, no store: 200 µs each.
		bound = `{"kind":"load","label":"bound401","mode":"forged","duration_s":10,"ok":8000,"ok_per_s":800,"cpu_s":{"server":0.6,"load":1}}`

		boundRow = "| forged answer from a bare Gin handler (bound401) against the baseline's 204 (no target: the ceiling of the forged ratio) | "
		shareRow = "| Replayguard's forged rejections/s as a share of bound401's (ratios against bound401, not the baseline) | "
	)
	tests := []struct {
		name   string
		lines  []string
		want   []string
		absent []string
	}{
		{
			"bound401 ran with Replayguard's forged and the baseline's noop",
			[]string{forged, noop, bound},
			[]string{
				boundRow + "800 vs 1000 req/s | 0.80× | 0.75× | listed |",
				shareRow + "640 vs 800 req/s | 0.80× | 0.67× | listed |",
				"| forged rejections/s ≥ 0.80 of the baseline's bare 204 | 640 vs 1000 req/s | 0.64× | 0.50× | **MISS** |",
				"| bound401 | forged | baseline noop | 80% | 75% |", // the ratio table has it too
			},
			nil,
		},
		{
			"bound401 not run (BOUND=0)",
			[]string{forged, noop},
			[]string{boundRow + "not run | - | - | listed |"},
			[]string{shareRow},
		},
		{
			"no baseline noop run",
			[]string{forged, bound},
			[]string{
				boundRow + "800 req/s; missing baseline noop run | - | - | listed |",
				shareRow + "640 vs 800 req/s | 0.80× | 0.67× | listed |",
			},
			nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkListedRows(t, tt.lines, tt.want, tt.absent, "bound401") })
	}
}

// TestReportBoundPairs checks the rows of boundpairs, Replayguard's issue
// and redeem answers from a bare Gin handler on an in-process map: listed
// against the baseline's pairs on Redis next to the embedded server's
// target, and the embedded server's pairs as a share of it; neither
// counts as a miss.
func TestReportBoundPairs(t *testing.T) {
	const (
		// 10000 pairs in 10 s on 2 s of CPU: 200 µs each.
		base = `{"kind":"load","label":"baseline","mode":"pairs","duration_s":10,"ok":10000,"ok_per_s":1000,"cpu_s":{"server":0.5,"redis":0.5,"load":1}}`
		// 15000 pairs in 10 s on 2.55 s, no store process: 170 µs each.
		memory = `{"kind":"load","label":"replayguard-memory","mode":"pairs","duration_s":10,"ok":15000,"ok_per_s":1500,"cpu_s":{"server":1.2,"load":1.35}}`
		// 20000 pairs in 10 s on 2 s, no store process: 100 µs each.
		bound = `{"kind":"load","label":"boundpairs","mode":"pairs","duration_s":10,"ok":20000,"ok_per_s":2000,"cpu_s":{"server":0.6,"load":1.4}}`

		boundRow = "| pairs from a bare Gin handler on an in-process map (boundpairs) against the baseline's on Redis (no target: the ceiling of the embedded ratio) | "
		shareRow = "| the embedded server's pairs/s as a share of boundpairs' (ratios against boundpairs, not the baseline) | "
	)
	tests := []struct {
		name   string
		lines  []string
		want   []string
		absent []string
	}{
		{
			"boundpairs ran with the embedded server and the baseline",
			[]string{base, memory, bound},
			[]string{
				"| embedded server (memory store) pairs/s ≥ 2× the baseline's on Redis | 1500 vs 1000 pairs/s | 1.50× | 1.18× | **MISS** |\n" +
					boundRow + "2000 vs 1000 pairs/s | 2.00× | 2.00× | listed |\n" +
					shareRow + "1500 vs 2000 pairs/s | 0.75× | 0.59× | listed |\n",
				"| boundpairs | pairs | baseline pairs | 200% | 200% |", // the ratio table has it too
			},
			[]string{"Sonyflake (boundpairs)"},
		},
		{
			"boundpairs not run (BOUND=0)",
			[]string{base, memory},
			[]string{boundRow + "not run | - | - | listed |"},
			[]string{shareRow},
		},
		{
			"no baseline pairs run",
			[]string{memory, bound},
			[]string{
				boundRow + "2000 pairs/s; missing baseline pairs run | - | - | listed |",
				shareRow + "1500 vs 2000 pairs/s | 0.75× | 0.59× | listed |",
			},
			nil,
		},
		{
			"no embedded server run (MEMORY=0)",
			[]string{base, bound},
			[]string{boundRow + "2000 vs 1000 pairs/s | 2.00× | 2.00× | listed |"},
			[]string{shareRow},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkListedRows(t, tt.lines, tt.want, tt.absent, "boundpairs") })
	}
}

// checkListedRows runs load report on the JSON lines and wants each of
// want in its output, none of absent, and no row naming label counted as
// a miss (a ceiling's rows are listed, not targets).
func checkListedRows(t *testing.T, lines, want, absent []string, label string) {
	t.Helper()
	runs := filepath.Join(t.TempDir(), "runs.jsonl")
	if err := os.WriteFile(runs, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := report([]string{"-runs", runs}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("report lacks %q:\n%s", w, got)
		}
	}
	for _, a := range absent {
		if strings.Contains(got, a) {
			t.Errorf("report has %q:\n%s", a, got)
		}
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.Contains(line, label) && strings.Contains(line, "**MISS**") {
			t.Errorf("a %s row counts as a miss: %s", label, line)
		}
	}
}

func TestPerfSplitClassifies(t *testing.T) {
	const (
		next    = "\t 1 github.com/gin-gonic/gin.(*Context).Next+0x5f (/srv)\n"
		logMW   = "\t 2 github.com/replayguard/replayguard/handlers.(*API).Engine.logRequests.func5+0x52 (/srv)\n"
		serve   = "\t 3 net/http.(*conn).serve+0x690 (/srv)\n"
		handler = "\t 4 github.com/replayguard/replayguard/handlers.(*API).redeem+0x2e7 (/srv)\n"
	)
	sample := func(leaf ...string) string {
		return "server 1 [000] 1.0: 1001 cpu-clock:\n" + strings.Join(leaf, "") + "\n"
	}
	tests := []struct {
		name, script, want string
	}{
		{"JWT work inside a handler is JWT, not the logging middleware around it",
			sample("\t 9 runtime.mallocgc+0x1 (/srv)\n", "\t 8 github.com/golang-jwt/jwt/v5.(*Parser).ParseUnverified+0x1 (/srv)\n", handler, next, logMW, next, serve),
			"JWT sign / verify (token, golang-jwt, crypto)"},
		{"the middleware's own frames are logging",
			sample("\t 9 log/slog.(*Logger).LogAttrs+0x1 (/srv)\n", logMW, next, serve),
			"request logging (handlers logRequests, log/slog, its write(2))"},
		{"a Redis write syscall belongs to the Redis client",
			sample("\t a tcp_sendmsg+0x1 ([kernel.kallsyms])\n", "\t 9 github.com/redis/go-redis/v9.(*baseClient).withConn+0x4a (/srv)\n", handler, next, serve),
			"Redis client (store/redis, go-redis, its socket syscalls)"},
		{"an HTTP write syscall is kernel time",
			sample("\t a tcp_sendmsg+0x1 ([kernel.kallsyms])\n", "\t 9 net/http.(*response).finishRequest+0x1 (/srv)\n", serve),
			"kernel, outside the above: HTTP socket I/O, loopback TCP, scheduling"},
		{"a nonce's round trip inside replay.Verify is Redis",
			sample("\t a tcp_sendmsg+0x1 ([kernel.kallsyms])\n", "\t 9 github.com/redis/go-redis/v9.(*baseClient).withConn+0x4a (/srv)\n", "\t 8 github.com/replayguard/replayguard/replay.(*Verifier).Verify+0x1 (/srv)\n", handler, next, serve),
			"Redis client (store/redis, go-redis, its socket syscalls)"},
		{"ed25519 under replay.Verify is signature verification, not JWT",
			sample("\t 9 crypto/internal/fips140/edwards25519.(*Point).VarTimeDoubleScalarBaseMult+0x1 (/srv)\n", "\t 8 crypto/ed25519.Verify+0x1 (/srv)\n", "\t 7 github.com/replayguard/replayguard/replay.(*Verifier).Verify+0x1 (/srv)\n", handler, next, serve),
			"signature verification (replay, httpsfv, its crypto)"},
		{"proxying inside a guarded request is upstream proxying, not the records",
			sample("\t b tcp_sendmsg+0x1 ([kernel.kallsyms])\n", "\t a net/http/httputil.(*ReverseProxy).ServeHTTP+0x1 (/srv)\n", "\t 9 github.com/replayguard/replayguard/gateway.(*Gateway).forward+0x1 (/srv)\n", "\t 8 github.com/replayguard/replayguard/guard.(*settings).idempotent+0x1 (/srv)\n", next, serve),
			"upstream proxying (gateway forward, httputil, net/http Transport, its socket syscalls)"},
		{"the Transport's write loop is upstream proxying",
			sample("\t a tcp_sendmsg+0x1 ([kernel.kallsyms])\n", "\t 9 net/http.(*persistConn).writeLoop+0x1 (/srv)\n"),
			"upstream proxying (gateway forward, httputil, net/http Transport, its socket syscalls)"},
		{"SHA-256 of a request fingerprint is the fingerprint, not JWT",
			sample("\t a crypto/sha256.(*Digest).Write+0x1 (/srv)\n", "\t 9 github.com/replayguard/replayguard/guard.fingerprint+0x1 (/srv)\n", "\t 8 github.com/replayguard/replayguard/guard.(*settings).idempotent+0x1 (/srv)\n", next, serve),
			"request fingerprint (guard fingerprint: canonical body, SHA-256)"},
		{"a record's lease heartbeat goroutine is the records",
			sample("\t a runtime.newTimer+0x1 (/srv)\n", "\t 9 github.com/replayguard/replayguard/idempotency.(*Run).heartbeat+0x1 (/srv)\n"),
			"idempotency records (guard Idempotent, idempotency, memory store records)"},
		{"a replayed answer's write is the records",
			sample("\t a runtime.memmove+0x1 (/srv)\n", "\t 9 github.com/replayguard/replayguard/guard.writeStored+0x1 (/srv)\n", "\t 8 github.com/replayguard/replayguard/guard.(*settings).idempotent+0x1 (/srv)\n", next, serve),
			"idempotency records (guard Idempotent, idempotency, memory store records)"},
		{"background marking is GC wherever it runs",
			sample("\t 9 runtime.scanobject+0x1 (/srv)\n", "\t 8 runtime.gcBgMarkWorker+0x1 (/srv)\n"),
			"Go GC (background marking, assists, sweeping)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			counts, total, err := perfSplit(strings.NewReader(tt.script))
			if err != nil || total != 1 || counts[tt.want] != 1 {
				t.Fatalf("perfSplit = %v, %d, %v; want one sample in %q", counts, total, err, tt.want)
			}
		})
	}
}
