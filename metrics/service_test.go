package metrics_test

import (
	"context"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/replayguard/replayguard/metrics"
)

// TestRequestLabels checks the labels a request gets: methods outside
// the standard set collapse to other, lowercase ones count as their
// method, and statuses count by class.
func TestRequestLabels(t *testing.T) {
	tests := []struct {
		name           string
		method         string
		status         int
		wantMethod     string
		wantClass      string
		wantDurationNo int
	}{
		{"a standard method keeps its name", "POST", 201, "POST", "2xx", 1},
		{"a lowercase method counts as its own", "post", 409, "POST", "4xx", 2},
		{"a made-up method is other", "BREW", 418, "other", "4xx", 1},
		{"a WebDAV method is other", "PROPFIND", 500, "other", "5xx", 2},
		{"a status outside 100..599 is other", "GET", 0, "GET", "other", 1},
	}
	m := metrics.New()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m.Request("/orders", tc.method, tc.status, time.Millisecond)
			want := `replayguard_http_requests_total{method="` + tc.wantMethod + `",route="/orders",status_class="` + tc.wantClass + `"} 1`
			if got := scrape(t, m); !strings.Contains(got, want) {
				t.Errorf("no %s in\n%s", want, grep(got, "replayguard_http_requests_total"))
			}
			count := `replayguard_http_request_duration_seconds_count{method="` + tc.wantMethod + `",route="/orders"} `
			if got := scrape(t, m); !strings.Contains(got, count+strconv.Itoa(tc.wantDurationNo)) {
				t.Errorf("want %s%d in\n%s", count, tc.wantDurationNo, grep(got, "_count"))
			}
		})
	}
}

// TestRouteSlot checks that SetRoute reaches the counting middleware's
// slot, and does nothing without one.
func TestRouteSlot(t *testing.T) {
	metrics.SetRoute(context.Background(), "ignored") // no slot: no panic
	ctx, slot := metrics.WithRouteSlot(context.Background())
	metrics.SetRoute(ctx, "POST /orders")
	if *slot != "POST /orders" {
		t.Fatalf("slot = %q, want the route set", *slot)
	}
}

// TestServiceCounters checks the counters of outcomes, refusals and
// deliveries, and that the outcome and rate-limit series exist (at 0)
// before their first event, so that dashboards show 0 rather than no
// data.
func TestServiceCounters(t *testing.T) {
	m := metrics.New()
	if n := testutil.CollectAndCount(m.Registry, "replayguard_idempotency_outcomes_total"); n != 4*7 {
		t.Errorf("idempotency outcome series at start = %d, want 28 (4 policies, 7 outcomes)", n)
	}
	if n := testutil.CollectAndCount(m.Registry, "replayguard_rate_limited_total"); n != 3 {
		t.Errorf("rate-limited series at start = %d, want 3 (issue, caller_quota, address_quota)", n)
	}
	m.IdempotencyOutcome(metrics.PolicyWebhook, metrics.OutcomeReplayed)
	m.RateLimited(metrics.RateLimitIssue)
	m.WebhookDelivery("stripe", "signature_expired")
	got := scrape(t, m)
	for _, want := range []string{
		`replayguard_idempotency_outcomes_total{outcome="replayed",policy="webhook"} 1`,
		`replayguard_idempotency_outcomes_total{outcome="executed",policy="webhook"} 0`,
		`replayguard_rate_limited_total{endpoint="issue"} 1`,
		`replayguard_rate_limited_total{endpoint="caller_quota"} 0`,
		`replayguard_webhook_deliveries_total{outcome="signature_expired",scheme="stripe"} 1`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no %s in the scrape", want)
		}
	}
	var nilMetrics *metrics.Metrics // records nothing, and does not panic
	nilMetrics.Request("/", "GET", 200, 0)
	nilMetrics.IdempotencyOutcome(metrics.PolicyToken, metrics.OutcomeExecuted)
	nilMetrics.RateLimited(metrics.RateLimitIssue)
	nilMetrics.WebhookDelivery("github", "verified")
}

// TestBuildInfo checks replayguard_build_info: 1, with the Go version and
// a version and revision that are never empty.
func TestBuildInfo(t *testing.T) {
	m := metrics.New()
	if n := testutil.CollectAndCount(m.Registry, "replayguard_build_info"); n != 1 {
		t.Fatalf("build info series = %d, want 1", n)
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "replayguard_build_info" {
			continue
		}
		s := f.GetMetric()[0]
		if v := s.GetGauge().GetValue(); v != 1 {
			t.Errorf("value = %v, want 1", v)
		}
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["goversion"] != runtime.Version() {
			t.Errorf("goversion = %q, want %q", labels["goversion"], runtime.Version())
		}
		for _, name := range []string{"version", "revision"} {
			if labels[name] == "" {
				t.Errorf("%s is empty", name)
			}
		}
		if labels["version"] == "(devel)" {
			t.Error(`version is "(devel)", want devel`)
		}
		return
	}
	t.Fatal("no replayguard_build_info")
}

// grep returns the lines of text that contain s.
func grep(text, s string) string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// scrape returns what GET /metrics serves for m.
func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	w := httptest.NewRecorder()
	promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 {
		t.Fatalf("GET /metrics: %d: %s", w.Code, w.Body)
	}
	return w.Body.String()
}
