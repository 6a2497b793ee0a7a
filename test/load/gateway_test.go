package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
)

// orderApp stands in for ./app: 201, a Location and a body that carry
// the execution's number, which it counts.
type orderApp struct{ runs atomic.Int64 }

func (a *orderApp) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n := a.runs.Add(1)
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d}`, n)
}

// TestGatewayModes runs every gateway mode against what gateway.sh
// points it at: the app, or a gateway in front of it with the routes of
// gateway-routes.yaml, on the memory store. It counts the app's
// executions: one per request, except in the repeat modes, where only
// each worker's first request runs.
func TestGatewayModes(t *testing.T) {
	app := &orderApp{}
	appSrv := httptest.NewServer(app)
	defer appSrv.Close()
	routes, err := gateway.LoadRoutes("gateway-routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st := memory.New()
	defer st.Close()
	up, err := url.Parse(appSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(up, routes, gateway.WithKeeper(idempotency.New(st)))
	if err != nil {
		t.Fatal(err)
	}
	gwSrv := httptest.NewServer(gw)
	defer gwSrv.Close()

	const workers, requests = 4, 200
	tests := []struct {
		name, mode, url, path string
		wantRuns              int64
	}{
		{"bare: every order runs in the app", "bare", appSrv.URL, "/orders", requests},
		{"passthrough: every order on an unrouted path runs", "passthrough", gwSrv.URL, "/plain", requests},
		{"first: every fresh key runs", "first", gwSrv.URL, "/orders", requests},
		{"replay: only each worker's first request runs", "replay", gwSrv.URL, "/orders", workers},
		{"fp-first: every new body runs", "fp-first", gwSrv.URL, "/submit", requests},
		{"fp-replay: only each worker's first body runs", "fp-replay", gwSrv.URL, "/submit", workers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := app.runs.Load()
			cfg, err := parseFlags([]string{"-url", tt.url, "-mode", tt.mode, "-path", tt.path, "-workers", strconv.Itoa(workers), "-duration", "1m", "-max-requests", strconv.Itoa(requests)}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			s, err := run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			wantReplayed := int64(0)
			if gatewayModes[tt.mode].repeat {
				wantReplayed = requests
			}
			if !s.Clean || s.StoppedBy != "max-requests" || s.OK != requests || s.Requests != requests || s.Replayed != wantReplayed {
				t.Fatalf("summary = %+v, want %d successes of %d requests, %d replayed", s, requests, requests, wantReplayed)
			}
			if runs := app.runs.Load() - before; runs != tt.wantRuns {
				t.Fatalf("the app ran %d times, want %d", runs, tt.wantRuns)
			}
		})
	}
}

// TestGatewayModeRefusesReexecution points replay at the bare app, which
// runs every request again: each answer must count as unexpected.
func TestGatewayModeRefusesReexecution(t *testing.T) {
	srv := httptest.NewServer(&orderApp{})
	defer srv.Close()
	cfg, err := parseFlags([]string{"-url", srv.URL, "-mode", "replay", "-workers", "2", "-max-requests", "20"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Clean || s.OK != 0 || s.Unexpected != 20 || !strings.Contains(s.FirstError, "ran again") {
		t.Fatalf("summary = %+v, want 20 unexpected answers that ran again", s)
	}
}

func TestCheckOrder(t *testing.T) {
	first := &repeat{location: "/orders/1", answer: []byte(`{"id":1}`)}
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	replayed := idempotency.ReplayedHeader
	tests := []struct {
		name    string
		status  int
		h       http.Header
		body    string
		want    *repeat
		wantErr string
	}{
		{"a new order is 201 with a Location", 201, hdr("Location", "/orders/2"), `{"id":2}`, nil, ""},
		{"another status is an error", 409, hdr(), `{"code":"request_in_progress"}`, nil, "409"},
		{"201 without a Location is an error", 201, hdr(), `{}`, nil, "without a Location"},
		{"a new request answered as a replay is an error", 201, hdr("Location", "/orders/1", replayed, "true"), `{"id":1}`, nil, "answered as a replay"},
		{"the replay of the first answer passes", 201, hdr("Location", "/orders/1", replayed, "true"), `{"id":1}`, first, ""},
		{"a repeat that ran again is an error", 201, hdr("Location", "/orders/3"), `{"id":3}`, first, "ran again"},
		{"a replay with another body is an error", 201, hdr("Location", "/orders/1", replayed, "true"), `{"id":9}`, first, "differs"},
		{"a replay with another Location is an error", 201, hdr("Location", "/orders/9", replayed, "true"), `{"id":1}`, first, "differs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkOrder(tt.status, tt.h, []byte(tt.body), tt.want)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("checkOrder = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestGatewayReport(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.jsonl")
	// The bare app: two rounds of 1000/s over 5 s, CPU 1 s (app) + 1 s
	// (load) = 200 µs per success, p50 and p99 from the merged histograms
	// (buckets 348 and 383 read as 0.993 and 1.986 ms); the memory gateway's replays: 500/s,
	// 2 s of gateway CPU and 1 s each of app and load = 400 µs; its first
	// executions: one round of 250/s with 3 errors; a non-gateway run
	// that the report leaves out.
	lines := []string{
		`{"kind":"load","label":"memory","mode":"first","duration_s":4,"requests":1003,"ok":1000,"ok_per_s":250,"p50_ms":4,"p99_ms":8,"unexpected":3,"statuses":{"201":1000,"409":3}}`,
		`{"kind":"load","label":"app","mode":"bare","duration_s":5,"requests":5000,"ok":5000,"ok_per_s":1000,"p50_ms":1,"p99_ms":2,"latency_hist":{"348":98,"383":2},"cpu_s":{"app":0.5,"load":0.5,"other":0.5},"num_cpu":2,"statuses":{"201":5000}}`,
		`{"kind":"load","label":"memory","mode":"replay","duration_s":10,"pool":64,"requests":5000,"ok":5000,"ok_per_s":500,"p50_ms":2,"p99_ms":3,"replayed":5000,"cpu_s":{"server":2,"app":1,"load":1},"statuses":{"201":5000}}`,
		`{"kind":"load","label":"app","mode":"bare","duration_s":5,"requests":5000,"ok":5000,"ok_per_s":1000,"p50_ms":1,"p99_ms":2,"latency_hist":{"348":98,"383":2},"cpu_s":{"app":0.5,"load":0.5,"other":0.5},"num_cpu":2,"statuses":{"201":5000}}`,
		`{"kind":"load","label":"replayguard","mode":"pairs","duration_s":5,"ok":5000,"ok_per_s":1000}`,
		`{"kind":"load","label":"memory","mode":"passthrough","duration_s":5,"ok":4000,"ok_per_s":800,"requests":4000}`,
	}
	if err := os.WriteFile(runs, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The app ran once per request of bare (2 × 5000), pass-through
	// (4000) and first (1003), and once per worker before the replays
	// (64).
	const executions = 10000 + 4000 + 1003 + 64
	var out strings.Builder
	if err := gatewayReport([]string{"-runs", runs, "-app-executions", strconv.Itoa(executions)}, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"| bare app (no gateway) | — | 2 | **1000** (1000, 1000) | 100% | — | 0.99 | 1.99 | 1.00× | 1.00× |",
		"| - / 100 / - | 200 | 1.00× | 5% |",
		"| pass-through (unrouted path) | memory | 1 | **800** (800) | 80% | 100% |",
		"| idempotency_key: first execution | memory | 1 | **250** (250) | 25% | 31% | 4.00 | 8.00 | 4.03× | 4.03× | 0 | 3 |",
		"| idempotency_key: replay | memory | 1 | **500** (500) | 50% | 62% | 2.00 | 3.00 | 2.01× | 1.51× | 5000 | 0 | 400 / 200 / - | 800 | 4.00× |",
		"| 2 | — | bare app (no gateway) | 5.0 | 1000 |",
		"| 1 | memory | idempotency_key: first execution | 4.0 | 250 | 4.00 | 8.00 | 201: 1000, 409: 3 | 0 | 3 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if !strings.Contains(got, "App executions: 15067 counted by the app, 15067 expected") {
		t.Errorf("report lacks the app's executions:\n%s", got)
	}
	if err := gatewayReport([]string{"-runs", runs, "-app-executions", strconv.Itoa(executions + 1)}, io.Discard); err == nil || !strings.Contains(err.Error(), "15068 executions, want 15067") {
		t.Errorf("one execution too many: gatewayReport = %v, want a mismatch", err)
	}
	if strings.Contains(got, "pairs") {
		t.Errorf("report shows a non-gateway run:\n%s", got)
	}
	// The bare app first, then the store's modes in gatewayOrder.
	bare, first, replay := strings.Index(got, "| bare app"), strings.Index(got, "| idempotency_key: first"), strings.Index(got, "| idempotency_key: replay")
	if bare >= first || first >= replay {
		t.Errorf("rows out of order (bare %d, first %d, replay %d):\n%s", bare, first, replay, got)
	}
}
