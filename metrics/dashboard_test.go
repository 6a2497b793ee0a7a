package metrics_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// registered returns the families the server registers, by name, with
// their label names: metrics.New with the memory store instrumented, as
// cmd/server does, and one event of every labelled series, since a
// vector shows in the registry only once it has a child.
func registered(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	m := metrics.New()
	st := m.Instrument(memory.New())
	t.Cleanup(func() { _ = st.Close() })
	_, _ = st.Put(context.Background(), "k", store.Token{Purpose: "p"}, time.Minute)
	m.Issued()
	m.Redemption("redeemed")
	m.TokenRecord("complete", "completed")
	m.SignatureVerification("verified")
	m.Request("/v1/tokens", "POST", 201, time.Millisecond)
	m.WebhookDelivery("standard", "verified")
	m.Completions(func() int { return 0 }, func() int64 { return 0 })
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range families {
		out[f.GetName()] = f
	}
	return out
}

// labelNames returns the label names of f's series.
func labelNames(f *dto.MetricFamily) []string {
	var names []string
	for _, s := range f.GetMetric() {
		for _, l := range s.GetLabel() {
			if !slices.Contains(names, l.GetName()) {
				names = append(names, l.GetName())
			}
		}
	}
	return names
}

// family returns the family a series name in PromQL belongs to: itself,
// or a histogram's for its _bucket, _sum and _count series.
func family(reg map[string]*dto.MetricFamily, name string) (*dto.MetricFamily, bool) {
	if f, ok := reg[name]; ok {
		return f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := reg[base]; ok && f.GetType() == dto.MetricType_HISTOGRAM {
				return f, true
			}
		}
	}
	return nil, false
}

// queries returns every PromQL expression in a Grafana dashboard: the
// "expr" of every target and the "query" of every variable, wherever
// they sit (rows may nest panels).
func queries(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		if v["type"] == "datasource" {
			return // a data source variable: its query is a plugin name
		}
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "query" || k == "definition") {
				*out = append(*out, s)
				continue
			}
			queries(x, out)
		}
	case []any:
		for _, x := range v {
			queries(x, out)
		}
	}
}

var (
	// seriesName finds the metric names of this service and of the
	// collectors it registers.
	seriesName = regexp.MustCompile(`\b(?:replayguard|go|process)_[a-zA-Z0-9_]+`)
	// selector finds a metric name with its label matchers.
	selector = regexp.MustCompile(`\b((?:replayguard|go|process)_[a-zA-Z0-9_]+)\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	grouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// scrapeLabels are the labels Prometheus adds to every scraped series.
var scrapeLabels = []string{"job", "instance"}

// TestDashboardUsesRegisteredMetrics parses the Grafana dashboard and
// checks that every PromQL expression in it names only metrics the
// server registers, and groups and filters only by labels they have, so
// that the dashboard cannot drift from the code.
func TestDashboardUsesRegisteredMetrics(t *testing.T) {
	data, err := os.ReadFile("../docs/grafana/replayguard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("docs/grafana/replayguard.json: %v", err)
	}
	if v, _ := dash["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion = %v, want a current one (39)", dash["schemaVersion"])
	}
	reg := registered(t)
	var exprs []string
	queries(dash, &exprs)
	if len(exprs) < 10 {
		t.Fatalf("%d queries in the dashboard; the parser missed its panels", len(exprs))
	}
	used := map[string]bool{}
	for _, expr := range exprs {
		names := seriesName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%q names no replayguard_* metric", expr)
		}
		// The labels this expression's metrics have.
		labels := slices.Clone(scrapeLabels)
		for _, name := range names {
			f, ok := family(reg, name)
			if !ok {
				t.Errorf("%q: the server registers no metric %s", expr, name)
				continue
			}
			used[f.GetName()] = true
			labels = append(labels, labelNames(f)...)
			if f.GetType() == dto.MetricType_HISTOGRAM && strings.HasSuffix(name, "_bucket") {
				labels = append(labels, "le")
			}
		}
		for _, m := range selector.FindAllStringSubmatch(expr, -1) {
			f, ok := family(reg, m[1])
			if !ok {
				continue
			}
			have := append(labelNames(f), scrapeLabels...)
			if strings.HasSuffix(m[1], "_bucket") {
				have = append(have, "le")
			}
			for _, l := range matcher.FindAllStringSubmatch(m[2], -1) {
				if !slices.Contains(have, l[1]) {
					t.Errorf("%q: %s has no label %s (it has %v)", expr, m[1], l[1], have)
				}
			}
		}
		for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
			for _, l := range strings.Split(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !slices.Contains(labels, l) {
					t.Errorf("%q: groups by %s, which none of its metrics has", expr, l)
				}
			}
		}
	}
	// The issue asks for these on the dashboard.
	for _, want := range []string{
		"replayguard_http_requests_total", "replayguard_http_request_duration_seconds",
		"replayguard_idempotency_outcomes_total", "replayguard_store_duration_seconds",
		"replayguard_store_errors_total", "replayguard_tokens_issued_total", "replayguard_redemptions_total",
		"replayguard_webhook_deliveries_total", "replayguard_signature_verifications_total",
	} {
		if !used[want] {
			t.Errorf("the dashboard has no panel over %s", want)
		}
	}
}
