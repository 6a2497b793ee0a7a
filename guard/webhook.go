package guard

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/webhook"
)

type webhookKey struct{}

// WebhookFrom returns the delivery RequireWebhook verified for the
// request ctx belongs to: its scheme, its ID and its signed time.
func WebhookFrom(ctx context.Context) (webhook.Delivery, bool) {
	d, ok := ctx.Value(webhookKey{}).(webhook.Delivery)
	return d, ok
}

// webhookFingerprint is the fingerprint of every delivery's record: a
// delivery runs once per route and ID, whatever its body (a provider
// that reuses an ID for another payload gets the first one's response).
const webhookFingerprint = "webhook"

// RequireWebhook is middleware for a webhook endpoint: it lets a delivery
// through only when v verifies it, and runs next at most once per route
// and delivery ID, keeping its records with k (k's lease and body cap
// apply); the webhook.Delivery is then in the request context
// (WebhookFrom).
//
//   - A delivery without a header its scheme signs or keys on is refused
//     (401 signature_missing) before its body is read; otherwise the body
//     is read (at most WithMaxBody; a longer one is 413
//     payload_too_large) and verified as the provider signed it, then
//     handed on intact. A signature no secret verifies over the body is
//     401 signature_invalid, a timestamp outside the window 401
//     signature_expired with server_time, a verified Stripe body without
//     a string id 400 invalid_request. The store is never touched for
//     these: a forged delivery costs one HMAC and no record.
//   - The first delivery of an ID runs next; its response is buffered and
//     recorded before it is sent, as with Idempotent. A redelivery after
//     a stored (2xx or 4xx) response gets it again with
//     Idempotent-Replayed: true, so the provider stops retrying; a
//     response whose body was over k's cap is answered with its status
//     and headers alone, which is all a provider reads.
//   - A 5xx (see WithReleaseStatus) or a panic releases the record, so
//     the provider's next redelivery runs; a handler that cannot tell
//     whether its work was done calls AbandonRecord, and the record is
//     left to its lease.
//   - A redelivery while the first runs gets 409 request_in_progress with
//     Retry-After; when the store cannot be reached, next does not run
//     (503 store_unavailable), and the provider retries later.
//
// Records are kept for k's retention, but at least twice v's window and
// a second: as long as the window could accept the same delivery again,
// so that a replay of it inside the window never runs a second time.
// The route is the ServeMux pattern (r.Pattern), else the request path.
func RequireWebhook(v *webhook.Verifier, k *idempotency.Keeper, opts ...Option) func(http.Handler) http.Handler {
	s := newSettings(opts)
	if least := 2*v.Window() + time.Second; v.Window() > 0 && k.Retention() < least {
		k = k.With(idempotency.WithRetention(least))
	}
	rec := keeperRecords{k}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.webhook(w, r, v, rec, next)
		})
	}
}

// webhook is RequireWebhook's core: verify, then record, then run next
// at most once.
func (s *settings) webhook(w http.ResponseWriter, r *http.Request, v *webhook.Verifier, rec Records, next http.Handler) {
	scheme := string(v.Scheme())
	if err := v.Check(r.Header); err != nil {
		s.refuseDelivery(w, r, scheme, err) // before reading a body for nothing
		return
	}
	body, err := request.ReadBody(r, s.maxBody)
	if err != nil {
		s.refuseDelivery(w, r, scheme, err)
		return
	}
	d, err := v.Verify(r.Header, body)
	if err != nil {
		s.refuseDelivery(w, r, scheme, err)
		return
	}
	s.metrics.WebhookDelivery(scheme, "verified")
	r = r.WithContext(context.WithValue(r.Context(), webhookKey{}, d))
	run, stored, err := s.start(rec, metrics.PolicyWebhook, r, recordKey("webhook", string(d.Scheme), "", route(r), d.ID), webhookFingerprint)
	switch {
	case err == nil && run == nil:
		writeStored(w, stored)
	case errors.Is(err, idempotency.ErrNotStored):
		// It ran, and a provider reads only the status: say it, rather
		// than 409, which it would retry for days.
		delete(stored.Header, "Content-Length")
		writeStored(w, stored)
	case err != nil:
		s.refuse(w, r, err)
	default:
		s.record(w, run, metrics.PolicyWebhook, rec.MaxBody(), next)
	}
}

// refuseDelivery refuses a webhook delivery of scheme and counts it by
// its problem code.
func (s *settings) refuseDelivery(w http.ResponseWriter, r *http.Request, scheme string, err error) {
	s.metrics.WebhookDelivery(scheme, problem.Code(err))
	s.refuse(w, r, err)
}
