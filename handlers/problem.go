package handlers

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

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
	{ErrUnauthorized, http.StatusUnauthorized, "unauthorized", "Missing or invalid API key", "Send Authorization: Bearer <API key>."},
	{token.ErrInvalid, http.StatusUnauthorized, "token_invalid", "Invalid token", "The token is malformed, forged, or signed with a key this server does not know. Fetch a new token."},
	{token.ErrExpired, http.StatusUnauthorized, "token_expired", "Token expired", "The token has expired. Fetch a new token."},
	{ErrSubjectNotAllowed, http.StatusForbidden, "subject_not_allowed", "Subject requires an API key", "Present a valid API key to bind a token to a subject."},
	{token.ErrPurposeMismatch, http.StatusForbidden, "purpose_mismatch", "Token issued for another purpose", "The token was issued for another purpose; it stays valid for that one."},
	{token.ErrSubjectMismatch, http.StatusForbidden, "subject_mismatch", "Token bound to another subject", "The token is bound to another subject; it stays valid for that one."},
	{ErrCORSRejected, http.StatusForbidden, "cors_rejected", "Origin not allowed", "This origin, method or header is not allowed to issue tokens."},
	{ErrNotFound, http.StatusNotFound, "not_found", "Not found", "No such route."},
	{ErrMethodNotAllowed, http.StatusMethodNotAllowed, "method_not_allowed", "Method not allowed", "The route exists for other methods."},
	{token.ErrUsed, http.StatusConflict, "token_used", "Token already used", "The token was already redeemed. Fetch a new token for a new request."},
	{ErrTooLarge, http.StatusRequestEntityTooLarge, "payload_too_large", "Payload too large", "The body is over 64 KiB."},
	{ErrRateLimited, http.StatusTooManyRequests, "rate_limited", "Too many requests", "Too many tokens for this client; retry after Retry-After seconds."},
	{token.ErrStoreFull, http.StatusServiceUnavailable, "store_full", "Token store full", "The token store holds as many live tokens as it may. Retry later."},
	{token.ErrUnavailable, http.StatusServiceUnavailable, "store_unavailable", "Store unavailable", "The store did not confirm the operation; nothing was done. Retry later."},
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

// ProblemFor returns the problem an error is answered with. Errors this
// package does not know become 500 internal_error. A 4xx problem's detail
// says what was wrong with the request when the error says so, else the
// code's fixed text; a 5xx problem's detail is always fixed, so store
// addresses and internal errors never reach clients, and so is
// token_invalid's, since naming the failed check would help a forger.
func ProblemFor(err error) Problem {
	p := specFor(err)
	pr := Problem{Type: ProblemTypePrefix + p.code, Title: p.title, Status: p.status, Code: p.code, Detail: p.detail}
	if p.status < 500 && p.err != token.ErrInvalid {
		if d := strings.TrimPrefix(err.Error(), p.err.Error()+": "); d != err.Error() {
			pr.Detail = d
		}
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
// application/problem+json. It sets Retry-After when err carries one and
// WWW-Authenticate on 401 unauthorized.
func WriteProblem(w http.ResponseWriter, r *http.Request, err error) {
	p := ProblemFor(err)
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
	if p.Code == "unauthorized" {
		h.Set("WWW-Authenticate", `Bearer realm="replayguard"`)
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}
