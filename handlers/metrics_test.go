package handlers_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// metricsEngine returns the API's engine with m, an issue rate of one
// token a minute, and, for every path the API does not serve, a gateway
// with two routes in front of an app that answers 201, as cmd/server
// wires them.
func metricsEngine(t *testing.T, m *metrics.Metrics) *gin.Engine {
	t.Helper()
	mem := memory.New()
	t.Cleanup(func() { _ = mem.Close() })
	inst := m.Instrument(mem)
	svc, err := token.New(inst, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(9))
	if err != nil {
		t.Fatal(err)
	}
	keeper := idempotency.New(inst)
	e, err := handlers.New(svc, handlers.WithMetrics(m), handlers.WithRecords(keeper),
		handlers.WithIssueRate(inst.(store.Limiter), store.Limit{Rate: 1, Burst: 1, Period: time.Minute})).Engine()
	if err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(app.Close)
	up, _ := url.Parse(app.URL)
	gw, err := gateway.New(up, []gateway.Route{
		{Match: "POST /orders", Policy: gateway.PolicyIdempotencyKey, Required: true},
		{Match: "POST /orders/{id}/cancel", Policy: gateway.PolicyFingerprint},
	}, gateway.WithKeeper(keeper), gateway.WithMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	e.NoRoute(func(c *gin.Context) {
		if strings.HasPrefix(c.Request.URL.Path, "/v1/") {
			c.AbortWithStatus(http.StatusNotFound)
			return
		}
		gw.ServeHTTP(c.Writer, c.Request)
	})
	return e
}

func send(h http.Handler, method, target string, header ...string) int {
	r := httptest.NewRequest("GET", target, nil)
	r.Method = method
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// requestSeries returns the label sets of the request series, as
// "route|method|status_class" (the duration histogram's with status_class
// empty).
func requestSeries(t *testing.T, m *metrics.Metrics) (counts map[string]float64, durations []string) {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts = map[string]float64{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range s.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			key := l["route"] + "|" + l["method"] + "|" + l["status_class"]
			switch f.GetName() {
			case "replayguard_http_requests_total":
				counts[key] = s.GetCounter().GetValue()
			case "replayguard_http_request_duration_seconds":
				durations = append(durations, key)
			}
		}
	}
	return counts, durations
}

// TestRequestSeries checks the route, method and status class the API's
// and the gateway's requests are counted under, and that a refused issue
// counts as rate limited.
func TestRequestSeries(t *testing.T) {
	m := metrics.New()
	e := metricsEngine(t, m)
	steps := []struct {
		method, target string
		header         []string
		want           int
	}{
		{"POST", "/v1/tokens", nil, 201},
		{"POST", "/v1/tokens", nil, 429},
		{"GET", "/healthz", nil, 200},
		{"GET", "/v1/nothing-here", nil, 404},
		{"POST", "/orders", []string{"Idempotency-Key", `"a"`}, 201},
		{"POST", "/orders", []string{"Idempotency-Key", `"a"`}, 201},
		{"POST", "/orders", nil, 400},
		{"POST", "/orders/42/cancel", nil, 201},
		{"GET", "/orders/42", nil, 201},
		{"POST", "//orders", nil, 307},
		{"POST", "/orders;x", nil, 400},
	}
	for _, s := range steps {
		if got := send(e, s.method, s.target, s.header...); got != s.want {
			t.Fatalf("%s %s = %d, want %d", s.method, s.target, got, s.want)
		}
	}
	got, _ := requestSeries(t, m)
	want := map[string]float64{
		"/v1/tokens|POST|2xx":               1,
		"/v1/tokens|POST|4xx":               1,
		"/healthz|GET|2xx":                  1,
		"unmatched|GET|4xx":                 1,
		"POST /orders|POST|2xx":             2,
		"POST /orders|POST|4xx":             1,
		"POST /orders/{id}/cancel|POST|2xx": 1,
		"passthrough|GET|2xx":               1,
		"redirect|POST|3xx":                 1,
		"refused|POST|4xx":                  1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("replayguard_http_requests_total{%s} = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series replayguard_http_requests_total{%s}", k)
		}
	}
	text := scrapeText(t, e)
	for _, line := range []string{
		`replayguard_rate_limited_total{endpoint="issue"} 1`,
		`replayguard_idempotency_outcomes_total{outcome="replayed",policy="idempotency_key"} 1`,
	} {
		if !strings.Contains(text, line) {
			t.Errorf("GET /metrics has no %s", line)
		}
	}
}

