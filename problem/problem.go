package problem

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/jsonw"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/webhook"
)

// Errors of the HTTP layer, beside the sentinels of the packages the
// table covers. Wrap them with %w to add a detail the client sees (for a
// 4xx answer).
var (
	// ErrBadRequest: the request body or parameters are malformed.
	ErrBadRequest = errors.New("bad request")
	// ErrTooLarge: the request body is over the size limit.
	ErrTooLarge = errors.New("payload too large")
	// ErrHeadersTooLarge: the request's head (its request line and
	// header fields) is over the server's limit (16 KiB in cmd/server).
	ErrHeadersTooLarge = errors.New("request header fields too large")
	// ErrTransferEncoding: the request body has a transfer coding other
	// than chunked, which net/http does not read.
	ErrTransferEncoding = errors.New("unsupported transfer encoding")
	// ErrHTTPVersion: the request is of an HTTP version net/http's
	// HTTP/1 server does not speak (HTTP/2.0 in a request line, say, or
	// the HTTP/2 preface's PRI * HTTP/2.0).
	ErrHTTPVersion = errors.New("http version not supported")
	// ErrUnauthorized: a required API key is missing or wrong.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrSubjectNotAllowed: a subject was asked for without a valid API key.
	ErrSubjectNotAllowed = errors.New("subject not allowed")
	// ErrRateLimited: the client is over its rate.
	ErrRateLimited = errors.New("rate limited")
	// ErrNotFound: no route matches the path.
	ErrNotFound = errors.New("not found")
	// ErrRecordNotFound: no live idempotency record has the ID or key an
	// operator looked up.
	ErrRecordNotFound = errors.New("record not found")
	// ErrMethodNotAllowed: the route exists for other methods.
	ErrMethodNotAllowed = errors.New("method not allowed")
	// ErrCORSRejected: a CORS preflight from an origin that is not allowed.
	ErrCORSRejected = errors.New("cors origin not allowed")
	// ErrUpstreamUnavailable: the gateway's app could not be reached or
	// did not answer in time.
	ErrUpstreamUnavailable = errors.New("upstream unavailable")
	// ErrInternal: a bug; the request was not carried out.
	ErrInternal = errors.New("internal error")
)

// TypePrefix starts every problem's type URI; the problem code follows
// it, e.g. "urn:replayguard:problem:token_used".
const TypePrefix = "urn:replayguard:problem:"

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
	// RetryAfter is sent as the Retry-After header, in whole seconds
	// rounded up; zero sends none.
	RetryAfter time.Duration `json:"-"`
}

// spec is one row of the table.
//
// A detail reads like a Go error string, as the details that errors
// carry do (fmt.Errorf("%w: qty must be at least 1", ErrBadRequest)), so
// that a client sees one style whichever of the two it gets: it starts
// with a lower-case letter, joins its clauses with semicolons, and has
// no final period.
type spec struct {
	err    error
	status int
	code   string
	title  string
	// detail is said when the error carries no detail of its own, and
	// always for 5xx answers, so store addresses never reach clients.
	detail string
	// retryAfter is the Retry-After of the row, unless the error carries
	// its own (RetryAfter).
	retryAfter time.Duration
}

