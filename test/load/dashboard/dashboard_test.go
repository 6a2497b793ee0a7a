package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestExpand(t *testing.T) {
	d, err := loadDashboard("testdata/tiny.json")
	if err != nil {
		t.Fatal(err)
	}
	in := newInterp(d, 2*time.Second, 5*time.Second, 90*time.Second)
	in.Vars["instance"] = "127.0.0.1:8080"
	tests := []struct {
		name, expr, want string
	}{
		{"rate interval, plain", `rate(x[$__rate_interval])`, `rate(x[5s])`},
		{"rate interval, braced", `rate(x[${__rate_interval}])`, `rate(x[5s])`},
		{"interval is the step", `avg_over_time(x[$__interval])`, `avg_over_time(x[2s])`},
		{"range", `increase(x[$__range])`, `increase(x[90s])`},
		{"range in seconds and interval in ms", `x / $__range_s + $__interval_ms`, `x / 90 + 2000`},
		{"All becomes the variable's allValue", `x{job=~"$job"}`, `x{job=~".+"}`},
		{"a format suffix is dropped", `x{job=~"${job:regex}"}`, `x{job=~".+"}`},
		{"old bracket syntax", `x{job=~"[[job]]"}`, `x{job=~".+"}`},
		{"a set value is used as is", `x{instance="$instance"}`, `x{instance="127.0.0.1:8080"}`},
		{"an unknown variable is left for Prometheus to name", `x{a="$nope"}`, `x{a="$nope"}`},
		{"a longer name is not taken for a shorter one", `x{a="$jobs"}`, `x{a="$jobs"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := in.expand(tc.expr); got != tc.want {
				t.Errorf("expand(%q) = %q, want %q", tc.expr, got, tc.want)
			}
		})
	}
	if _, ok := in.Vars["datasource"]; ok {
		t.Error("a datasource variable was taken for a query variable")
	}
}

func TestMillisecondIntervals(t *testing.T) {
	in := &Interp{Step: 1500 * time.Millisecond, RateInterval: 5 * time.Second}
	if got := in.expand("x[$__interval]"); got != "x[1500ms]" {
		t.Errorf("got %q", got)
	}
}

func TestLegend(t *testing.T) {
	m := map[string]string{"__name__": "replayguard_redemptions_total", "outcome": "redeemed", "job": "rg"}
	tests := []struct {
		name, format string
		metric       map[string]string
		want         string
	}{
		{"labels are substituted", "{{outcome}} ({{ job }})", m, "redeemed (rg)"},
		{"a missing label becomes empty", "{{op}}!", m, "!"},
		{"no format lists the labels", "", m, `replayguard_redemptions_total{job="rg", outcome="redeemed"}`},
		{"__auto is no format", "__auto", map[string]string{"op": "put"}, `{op="put"}`},
		{"no labels at all shows the expression", "", map[string]string{}, "sum(x)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := legend(tc.format, tc.metric, "sum(x)"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLayout(t *testing.T) {
	// 1600px less 12px padding each side, 8px between panels: a column
	// is (1576+8)/24 = 66px.
	tests := []struct {
		name string
		g    GridPos
		want Box
	}{
		{"half width at the top left", GridPos{H: 8, W: 12, X: 0, Y: 1}, Box{X: 12, Y: 12 + 44 + 38, W: 784, H: 296}},
		{"the right half", GridPos{H: 8, W: 12, X: 12, Y: 1}, Box{X: 12 + 792, Y: 94, W: 784, H: 296}},
		{"full width row", GridPos{H: 1, W: 24, X: 0, Y: 0}, Box{X: 12, Y: 56, W: 1576, H: 30}},
		{"no size takes Grafana's default", GridPos{}, Box{X: 12, Y: 56, W: 784, H: 296}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := layout(tc.g, 1600); got != tc.want {
				t.Errorf("layout(%+v) = %+v, want %+v", tc.g, got, tc.want)
			}
		})
	}
}

func TestFormatValue(t *testing.T) {
	tests := []struct {
		v    float64
		unit string
		want string
	}{
		{0.00025, "s", "250 µs"},
		{0.0125, "s", "12.5 ms"},
		{2, "s", "2 s"},
		{0, "s", "0"},
		{1500, "reqps", "1.5k req/s"},
		{0.5, "percentunit", "50%"},
		{2048, "bytes", "2 KiB"},
		{12, "short", "12"},
		{3, "widgets", "3 widgets"},
	}
	for _, tc := range tests {
		if got := formatValue(tc.v, tc.unit, 0); got != tc.want {
			t.Errorf("formatValue(%v, %q) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
}

func TestNiceTicks(t *testing.T) {
	got := niceTicks(0, 930, 5)
	want := []float64{0, 200, 400, 600, 800, 1000}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("niceTicks(0, 930, 5) = %v, want %v", got, want)
	}
}

func TestChartBreaksLinesAtGapsAndNaN(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }
	nan := func() float64 { var z float64; return z / z }()
	s := Named{Name: "a", Series: Series{
		Times:  []time.Time{at(0), at(1), at(2), at(6), at(7), at(8), at(9)},
		Values: []float64{1, 2, 3, 4, 5, nan, 6},
	}}
	svg := chartSVG([]Named{s}, Panel{}, 400, 200, at(0), at(10))
	paths := regexp.MustCompile(`<path d="([^"]*)"`).FindAllStringSubmatch(svg, -1)
	if len(paths) != 1 {
		t.Fatalf("want one path, got %d in %s", len(paths), svg)
	}
	// Three stretches: 0-2, 6-7 (after a gap), 9 (after the NaN).
	if n := strings.Count(paths[0][1], "M"); n != 3 {
		t.Errorf("want 3 line starts, got %d: %s", n, paths[0][1])
	}
	if n := strings.Count(paths[0][1], "L"); n != 3 {
		t.Errorf("want 3 line segments, got %d: %s", n, paths[0][1])
	}
	// The first point is at the plot's left edge, x = 60.
	if !strings.HasPrefix(paths[0][1], "M60.0 ") {
		t.Errorf("first point not at the left edge: %s", paths[0][1])
	}
}

