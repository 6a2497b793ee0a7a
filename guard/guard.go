package guard

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
)

// Defaults of the options below.
const (
	// DefaultFingerprintWindow is how long fingerprint mode keeps a
	// keyless request's response, from its completion.
	DefaultFingerprintWindow = 2 * time.Second
	// DefaultMaxBody bounds the request body a middleware reads (to
	// fingerprint it, check its digest, or find a token's form field):
	// 1 MiB.
	DefaultMaxBody = 1 << 20
)

// Option configures a middleware of this package. The options in the
// first group apply to every middleware; the others say which they apply
// to, and the rest ignore them.
type Option func(*settings)

// settings are every middleware's settings; each reads its own.
type settings struct {
	log     *slog.Logger
	metrics *metrics.Metrics
	onError http.Handler
	maxBody int64

	// RequireToken
	subject func(*http.Request) string
	records *idempotency.Keeper // nil: no records

	// Idempotent
	methods  map[string]bool
	required bool
	scope    func(*http.Request) string
	ignore   map[string]bool
	releases func(status int) bool
	failOpen bool
	window   time.Duration // fingerprint mode when > 0
	quota    store.Limiter // WithCallerQuota; nil: none
	quotaN   int
	netQuota store.Limiter // WithAddressQuota; nil: none
	netN     int
	bytesLim Charger // WithAddressBytes; nil: none
	bytesN   int

	// RequireSignature
	scheme, authority string
}

// newSettings applies opts over the defaults, which are set here and
// nowhere else.
func newSettings(opts []Option) *settings {
	s := &settings{
		log:      slog.Default(),
		maxBody:  DefaultMaxBody,
		methods:  map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		required: true,
		ignore:   map[string]bool{},
		releases: releaseServerErrors,
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// WithLogger sets the logger for panics, for records the store failed to
// finish and for UnsafeFailOpen's warnings. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(s *settings) {
		if l != nil {
			s.log = l
		}
	}
}

// WithMetrics counts outcomes in m: token redemptions
// (replayguard_redemptions_total: "redeemed", "replayed" or the problem
// code), signature verifications
// (replayguard_signature_verifications_total), webhook deliveries
// (replayguard_webhook_deliveries_total), the outcomes of idempotency
// records (replayguard_idempotency_outcomes_total, whichever middleware
// keeps them) and caller quota refusals (replayguard_rate_limited_total).
// Defaults to nil: nothing is counted.
func WithMetrics(m *metrics.Metrics) Option { return func(s *settings) { s.metrics = m } }

// WithErrorHandler replaces the problem+json answer to a refused request,
// so an application can answer in its own format (an HTML page, say). The
// handler finds the reason with FailureReason(r) and its status and code
// with problem.For. Defaults to writing the problem JSON.
func WithErrorHandler(h http.Handler) Option { return func(s *settings) { s.onError = h } }

// WithMaxBody bounds the request body a middleware reads, and hands on
// intact: Idempotent reads it to fingerprint the request, RequireSignature
// to check its Content-Digest, RequireWebhook to verify the provider's
// signature over it, RequireToken (only for a request without the
// Idempotency-Token header) to find the token's form field. A longer
// body is refused with 413 payload_too_large. Defaults to DefaultMaxBody
// (1 MiB); n <= 0 keeps the default.
func WithMaxBody(n int64) Option {
	return func(s *settings) {
		if n > 0 {
			s.maxBody = n
		}
	}
}

type failureKey struct{}

// FailureReason returns why a middleware refused r, inside a handler set
// with WithErrorHandler. Compare it with errors.Is against the sentinels
// of token, replay, idempotency, store and problem.
func FailureReason(r *http.Request) error {
	err, _ := r.Context().Value(failureKey{}).(error)
	return err
}

// refuse answers a refused request: the problem for err, or the error
// handler with err as its FailureReason.
func (s *settings) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if s.onError == nil {
		problem.Write(w, err)
		return
	}
	s.onError.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), failureKey{}, err)))
}

// route is the route a request matched: the ServeMux pattern (which the
// Gin adapter sets to gin's), else the request path.
func route(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}