// table is the one place where errors become HTTP statuses and codes.
// The first entry that errors.Is matches wins.
var table = []spec{
	{err: token.ErrBadRequest, status: 400, code: "invalid_request", title: "Invalid request", detail: "the request is malformed"},
	{err: ErrBadRequest, status: 400, code: "invalid_request", title: "Invalid request", detail: "the request is malformed"},
	{err: idempotency.ErrBadLease, status: 400, code: "invalid_request", title: "Invalid request", detail: "the request is malformed"},
	{err: idempotency.ErrBadRecordID, status: 400, code: "invalid_request", title: "Invalid request", detail: "the record ID is malformed: it is one a request's log line shows, such as idem: and 64 hex digits"},
	{err: webhook.ErrNoID, status: 400, code: "invalid_request", title: "Invalid request", detail: "the webhook delivery verified but carries no usable ID to run it once under"},
	{err: idempotency.ErrKeyMissing, status: 400, code: "idempotency_key_missing", title: "Idempotency key missing", detail: "this route requires an Idempotency-Key header, such as Idempotency-Key: \"8e03978e-40d5-43e8-bc93-6894a57f9324\""},
	{err: idempotency.ErrInvalidKey, status: 400, code: "invalid_idempotency_key", title: "Invalid idempotency key", detail: "the Idempotency-Key header must be one RFC 8941 sf-string of 1 to 255 characters, such as \"8e03978e-40d5-43e8-bc93-6894a57f9324\""},
	{err: ErrUnauthorized, status: 401, code: "unauthorized", title: "Missing or invalid API key", detail: "send Authorization: Bearer <API key>"},
	{err: token.ErrInvalid, status: 401, code: "token_invalid", title: "Invalid token", detail: "the token is malformed, forged, or signed with a key this server does not know; fetch a new token"},
	{err: token.ErrExpired, status: 401, code: "token_expired", title: "Token expired", detail: "the token has expired; fetch a new token"},
	{err: replay.ErrMissing, status: 401, code: "signature_missing", title: "Signature missing", detail: "sign the request with HTTP Message Signatures (RFC 9421): send Signature-Input and Signature"},
	{err: replay.ErrInvalid, status: 401, code: "signature_invalid", title: "Invalid signature", detail: "the signature is malformed, made with an unknown key or algorithm, does not match the request, or lacks a required component or parameter"},
	{err: replay.ErrExpired, status: 401, code: "signature_expired", title: "Signature expired", detail: "the signature's created time is outside the server's window (server_time is the server's clock); sign again with a correct clock"},
	{err: replay.ErrReplayed, status: 401, code: "replayed_request", title: "Replayed request", detail: "this key ID and nonce were used before; sign every request with a fresh nonce"},
	{err: ErrSubjectNotAllowed, status: 403, code: "subject_not_allowed", title: "Subject requires an API key", detail: "present a valid API key to bind a token to a subject"},
	{err: token.ErrPurposeMismatch, status: 403, code: "purpose_mismatch", title: "Token issued for another purpose", detail: "the token was issued for another purpose; it stays valid for that one"},
	{err: token.ErrSubjectMismatch, status: 403, code: "subject_mismatch", title: "Token bound to another subject", detail: "the token is bound to another subject; it stays valid for that one"},
	{err: ErrCORSRejected, status: 403, code: "cors_rejected", title: "Origin not allowed", detail: "this origin, method or header is not allowed to issue tokens"},
	{err: ErrNotFound, status: 404, code: "not_found", title: "Not found", detail: "no such route"},
	{err: ErrRecordNotFound, status: 404, code: "record_not_found", title: "Record not found", detail: "no live record has this ID or key: it was never opened, or it was released or expired"},
	{err: ErrMethodNotAllowed, status: 405, code: "method_not_allowed", title: "Method not allowed", detail: "the route exists for other methods"},
	{err: token.ErrUsed, status: 409, code: "token_used", title: "Token already used", detail: "the token was already redeemed; fetch a new token for a new request"},
	{err: idempotency.ErrInProgress, status: 409, code: "request_in_progress", title: "Request in progress", detail: "a request with this idempotency key is still being processed; retry after Retry-After seconds to get its response", retryAfter: time.Second},
	{err: idempotency.ErrNotStored, status: 409, code: "response_not_stored", title: "Response not stored", detail: "the request with this idempotency key was processed, but its response was too large to store, so it cannot be repeated"},
	{err: idempotency.ErrNotProcessing, status: 409, code: "record_not_processing", title: "No processing record", detail: "the token has no processing record to renew, complete or release: it was not redeemed with \"record\": true, its record was completed or released already, or its lease ended"},
	{err: idempotency.ErrFingerprintMismatch, status: 422, code: "idempotency_key_reused", title: "Idempotency key reused", detail: "this idempotency key was used for a different request (another method, route or body); use a new key for a new request"},
	{err: ErrTooLarge, status: 413, code: "payload_too_large", title: "Payload too large", detail: "the body is over 64 KiB"},
	{err: ErrRateLimited, status: 429, code: "rate_limited", title: "Too many requests", detail: "too many tokens for this client; retry after Retry-After seconds"},
	{err: ErrHeadersTooLarge, status: 431, code: "headers_too_large", title: "Request header fields too large", detail: "the request line and header fields are over 16 KiB (16,384 bytes) together; send fewer or smaller headers (a large Cookie, say)"},
	{err: ErrTransferEncoding, status: 501, code: "unsupported_transfer_encoding", title: "Transfer encoding not supported", detail: "the request body's Transfer-Encoding is not chunked; send the body with Content-Length or Transfer-Encoding: chunked"},
	{err: ErrUpstreamUnavailable, status: 502, code: "upstream_unavailable", title: "Upstream unavailable", detail: "the application behind Replayguard could not be reached or did not answer in time; retry later"},
	{err: store.ErrFull, status: 503, code: "store_full", title: "Store full", detail: "the store holds as many live entries as it may; nothing was done; retry later", retryAfter: time.Second},
	{err: store.ErrUnavailable, status: 503, code: "store_unavailable", title: "Store unavailable", detail: "the store did not confirm the operation; nothing was done; retry later", retryAfter: time.Second},
	{err: ErrHTTPVersion, status: 505, code: "http_version_not_supported", title: "HTTP version not supported", detail: "send the request as HTTP/1.1 (or HTTP/1.0)"},
}

