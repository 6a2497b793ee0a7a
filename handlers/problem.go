package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/token"
)

// Errors raised by this package's HTTP layer, beside token's sentinels.
var (
	// ErrBadRequest: the request body or parameters are malformed.
	ErrBadRequest = errors.New("handlers: bad request")
	// ErrTooLarge: the request body is over the size limit.
	ErrTooLarge = errors.New("handlers: payload too large")
	// ErrUnauthorized: a required API key is missing or wrong.
	ErrUnauthorized = errors.New("handlers: unauthorized")
	// ErrSubjectNotAllowed: a subject was asked for without a valid API key.
	ErrSubjectNotAllowed = errors.New("handlers: subject not allowed")
	// ErrRateLimited: the client is over its issue rate.
	ErrRateLimited = errors.New("handlers: rate limited")
	// ErrNotFound: no route matches the path.
	ErrNotFound = errors.New("handlers: not found")
	// ErrMethodNotAllowed: the route exists for other methods.
	ErrMethodNotAllowed = errors.New("handlers: method not allowed")
	// ErrCORSRejected: a CORS preflight from an origin that is not allowed.
	ErrCORSRejected = errors.New("handlers: cors origin not allowed")
	// ErrUpstreamUnavailable: the gateway's app could not be reached or
	// did not answer in time.
	ErrUpstreamUnavailable = errors.New("handlers: upstream unavailable")
	// ErrInternal: a bug; the request was not carried out.
	ErrInternal = errors.New("handlers: internal error")
)

// ProblemTypePrefix starts every problem's type URI; the problem code
// follows it, e.g. "urn:replayguard:problem:token_used".
const ProblemTypePrefix = "urn:replayguard:problem:"

// Problem is an RFC 9457 problem details object with a stable Code.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Code is the stable, machine-readable problem code.
	Code string `json:"code"`
	// RequestID is the request's X-Request-ID, when there is one.
	RequestID string `json:"request_id,omitempty"`
	// ServerTime is the server's clock reading (RFC 3339, UTC) on
	// signature_expired, so a client can see its clock skew.
	ServerTime string `json:"server_time,omitempty"`
}

type problemSpec struct {
	err    error
	status int
	code   string
	title  string
	// detail is said when the error carries no detail of its own, and
	// always for 5xx answers, so store addresses never reach clients.
	detail string
}