// TestRequestSeriesCardinality sends requests with thousands of distinct
// paths, keys, query strings and methods, through the API and through
// the gateway, and checks that the request series stay within the
// routes the server has: the first round creates every series the
// second round could, and no label value is a path or a key.
func TestRequestSeriesCardinality(t *testing.T) {
	m := metrics.New()
	e := metricsEngine(t, m)
	routes := map[string]bool{"unmatched": true, "passthrough": true, "redirect": true, "refused": true,
		"POST /orders": true, "POST /orders/{id}/cancel": true}
	for _, r := range e.Routes() {
		routes[r.Path] = true
	}
	methods := []string{"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"}
	round := func(from, to int) {
		for i := from; i < to; i++ {
			m := methods[i%len(methods)]
			if i%5 == 0 {
				m = fmt.Sprintf("X-%d", i) // a made-up method
			}
			key := []string{"Idempotency-Key", fmt.Sprintf(`"key-%d"`, i)}
			send(e, m, fmt.Sprintf("/v1/tokens/%d?q=%d", i, i), key...)
			send(e, m, fmt.Sprintf("/sdk/x%d.js", i))
			send(e, m, fmt.Sprintf("/app/%d/page", i), key...)
			send(e, "POST", fmt.Sprintf("/orders/%d/cancel?v=%d", i, i), key...)
			send(e, "POST", "/orders", key...)
			send(e, "POST", fmt.Sprintf("/orders/%d/./cancel", i))
			send(e, strings.ToLower(m), fmt.Sprintf("/%%2e%d", i))
		}
	}
	round(0, 300)
	counts1, durations1 := requestSeries(t, m)
	all1 := allSeries(t, m)
	round(300, 600)
	counts2, durations2 := requestSeries(t, m)
	if len(counts2) != len(counts1) || len(durations2) != len(durations1) {
		t.Errorf("request series grew with new paths and keys: %d counters and %d histograms, then %d and %d",
			len(counts1), len(durations1), len(counts2), len(durations2))
	}
	if all2 := allSeries(t, m); all2 != all1 {
		t.Errorf("replayguard_* series grew with new paths and keys: %d, then %d", all1, all2)
	}
	standard := []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "other"}
	for k := range counts2 {
		parts := strings.Split(k, "|")
		if !routes[parts[0]] {
			t.Errorf("route label %q is not a route pattern or fixed label", parts[0])
		}
		if !slices.Contains(standard, parts[1]) {
			t.Errorf("method label %q is not a standard method or other", parts[1])
		}
	}
	// The bound an operator can rely on: routes × methods × classes.
	if limit := len(routes) * len(standard) * 5; len(counts2) > limit {
		t.Errorf("%d request series, over the bound %d", len(counts2), limit)
	}
	if len(counts2) > 60 {
		t.Errorf("%d request series for a handful of routes: %v", len(counts2), counts2)
	}
}

// allSeries counts the series of every replayguard_* family.
func allSeries(t *testing.T, m *metrics.Metrics) int {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "replayguard_") {
			n += len(f.GetMetric())
		}
	}
	return n
}

// scrapeText returns what GET /metrics serves.
func scrapeText(t *testing.T, h http.Handler) string {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 {
		t.Fatalf("GET /metrics = %d", w.Code)
	}
	return w.Body.String()
}