var internal = spec{err: ErrInternal, status: 500, code: "internal_error", title: "Internal error", detail: "an unexpected error occurred; nothing was done"}

func specFor(err error) spec {
	for _, p := range table {
		if errors.Is(err, p.err) {
			return p
		}
	}
	return internal
}

// Code returns the problem code err is answered with, for metrics and
// logs: "token_used", say, or "internal_error" for an error the table
// does not know.
func Code(err error) string { return specFor(err).code }

// For returns the problem err is answered with. Errors the table does not
// know become 500 internal_error. A 4xx problem's detail says what was
// wrong with the request when the error says so (the text after the
// sentinel's, as fmt.Errorf("%w: detail", sentinel) writes it), else the
// code's fixed text; a 5xx problem's detail is always fixed, so store
// addresses and internal errors never reach clients, and so is
// token_invalid's, since naming the failed check would help a forger.
// signature_expired carries ServerTime, the server's clock reading from
// the *replay.ExpiredError (or now, when the error has none), and the
// error's reason as its detail.
func For(err error) Problem {
	p := specFor(err)
	pr := Problem{Type: TypePrefix + p.code, Title: p.title, Status: p.status, Code: p.code, Detail: p.detail, RetryAfter: p.retryAfter}
	if p.status < 500 && p.err != token.ErrInvalid {
		if d := strings.TrimPrefix(err.Error(), p.err.Error()+": "); d != err.Error() {
			pr.Detail = d
		}
	}
	var ra retryAfter
	if errors.As(err, &ra) {
		pr.RetryAfter = ra.after
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

// retryAfter carries a Retry-After for an error's answer.
type retryAfter struct {
	error
	after time.Duration
}

func (e retryAfter) Unwrap() error { return e.error }

// RetryAfter returns err, answered with Retry-After: d (in whole seconds,
// rounded up, at least 1).
func RetryAfter(err error, d time.Duration) error { return retryAfter{err, d} }

// Write answers w with the problem for err as application/problem+json,
// with the request ID w carries (see RequestIDHeader).
func Write(w http.ResponseWriter, err error) { For(err).Write(w) }

// Write answers w with p as application/problem+json. It sets
// Cache-Control: no-store, Retry-After when p has one, WWW-Authenticate:
// Bearer on 401 unauthorized and WWW-Authenticate: Signature on the
// signature 401s, and p.RequestID from w's X-Request-ID header when
// empty.
func (p Problem) Write(w http.ResponseWriter) {
	h := w.Header()
	if v := h[requestIDHeaderKey]; p.RequestID == "" && len(v) > 0 {
		p.RequestID = v[0]
	}
	// Canonical names and shared values (net/http only reads them): no
	// canonicalising or allocating per answer.
	h["Content-Type"] = problemContentType
	h["Cache-Control"] = noStore
	if p.RetryAfter > 0 {
		secs := int((p.RetryAfter + time.Second - 1) / time.Second)
		h["Retry-After"] = []string{strconv.Itoa(max(secs, 1))}
	}
	switch {
	case p.Code == "unauthorized":
		h["Www-Authenticate"] = bearerChallenge
	case signatureCodes[p.Code]:
		h["Www-Authenticate"] = signatureChallenge
	}
	w.WriteHeader(p.Status)
	bp := bodies.Get().(*[]byte)
	b := p.appendJSON((*bp)[:0])
	_, _ = w.Write(b)
	if cap(b) <= 4<<10 {
		*bp = b
		bodies.Put(bp)
	}
}

// Header values every problem answer of a kind shares.
var (
	problemContentType = []string{"application/problem+json"}
	noStore            = []string{"no-store"}
	bearerChallenge    = []string{`Bearer realm="replayguard"`}
	signatureChallenge = []string{`Signature realm="replayguard"`}
)

var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// appendJSON appends p as json.Marshal writes it, members in the same
// order, without escaping '<', '>' and '&' (see internal/jsonw), and a
// newline, as json.Encoder ends it. Every problem goes through here, so
// it is written without reflection.
func (p Problem) appendJSON(b []byte) []byte {
	b = append(b, `{"type":`...)
	b = jsonw.Quoted(b, p.Type)
	b = append(b, `,"title":`...)
	b = jsonw.Quoted(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	b = append(b, `,"detail":`...)
	b = jsonw.Quoted(b, p.Detail)
	b = append(b, `,"code":`...)
	b = jsonw.Quoted(b, p.Code)
	if p.RequestID != "" {
		b = append(b, `,"request_id":`...)
		b = jsonw.Quoted(b, p.RequestID)
	}
	if p.ServerTime != "" {
		b = append(b, `,"server_time":`...)
		b = jsonw.Quoted(b, p.ServerTime)
	}
	return append(b, "}\n"...)
}

// signatureCodes are the 401 problems of replay's refusals.
var signatureCodes = map[string]bool{
	"signature_missing": true, "signature_invalid": true, "signature_expired": true, "replayed_request": true,
}

// RequestIDHeader carries the request ID, echoed on every response and
// in every problem.
const RequestIDHeader = "X-Request-ID"

// requestIDHeaderKey is RequestIDHeader in canonical form, for lookups that do
// not canonicalise (and allocate) on every call.
var requestIDHeaderKey = http.CanonicalHeaderKey(RequestIDHeader)

type requestIDKey struct{}

// requestInfo is what WithRequestID puts in a request's context: its ID,
// and the key of the record it opened or found (SetRecordKey). One value
// for both, so that a request that meets no record costs no more than
// its ID.
type requestInfo struct {
	id        string
	recordKey string
}

// WithRequestID returns ctx carrying the request ID id, and room for the
// key of the record the request meets (SetRecordKey).
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, &requestInfo{id: id})
}

// RequestID returns the ID of the request ctx belongs to, or "".
func RequestID(ctx context.Context) string {
	if ri, ok := ctx.Value(requestIDKey{}).(*requestInfo); ok {
		return ri.id
	}
	return ""
}

// SetRecordKey notes key, the store key of the idempotency record the
// request ctx belongs to opened or found (a keyed, fingerprint, webhook
// or token record), for its log line (RecordID). It does nothing when no
// middleware gave the request an ID (WithRequestID). Call it from the
// request's own goroutine, before the handler that logs the request
// returns.
func SetRecordKey(ctx context.Context, key string) {
	if ri, ok := ctx.Value(requestIDKey{}).(*requestInfo); ok {
		ri.recordKey = key
	}
}

// RecordID returns the printable ID (idempotency.RecordID) of the record
// the request ctx belongs to met (SetRecordKey), or "" when it met none.
func RecordID(ctx context.Context) string {
	if ri, ok := ctx.Value(requestIDKey{}).(*requestInfo); ok && ri.recordKey != "" {
		return idempotency.RecordID(ri.recordKey)
	}
	return ""
}

// ForwardAuth returns p with the status a forward-auth endpoint answers
// it with: the one place where such answers depart from the table,
// because nginx's auth_request passes on only 2xx, 401 and 403 (any
// other status becomes a 500 for the client):
//
//   - 401 stays for unauthorized (the proxy sent no valid API key);
//   - every other 4xx becomes 403, keeping its code: the token is
//     missing, invalid, expired, used, or for another purpose or subject,
//     or the configured purpose or subject is malformed;
//   - 5xx stays as it is: store_unavailable and store_full are 503, which
//     nginx turns into 500, so the request fails closed.
//
// Traefik passes any status on, with the problem body.
func (p Problem) ForwardAuth() Problem {
	switch {
	case p.Code == "unauthorized":
		p.Status = http.StatusUnauthorized
	case p.Status >= 400 && p.Status < 500:
		p.Status = http.StatusForbidden
	}
	return p
}
