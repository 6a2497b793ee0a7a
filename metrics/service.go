package metrics

import (
	"context"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Every label below takes its values from a fixed set, or from the
// routes the server was configured with, never from a request's path,
// key or header: the number of series is bounded whatever clients send.

// Policies of replayguard_idempotency_outcomes_total: how the record was
// keyed.
const (
	// PolicyIdempotencyKey: the client's Idempotency-Key.
	PolicyIdempotencyKey = "idempotency_key"
	// PolicyFingerprint: a keyless request's fingerprint (fingerprint
	// mode).
	PolicyFingerprint = "fingerprint"
	// PolicyToken: a redeemed token's ID (record mode).
	PolicyToken = "token"
	// PolicyWebhook: a verified webhook delivery's ID.
	PolicyWebhook = "webhook"
)

// Outcomes of replayguard_idempotency_outcomes_total.
const (
	// OutcomeExecuted: the handler ran and its response was recorded.
	OutcomeExecuted = "executed"
	// OutcomeReplayed: a duplicate got the recorded response.
	OutcomeReplayed = "replayed"
	// OutcomeInProgress: a duplicate arrived while the first ran (409).
	OutcomeInProgress = "in_progress"
	// OutcomeFingerprintMismatch: the key was reused for another request
	// (422).
	OutcomeFingerprintMismatch = "fingerprint_mismatch"
	// OutcomeReleased: the handler ran and its record was released for a
	// retry (a 5xx or a panic).
	OutcomeReleased = "released"
	// OutcomeAbandoned: the handler ran and could not tell whether its
	// work was done; the record is left to its lease.
	OutcomeAbandoned = "abandoned"
	// OutcomeNotStored: a duplicate of an execution whose response was
	// too large to record.
	OutcomeNotStored = "not_stored"
)

var (
	policies = []string{PolicyIdempotencyKey, PolicyFingerprint, PolicyToken, PolicyWebhook}
	outcomes = []string{OutcomeExecuted, OutcomeReplayed, OutcomeInProgress, OutcomeFingerprintMismatch,
		OutcomeReleased, OutcomeAbandoned, OutcomeNotStored}
)

// Endpoints of replayguard_rate_limited_total.
const (
	// RateLimitIssue: POST /v1/tokens, per client IP.
	RateLimitIssue = "issue"
	// RateLimitCallerQuota: the idempotency records one caller may open.
	RateLimitCallerQuota = "caller_quota"
	// RateLimitAddressQuota: the idempotency records the callers at one
	// client address may open together, or the bytes they may take.
	RateLimitAddressQuota = "address_quota"
)

// Fixed route labels of the request series, for requests that match no
// route pattern.
const (
	// RouteUnmatched: a request no route of the server matched (404, 405).
	RouteUnmatched = "unmatched"
	// RoutePassthrough: a gateway request no gateway route matched,
	// passed through to the app.
	RoutePassthrough = "passthrough"
	// RouteRedirect: a gateway request redirected to its route's
	// canonical spelling.
	RouteRedirect = "redirect"
	// RouteRefused: a gateway request refused before routing (a malformed
	// target or Host).
	RouteRefused = "refused"
)

// requestBuckets span a store hit served from memory (about 100µs) to a
// gateway request waiting on a slow app (up to its 30s timeout).
var requestBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

func (m *Metrics) newServiceCollectors() {
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "replayguard_http_requests_total",
		Help: "HTTP requests by route (the route pattern, or unmatched, passthrough, redirect, refused), method (other for non-standard ones) and status class (1xx to 5xx).",
	}, []string{"route", "method", "status_class"})
	m.requestDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "replayguard_http_request_duration_seconds",
		Help:    "Duration of HTTP requests, from the first handler to the last, by route and method (labelled as in replayguard_http_requests_total).",
		Buckets: requestBuckets,
	}, []string{"route", "method"})
	m.outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "replayguard_idempotency_outcomes_total",
		Help: "Requests that met an idempotency record, by policy (idempotency_key, fingerprint, token, webhook) and outcome (executed, replayed, in_progress, fingerprint_mismatch, released, abandoned, not_stored).",
	}, []string{"policy", "outcome"})
	m.rateLimited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "replayguard_rate_limited_total",
		Help: "Requests refused with 429 rate_limited, by endpoint (issue: POST /v1/tokens per client IP; caller_quota: idempotency records per caller).",
	}, []string{"endpoint"})
	m.webhooks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "replayguard_webhook_deliveries_total",
		Help: "Webhook deliveries by scheme and outcome (verified, or the problem code of the refusal).",
	}, []string{"scheme", "outcome"})
	// Series that exist from the start, so rate() over them is 0, not
	// absent, until the first event.
	for _, p := range policies {
		for _, o := range outcomes {
			m.outcomes.WithLabelValues(p, o)
		}
	}
	m.rateLimited.WithLabelValues(RateLimitIssue)
	m.rateLimited.WithLabelValues(RateLimitCallerQuota)
	m.rateLimited.WithLabelValues(RateLimitAddressQuota)
}