// fakeProm answers query_range with one series per distinct outcome for
// redemptions, an error for one query and an empty matrix for the rest;
// it records the queries it was asked.
type fakeProm struct {
	mu      sync.Mutex
	queries []string
	steps   []string
}

func (f *fakeProm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api/v1/query_range" {
		http.NotFound(w, r)
		return
	}
	q := r.URL.Query()
	f.mu.Lock()
	f.queries = append(f.queries, q.Get("query"))
	f.steps = append(f.steps, q.Get("step"))
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case strings.Contains(q.Get("query"), "redemptions"):
		values := func(base float64) [][2]any {
			var v [][2]any
			for i := 0; i < 30; i++ {
				v = append(v, [2]any{1000 + 2*i, fmt.Sprint(base + float64(i))})
			}
			return v
		}
		json.NewEncoder(w).Encode(map[string]any{"status": "success", "data": map[string]any{
			"resultType": "matrix",
			"result": []any{
				map[string]any{"metric": map[string]string{"outcome": "redeemed"}, "values": values(100)},
				map[string]any{"metric": map[string]string{"outcome": "token_used"}, "values": values(5)},
			},
		}})
	case strings.Contains(q.Get("query"), "store_duration"):
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"status":"error","errorType":"bad_data","error":"parse error: boom"}`)
	default:
		fmt.Fprint(w, `{"status":"success","data":{"resultType":"matrix","result":[]}}`)
	}
}

func TestRunAgainstFakePrometheus(t *testing.T) {
	fake := &fakeProm{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "d.html")
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{
		"-dashboard", "testdata/tiny.json", "-prometheus", srv.URL, "-out", out,
		"-start", "1000", "-end", "1060", "-step", "2s", "-rate-interval", "4s",
	}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit status %d, want 1 for the failed query; stderr: %s", code, stderr.String())
	}
	if got := strings.TrimSpace(stdout.String()); !regexp.MustCompile(`^1600 \d+$`).MatchString(got) {
		t.Errorf("stdout %q, want the page size", got)
	}
	wantQueries := []string{
		`sum by (outcome) (rate(replayguard_redemptions_total{job=~".+"}[4s]))`,
		`histogram_quantile(0.99, sum by (le, op) (rate(replayguard_store_duration_seconds_bucket[4s])))`,
		`sum(increase(replayguard_tokens_issued_total[60s]))`,
	}
	if fmt.Sprint(fake.queries) != fmt.Sprint(wantQueries) {
		t.Errorf("queries:\n%q\nwant (the hidden target left out, the collapsed row's panel included):\n%q", fake.queries, wantQueries)
	}
	for _, s := range fake.steps {
		if s != "2" {
			t.Errorf("step %q, want 2", s)
		}
	}
	for _, want := range []string{"Store p99", "parse error: boom", `"Issued": no data`} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q: %s", want, stderr.String())
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{
		"<h1>Tiny</h1>",
		`<div class="row" style="left:12px;top:56px;`, // the first row
		`<h2>Redemptions</h2>`,
		`</i>redeemed</span>`, `</i>token_used</span>`, // legends from {{outcome}}
		"req/s",             // the panel's unit on its ticks
		"parse error: boom", // the failed query in its panel
		"No data",           // the stat panel
		"00:17:00",          // a time tick (1020 s after the epoch)
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if n := strings.Count(page, "<path "); n != 2 {
		t.Errorf("want 2 lines (one per series), got %d", n)
	}
	// Self-contained: no scripts, and no address but SVG's namespace.
	rest := strings.ReplaceAll(page, `xmlns="http://www.w3.org/2000/svg"`, "")
	if strings.Contains(rest, "<script") || strings.Contains(rest, "http") || strings.Contains(rest, "src=") {
		t.Error("the page is not self-contained")
	}
}

func TestFlagsRefuseNonLoopback(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"-prometheus", "http://192.0.2.1:9090"}, &stderr, &stderr); code != 2 {
		t.Errorf("exit status %d, want 2", code)
	}
	if !strings.Contains(stderr.String(), "only loopback") {
		t.Errorf("stderr: %s", stderr.String())
	}
}