// problems is the one place where errors become HTTP statuses and codes.
// The first entry that errors.Is matches wins.
var problems = []problemSpec{
	{token.ErrBadRequest, http.StatusBadRequest, "invalid_request", "Invalid request", "The request is malformed."},
	{ErrBadRequest, http.StatusBadRequest, "invalid_request", "Invalid request", "The request is malformed."},
	{idempotency.ErrKeyMissing, http.StatusBadRequest, "idempotency_key_missing", "Idempotency key missing", "This route requires an Idempotency-Key header, such as Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"."},
	{idempotency.ErrInvalidKey, http.StatusBadRequest, "invalid_idempotency_key", "Invalid idempotency key", "The Idempotency-Key header must be one RFC 8941 sf-string of 1 to 255 characters, such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\"."},
	{ErrUnauthorized, http.StatusUnauthorized, "unauthorized", "Missing or invalid API key", "Send Authorization: Bearer <API key>."},
	{token.ErrInvalid, http.StatusUnauthorized, "token_invalid", "Invalid token", "The token is malformed, forged, or signed with a key this server does not know. Fetch a new token."},
	{token.ErrExpired, http.StatusUnauthorized, "token_expired", "Token expired", "The token has expired. Fetch a new token."},
	{replay.ErrMissing, http.StatusUnauthorized, "signature_missing", "Signature missing", "Sign the request with HTTP Message Signatures (RFC 9421): send Signature-Input and Signature."},
	{replay.ErrInvalid, http.StatusUnauthorized, "signature_invalid", "Invalid signature", "The signature is malformed, made with an unknown key or algorithm, does not match the request, or lacks a required component or parameter."},
	{replay.ErrExpired, http.StatusUnauthorized, "signature_expired", "Signature expired", "The signature's created time is outside the server's window; server_time is the server's clock. Sign again with a correct clock."},
	{replay.ErrReplayed, http.StatusUnauthorized, "replayed_request", "Replayed request", "This key ID and nonce were used before. Sign every request with a fresh nonce."},
	{ErrSubjectNotAllowed, http.StatusForbidden, "subject_not_allowed", "Subject requires an API key", "Present a valid API key to bind a token to a subject."},
	{token.ErrPurposeMismatch, http.StatusForbidden, "purpose_mismatch", "Token issued for another purpose", "The token was issued for another purpose; it stays valid for that one."},
	{token.ErrSubjectMismatch, http.StatusForbidden, "subject_mismatch", "Token bound to another subject", "The token is bound to another subject; it stays valid for that one."},
	{ErrCORSRejected, http.StatusForbidden, "cors_rejected", "Origin not allowed", "This origin, method or header is not allowed to issue tokens."},
	{ErrNotFound, http.StatusNotFound, "not_found", "Not found", "No such route."},
	{ErrMethodNotAllowed, http.StatusMethodNotAllowed, "method_not_allowed", "Method not allowed", "The route exists for other methods."},
	{token.ErrUsed, http.StatusConflict, "token_used", "Token already used", "The token was already redeemed. Fetch a new token for a new request."},
	{idempotency.ErrInProgress, http.StatusConflict, "request_in_progress", "Request in progress", "A request with this idempotency key is still being processed. Retry after Retry-After seconds to get its response."},
	{idempotency.ErrNotStored, http.StatusConflict, "response_not_stored", "Response not stored", "The request with this idempotency key was processed, but its response was too large to store, so it cannot be repeated."},
	{idempotency.ErrNotProcessing, http.StatusConflict, "record_not_processing", "No processing record", "The token has no processing record to complete or release: it was not redeemed with \"record\": true, its record was completed or released already, or its lease ended."},
	{idempotency.ErrFingerprintMismatch, http.StatusUnprocessableEntity, "idempotency_key_reused", "Idempotency key reused", "This idempotency key was used for a different request (another method, route or body). Use a new key for a new request."},
	{ErrTooLarge, http.StatusRequestEntityTooLarge, "payload_too_large", "Payload too large", "The body is over 64 KiB."},
	{ErrRateLimited, http.StatusTooManyRequests, "rate_limited", "Too many requests", "Too many tokens for this client; retry after Retry-After seconds."},
	{ErrUpstreamUnavailable, http.StatusBadGateway, "upstream_unavailable", "Upstream unavailable", "The application behind Replayguard could not be reached or did not answer in time. Retry later."},
	{token.ErrStoreFull, http.StatusServiceUnavailable, "store_full", "Token store full", "The token store holds as many live tokens as it may. Retry later."},
	{token.ErrUnavailable, http.StatusServiceUnavailable, "store_unavailable", "Store unavailable", "The store did not confirm the operation; nothing was done. Retry later."},
	{idempotency.ErrStoreFull, http.StatusServiceUnavailable, "store_full", "Store full", "The store holds as many live records as it may; the request was not processed. Retry later."},
	{idempotency.ErrUnavailable, http.StatusServiceUnavailable, "store_unavailable", "Store unavailable", "The store did not confirm the idempotency record; the request was not processed. Retry later."},
	{replay.ErrUnavailable, http.StatusServiceUnavailable, "store_unavailable", "Store unavailable", "The store did not record the signature's nonce; the request was refused. Retry later."},
}

var internalProblem = problemSpec{ErrInternal, http.StatusInternalServerError, "internal_error", "Internal error", "An unexpected error occurred; nothing was done."}

func specFor(err error) problemSpec {
	for _, p := range problems {
		if errors.Is(err, p.err) {
			return p
		}
	}
	return internalProblem
}

// forwardAuthStatus is the one place where forward-auth answers depart
// from the problems table, because nginx's auth_request passes on only
// 2xx, 401 and 403 (any other status becomes a 500 for the client):
//
//   - 401 stays for unauthorized (the proxy sent no valid API key);
//   - every other 4xx becomes 403, keeping its code: the token is missing,
//     invalid, expired, used, or for another purpose or subject, or the
//     configured purpose or subject is malformed;
//   - 5xx stays as it is: store_unavailable and store_full are 503, which
//     nginx turns into 500, so the request fails closed.
//
// Traefik passes any status on, with the problem body.
func forwardAuthStatus(p Problem) int {
	switch {
	case p.Code == "unauthorized":
		return http.StatusUnauthorized
	case p.Status >= 400 && p.Status < 500:
		return http.StatusForbidden
	default:
		return p.Status
	}
}

// ProblemFor returns the problem an error is answered with. Errors this
// package does not know become 500 internal_error. A 4xx problem's detail
// says what was wrong with the request when the error says so, else the
// code's fixed text; a 5xx problem's detail is always fixed, so store
// addresses and internal errors never reach clients, and so is
// token_invalid's, since naming the failed check would help a forger.
// signature_expired carries ServerTime, the server's clock reading from
// the *replay.ExpiredError (or now, when the error has none), and the
// error's reason as its detail.
func ProblemFor(err error) Problem {
	p := specFor(err)
	pr := Problem{Type: ProblemTypePrefix + p.code, Title: p.title, Status: p.status, Code: p.code, Detail: p.detail}
	if p.status < 500 && p.err != token.ErrInvalid {
		if d := strings.TrimPrefix(err.Error(), p.err.Error()+": "); d != err.Error() {
			pr.Detail = d
		}
	}
	if p.err == replay.ErrExpired {
		now := time.Now()
		var ee *replay.ExpiredError
		if errors.As(err, &ee) {
			if !ee.ServerTime.IsZero() {
				now = ee.ServerTime
			}
			if ee.Reason != "" {
				pr.Detail = strings.TrimPrefix(ee.Reason, replay.ErrExpired.Error()+": ")
			}
		}
		pr.ServerTime = now.UTC().Format(time.RFC3339)
	}
	return pr
}

// retryAfterError carries a Retry-After for 429 and 503 answers.
type retryAfterError struct {
	error
	after time.Duration
}

func (e retryAfterError) Unwrap() error { return e.error }

// WriteProblem answers w with the problem for err as
// application/problem+json. It sets Retry-After when err carries one,
// WWW-Authenticate: Bearer on 401 unauthorized and WWW-Authenticate:
// Signature on the signature 401s.
func WriteProblem(w http.ResponseWriter, r *http.Request, err error) {
	writeProblem(w, err, ProblemFor(err))
}

// writeProblem is WriteProblem with p, the problem for err, given: the
// forward-auth endpoint changes its status first (forwardAuthStatus).
func writeProblem(w http.ResponseWriter, err error, p Problem) {
	p.RequestID = w.Header().Get(RequestIDHeader)
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	var ra retryAfterError
	switch {
	case errors.As(err, &ra):
		secs := int((ra.after + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.Itoa(max(secs, 1)))
	case p.Status == http.StatusServiceUnavailable:
		h.Set("Retry-After", "1")
	}
	switch {
	case p.Code == "unauthorized":
		h.Set("WWW-Authenticate", `Bearer realm="replayguard"`)
	case signatureCodes[p.Code]:
		h.Set("WWW-Authenticate", `Signature realm="replayguard"`)
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// signatureCodes are the 401 problems of replay's refusals.
var signatureCodes = map[string]bool{
	"signature_missing": true, "signature_invalid": true, "signature_expired": true, "replayed_request": true,
}