// buildInfo is replayguard_build_info: 1, labelled with the main module's
// version ("devel" for a build outside a module version), its VCS
// revision ("unknown" without one) and the Go version.
func buildInfo() prometheus.Collector {
	version, revision, goversion := "devel", "unknown", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			version = v
		}
		if bi.GoVersion != "" {
			goversion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				revision = s.Value
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "replayguard_build_info",
		Help:        "1, labelled with the build's version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": goversion},
	})
	g.Set(1)
	return g
}

// standardMethods are the methods the request series name; others are
// "other".
var standardMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace,
}

// methodLabel is method's label: a standard method in upper case (the
// gateway reads "post" as POST), else "other".
func methodLabel(method string) string {
	for _, m := range standardMethods {
		if method == m || strings.EqualFold(method, m) {
			return m
		}
	}
	return "other"
}

// statusClass is status's class label, "1xx" to "5xx", else "other".
func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return statusClasses[status/100-1]
}

var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

// Request counts one HTTP request and its duration d: route is a route
// pattern or one of the Route* labels, never a raw path; method is the
// request's (non-standard methods count as "other") and status the
// answer's.
func (m *Metrics) Request(route, method string, status int, d time.Duration) {
	if m == nil {
		return
	}
	ls := requestLabels{route, methodLabel(method), statusClass(status)}
	m.seriesMu.RLock()
	s, ok := m.series[ls]
	m.seriesMu.RUnlock()
	if !ok {
		s = m.newSeries(ls)
	}
	s.count.Inc()
	s.dur.Observe(d.Seconds())
}

// requestLabels are the labels of one request's series.
type requestLabels struct{ route, method, class string }

// requestSeries are the children of the request series for one set of
// labels: looked up once, since WithLabelValues validates and hashes its
// values on every call.
type requestSeries struct {
	count prometheus.Counter
	dur   prometheus.Observer
}

func (m *Metrics) newSeries(ls requestLabels) requestSeries {
	s := requestSeries{
		count: m.requests.WithLabelValues(ls.route, ls.method, ls.class),
		dur:   m.requestDur.WithLabelValues(ls.route, ls.method),
	}
	m.seriesMu.Lock()
	if m.series == nil {
		m.series = make(map[requestLabels]requestSeries)
	}
	m.series[ls] = s
	m.seriesMu.Unlock()
	return s
}

type routeKey struct{}

// WithRouteSlot returns ctx with room for the route label of its request,
// which SetRoute fills and the returned pointer reads: for the middleware
// that counts requests (handlers' Engine), when a handler behind it (the
// gateway) knows the route better than the router.
func WithRouteSlot(ctx context.Context) (context.Context, *string) {
	slot := new(string)
	return context.WithValue(ctx, routeKey{}, slot), slot
}

// SetRoute names the route of the request ctx belongs to: a route
// pattern or one of the Route* labels, never a raw path. It does nothing
// when no middleware counts the request (see WithRouteSlot).
func SetRoute(ctx context.Context, route string) {
	if slot, ok := ctx.Value(routeKey{}).(*string); ok {
		*slot = route
	}
}

// IdempotencyOutcome counts one request that met an idempotency record:
// policy is one of the Policy* constants, outcome one of the Outcome*
// ones.
func (m *Metrics) IdempotencyOutcome(policy, outcome string) {
	if m != nil {
		m.outcomes.WithLabelValues(policy, outcome).Inc()
	}
}

// RateLimited counts one request refused with 429 rate_limited at
// endpoint, one of the RateLimit* constants.
func (m *Metrics) RateLimited(endpoint string) {
	if m != nil {
		m.rateLimited.WithLabelValues(endpoint).Inc()
	}
}

// WebhookDelivery counts one webhook delivery of scheme (standard,
// stripe, github or slack) with its outcome: "verified" or the problem
// code of its refusal.
func (m *Metrics) WebhookDelivery(scheme, outcome string) {
	if m != nil {
		m.webhooks.WithLabelValues(scheme, outcome).Inc()
	}
}
