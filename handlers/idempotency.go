package handlers

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/idempotency"
)

// Headers and defaults of the idempotency middleware.
const (
	// IdempotencyKeyHeader carries the client's key, an RFC 8941
	// sf-string (draft-ietf-httpapi-idempotency-key-header).
	IdempotencyKeyHeader = "Idempotency-Key"
	// IdempotentReplayedHeader is set to "true" on a stored response
	// served again.
	IdempotentReplayedHeader = "Idempotent-Replayed"
	// DefaultFingerprintWindow is how long fingerprint mode keeps a
	// keyless request's response, from its completion.
	DefaultFingerprintWindow = 2 * time.Second
	// DefaultIdempotencyMaxRequestBody bounds the request body read to
	// fingerprint a request: 1 MiB.
	DefaultIdempotencyMaxRequestBody = 1 << 20
)

// inProgressRetryAfter is the Retry-After of 409 request_in_progress.
const inProgressRetryAfter = time.Second

// IdempotencyGuard runs a route's handler once per Idempotency-Key and
// answers every duplicate with the stored response of that one run. One
// core function serves both the Gin and the net/http middleware. Create
// it with NewIdempotencyGuard; use one guard per failure policy, they can
// share a Keeper.
type IdempotencyGuard struct {
	keeper   *idempotency.Keeper
	fpKeeper *idempotency.Keeper // fingerprint mode; nil when off
	methods  map[string]bool
	required bool
	scope    func(*http.Request) string
	ignore   map[string]bool
	releases func(status int) bool
	failOpen bool
	maxBody  int64
	onError  http.Handler
	log      *slog.Logger
}

// IdempotencyOption configures an IdempotencyGuard.
type IdempotencyOption func(*IdempotencyGuard)

// WithIdempotencyMethods sets the methods the guard applies to; requests
// with other methods pass through untouched. Defaults to POST and PATCH,
// as the draft recommends (PUT and DELETE are idempotent already).
func WithIdempotencyMethods(methods ...string) IdempotencyOption {
	return func(g *IdempotencyGuard) {
		g.methods = map[string]bool{}
		for _, m := range methods {
			g.methods[strings.ToUpper(m)] = true
		}
	}
}

// WithKeyRequired says whether a request without an Idempotency-Key is
// refused with 400 idempotency_key_missing (true) or passes through to
// the handler without a record (false). Defaults to true (recommended
// for APIs whose clients you control). Fingerprint mode handles keyless
// requests itself.
func WithKeyRequired(required bool) IdempotencyOption {
	return func(g *IdempotencyGuard) { g.required = required }
}

// WithScope sets whom a stored key belongs to: f returns the caller's
// identity (a user or tenant ID, say), and one caller's key never reaches
// another caller's record. A function returning "" falls back to the
// client IP. See ScopeHeader and ParseScope. Defaults to the client IP:
// gin's Context.ClientIP (call SetTrustedProxies on your router, or any
// client could choose its address with X-Forwarded-For), or the host of
// r.RemoteAddr with net/http.
func WithScope(f func(*http.Request) string) IdempotencyOption {
	return func(g *IdempotencyGuard) { g.scope = f }
}

// ScopeHeader returns a scope function for WithScope that identifies the
// caller by a SHA-256 of the values of the request header name, such as
// Authorization: callers presenting the same credential share their
// keys. Requests without the header fall back to the client IP.
func ScopeHeader(name string) func(*http.Request) string {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) string {
		vs := r.Header.Values(name)
		if len(vs) == 0 {
			return ""
		}
		var b []byte
		for _, v := range vs {
			b = appendField(b, v)
		}
		sum := sha256.Sum256(b)
		return "header:" + name + ":" + hex.EncodeToString(sum[:])
	}
}

// ParseScope returns the scope function a setting names: "client_ip"
// (or "") for the client IP, which is nil, the default; "header:Name"
// for ScopeHeader(Name).
func ParseScope(spec string) (func(*http.Request) string, error) {
	spec = strings.TrimSpace(spec)
	switch name, ok := strings.CutPrefix(spec, "header:"); {
	case spec == "" || spec == "client_ip":
		return nil, nil
	case ok && isToken(name):
		return ScopeHeader(name), nil
	}
	return nil, fmt.Errorf("idempotency scope %q: want client_ip or header:<Header-Name>", spec)
}

// WithIgnoredFields leaves these fields out of the request fingerprint:
// top-level members of a JSON object body, fields of a form body
// (url-encoded or multipart) and query parameters. Use it for values a
// client changes on every retry, such as a client timestamp, so that a
// retry is not refused as idempotency_key_reused. Defaults to none.
func WithIgnoredFields(names ...string) IdempotencyOption {
	return func(g *IdempotencyGuard) {
		for _, n := range names {
			g.ignore[n] = true
		}
	}
}

// WithReleaseStatus sets which responses release the record instead of
// being stored: a released request runs again on retry, a stored one is
// answered from the record. Defaults to every 5xx status (recommended: a
// transient failure is not replayed for a day); 4xx responses are
// stored. A panic always releases.
func WithReleaseStatus(releases func(status int) bool) IdempotencyOption {
	return func(g *IdempotencyGuard) {
		if releases != nil {
			g.releases = releases
		}
	}
}

// UnsafeFailOpen, when open is true, runs the handler without a record
// when the store cannot be reached, so duplicates run again during an
// outage. Defaults to false (recommended): the handler does not run and
// the answer is 503 store_unavailable.
func UnsafeFailOpen(open bool) IdempotencyOption {
	return func(g *IdempotencyGuard) { g.failOpen = open }
}

// WithFingerprintMode turns on fingerprint mode for clients that send no
// Idempotency-Key: the key is derived from the caller, the route and the
// request fingerprint, and the response is kept for window from the
// first request's completion, so an identical request inside the window
// (an accidental double submit) gets the stored response with
// Idempotent-Replayed: true. Requests that carry a key are handled by it
// as usual. Defaults to off; window <= 0 means DefaultFingerprintWindow
// (2s).
func WithFingerprintMode(window time.Duration) IdempotencyOption {
	return func(g *IdempotencyGuard) {
		if window <= 0 {
			window = DefaultFingerprintWindow
		}
		g.fpKeeper = g.keeper.With(idempotency.WithRetention(window))
	}
}

// WithMaxRequestBody bounds the request body the guard reads to
// fingerprint a request (and hands on intact); a longer one is refused
// with 413 payload_too_large. Defaults to
// DefaultIdempotencyMaxRequestBody (1 MiB); n <= 0 keeps the default.
func WithMaxRequestBody(n int64) IdempotencyOption {
	return func(g *IdempotencyGuard) {
		if n > 0 {
			g.maxBody = n
		}
	}
}

// WithIdempotencyErrorHandler replaces the problem+json answer to a
// refused request, so applications can answer in their own format. The
// handler finds the reason with FailureReason(r) and the status with
// ProblemFor. Defaults to writing the problem JSON.
func WithIdempotencyErrorHandler(h http.Handler) IdempotencyOption {
	return func(g *IdempotencyGuard) { g.onError = h }
}

// WithIdempotencyLogger sets the logger for panics and for records the
// store failed to complete or release. Defaults to slog.Default().
func WithIdempotencyLogger(l *slog.Logger) IdempotencyOption {
	return func(g *IdempotencyGuard) {
		if l != nil {
			g.log = l
		}
	}
}

// NewIdempotencyGuard returns an IdempotencyGuard that keeps its records
// with k; k's lease, retention and body cap apply (see package
// idempotency).
func NewIdempotencyGuard(k *idempotency.Keeper, opts ...IdempotencyOption) *IdempotencyGuard {
	g := &IdempotencyGuard{
		keeper:   k,
		methods:  map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		required: true,
		ignore:   map[string]bool{},
		releases: releaseServerErrors,
		maxBody:  DefaultIdempotencyMaxRequestBody,
		log:      slog.Default(),
	}
	for _, o := range opts {
		o(g)
	}
	return g
}

// Idempotent is Gin middleware that runs the rest of the chain once per
// Idempotency-Key (see IdempotentHandler). The route is the one gin
// matched (Context.FullPath), else the request path.
func (g *IdempotencyGuard) Idempotent() gin.HandlerFunc {
	return func(c *gin.Context) {
		route := c.FullPath()
		if route == "" {
			route = c.Request.URL.Path
		}
		next, called := ginNext(c)
		g.serve(c.Writer, c.Request, route, c.ClientIP(), next)
		if !*called {
			c.Abort()
		}
	}
}

// ginNext adapts the rest of c's chain to the core functions' next: it
// runs c.Next with the request next is given, and with a capturing writer
// in place of c.Writer while a record is open. called reports whether next
// ran; when it did not, the caller aborts the chain.
func ginNext(c *gin.Context) (next func(http.ResponseWriter, *http.Request), called *bool) {
	called = new(bool)
	orig := c.Writer
	return func(w http.ResponseWriter, r *http.Request) {
		*called = true
		c.Request = r
		if cw, ok := w.(*captureWriter); ok {
			c.Writer = &ginCapture{captureWriter: cw, gw: orig}
			defer func() { c.Writer = orig }()
		}
		c.Next()
	}, called
}

// IdempotentHandler is net/http middleware that runs next once per
// Idempotency-Key and answers duplicates from the record:
//
//   - requests with other methods than POST and PATCH pass through (see
//     WithIdempotencyMethods);
//   - a missing key is 400 idempotency_key_missing (see WithKeyRequired,
//     WithFingerprintMode), a malformed one 400 invalid_idempotency_key;
//   - the key is scoped to the caller (WithScope), the method and the
//     route (the ServeMux pattern, r.Pattern, else the request path);
//   - the request is fingerprinted: a SHA-256 of the method, route, path,
//     query and body in canonical form (JSON re-encoded with sorted keys,
//     form fields in canonical order, WithIgnoredFields left out); the
//     same key with another fingerprint is 422 idempotency_key_reused;
//   - a duplicate while the first runs gets 409 request_in_progress with
//     Retry-After; after it, the stored status, headers and body,
//     byte for byte, with Idempotent-Replayed: true;
//   - when the store cannot be reached, next does not run: 503
//     store_unavailable (see UnsafeFailOpen).
//
// The response is buffered and the record completed (or released, for a
// 5xx, see WithReleaseStatus) before the first byte is sent, so a client
// that got an answer never gets 409 for its retry. The cost is that the
// client sees nothing until the handler returns. A response whose body
// grows past the Keeper's cap (or that the handler flushes) is streamed:
// the record completes without its body at that moment, the bytes go out
// as they are written, and duplicates get 409 response_not_stored.
// Set-Cookie, Date, hop-by-hop headers and the headers outer middleware
// set (such as X-Request-ID) are not stored; trailers are neither stored
// nor replayed. A panic in next releases the record and is answered with
// 500 internal_error (or aborts the connection when the response was
// already streaming). Hijacking the connection is refused. The
// request's context is not canceled when the lease is lost (the handler
// outlived WithLockTTL without a heartbeat reaching the store): the
// response still goes out, unrecorded.
func (g *IdempotencyGuard) IdempotentHandler() func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			route := r.Pattern
			if route == "" {
				route = r.URL.Path
			}
			host, _, err := net.SplitHostPort(r.RemoteAddr)
			if err != nil {
				host = r.RemoteAddr
			}
			g.serve(w, r, route, host, next.ServeHTTP)
		})
	}
}

// serve is the core of both middlewares: it calls next at most once, with
// a capturing writer when a record was opened.
func (g *IdempotencyGuard) serve(w http.ResponseWriter, r *http.Request, route, clientIP string, next func(http.ResponseWriter, *http.Request)) {
	if !g.methods[r.Method] {
		next(w, r)
		return
	}
	keeper, kind, key := g.keeper, "key", ""
	switch values := r.Header.Values(IdempotencyKeyHeader); {
	case len(values) > 1:
		g.refuse(w, r, fmt.Errorf("%w: send one %s header, not %d", idempotency.ErrInvalidKey, IdempotencyKeyHeader, len(values)))
		return
	case len(values) == 1:
		k, err := idempotency.ParseKey(values[0])
		if err != nil {
			g.refuse(w, r, err)
			return
		}
		key = k
	case g.fpKeeper != nil:
		keeper, kind = g.fpKeeper, "fingerprint"
	case g.required:
		g.refuse(w, r, fmt.Errorf("%w: this route requires an %s header, such as %s: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"", idempotency.ErrKeyMissing, IdempotencyKeyHeader, IdempotencyKeyHeader))
		return
	default:
		next(w, r)
		return
	}
	body, err := bufferBody(r, g.maxBody)
	if err != nil {
		g.refuse(w, r, err)
		return
	}
	fp := fingerprint(r, route, body, g.ignore)
	if kind == "fingerprint" {
		key = fp
	}
	scope := ""
	if g.scope != nil {
		scope = g.scope(r)
	}
	if scope == "" {
		scope = "ip:" + clientIP
	}
	run, stored, err := keeper.Start(r.Context(), recordKey(kind, scope, r.Method, route, key), fp)
	switch {
	case err == nil && run == nil:
		writeStored(w, stored)
		return
	case g.failOpen && (errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, idempotency.ErrStoreFull)):
		g.log.LogAttrs(r.Context(), slog.LevelWarn, "idempotency store unavailable; running the handler without a record (UnsafeFailOpen)",
			slog.String("request_id", RequestID(r.Context())), slog.String("error", err.Error()))
		next(w, r)
		return
	case errors.Is(err, idempotency.ErrInProgress):
		g.refuse(w, r, retryAfterError{err, inProgressRetryAfter})
		return
	case err != nil:
		g.refuse(w, r, err)
		return
	}

	recordPolicy{releases: g.releases, log: g.log}.serve(w, r, run, keeper.MaxBody(), next)
}

// recordPolicy is what the recording machinery, shared by the
// IdempotencyGuard and the Guard's record mode, needs from its
// middleware: which statuses release the record instead of storing the
// response, and where to log.
type recordPolicy struct {
	releases func(status int) bool
	log      *slog.Logger
}

// releaseServerErrors is the default release policy: every 5xx.
func releaseServerErrors(status int) bool { return status >= 500 }

// serve runs next with a capturing writer for run, the execution that
// holds an open record, and finishes the record before the response
// reaches w: released for a releasing status or a panic, else completed
// with the response (see captureWriter). A panic is answered with 500
// internal_error, or aborts a response that was already streaming.
func (p recordPolicy) serve(w http.ResponseWriter, r *http.Request, run *idempotency.Run, maxBody int, next func(http.ResponseWriter, *http.Request)) {
	cw := newCaptureWriter(w, r, p, run, maxBody)
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		cw.finish(false, true)
		if v == http.ErrAbortHandler {
			panic(v)
		}
		p.log.LogAttrs(r.Context(), slog.LevelError, "panic",
			slog.String("request_id", RequestID(r.Context())),
			slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
		if cw.streaming {
			panic(http.ErrAbortHandler) // the status is out: abort the response
		}
		WriteProblem(w, r, ErrInternal)
	}()
	next(cw, r)
	if !cw.streaming {
		cw.finish(false, false)
		cw.send()
	}
}

func (g *IdempotencyGuard) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if g.onError == nil {
		WriteProblem(w, r, err)
		return
	}
	g.onError.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), failureKey{}, err)))
}

// writeStored answers w with a stored response.
func writeStored(w http.ResponseWriter, out idempotency.Outcome) {
	h := w.Header()
	for name, vs := range out.Header {
		h[name] = vs
	}
	h.Set(IdempotentReplayedHeader, "true")
	status := out.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if len(out.Body) > 0 {
		_, _ = w.Write(out.Body)
	}
}

// recordKey is the store key of a request's record: a hash of the kind
// of key, the caller's scope, the method, the route and the key.
func recordKey(kind, scope, method, route, key string) string {
	b := make([]byte, 0, 5*binary.MaxVarintLen64+len(kind)+len(scope)+len(method)+len(route)+len(key))
	for _, f := range []string{kind, scope, method, route, key} {
		b = appendField(b, f)
	}
	sum := sha256.Sum256(b)
	return "idem:" + hex.EncodeToString(sum[:])
}

// appendField appends s to b, length first, so that fields hashed
// together cannot run into each other.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// bufferBody reads r's body, at most limit bytes, and puts it back for
// the handler. A request without a body gives nil.
func bufferBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	tooLarge := fmt.Errorf("%w: the body is over %d bytes, the most this route reads", ErrTooLarge, limit)
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("%w: the body is over %d bytes", ErrTooLarge, mbe.Limit)
		}
		return nil, fmt.Errorf("%w: reading the body: %v", ErrBadRequest, err)
	}
	if int64(len(data)) > limit {
		return nil, tooLarge
	}
	_ = r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(data))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	return data, nil
}

// unreplayed are the response headers never stored: cookies belong to
// the first caller, Date to the first answer, and hop-by-hop headers to
// its connection.
var unreplayed = map[string]bool{
	"Set-Cookie": true, "Date": true, "Connection": true, "Keep-Alive": true,
	"Proxy-Connection": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	IdempotentReplayedHeader: true,
}

// captureWriter buffers a handler's response, up to the cap, so that the
// record is completed before the client sees a byte; past the cap (or on
// Flush) it finishes the record without the body and streams.
type captureWriter struct {
	w   http.ResponseWriter
	r   *http.Request
	p   recordPolicy
	run *idempotency.Run
	max int

	pre       http.Header // the headers outer middleware had set
	header    http.Header
	status    int
	buf       bytes.Buffer
	size      int  // body bytes the handler wrote
	wrote     bool // a Write or WriteHeaderNow happened (for gin)
	streaming bool // the record is finished and writes go straight to w
	finished  bool
	abandoned bool // AbandonRecord: neither complete nor release
}

func newCaptureWriter(w http.ResponseWriter, r *http.Request, p recordPolicy, run *idempotency.Run, maxBody int) *captureWriter {
	pre := w.Header().Clone()
	if pre == nil {
		pre = http.Header{}
	}
	return &captureWriter{w: w, r: r, p: p, run: run, max: maxBody, pre: pre, header: pre.Clone()}
}

// Header returns the response headers. They reach the client when the
// handler returns, or when the response starts streaming.
func (c *captureWriter) Header() http.Header { return c.header }

// WriteHeader records the status; the first call wins, as with net/http.
// Informational (1xx) statuses other than 101 go out at once.
func (c *captureWriter) WriteHeader(code int) {
	if c.informational(code) || c.status != 0 {
		return
	}
	c.status = code
}

// informational sends a 1xx response at once and reports whether code
// was one; it panics on invalid codes as net/http does.
func (c *captureWriter) informational(code int) bool {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 200 || code == http.StatusSwitchingProtocols {
		return false
	}
	if !c.streaming {
		h := c.w.Header()
		clear(h)
		for name, vs := range c.header {
			h[name] = vs
		}
		c.w.WriteHeader(code)
	}
	return true
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.wrote = true
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	c.size += len(p)
	if c.streaming {
		return c.w.Write(p)
	}
	if c.buf.Len()+len(p) <= c.max {
		return c.buf.Write(p)
	}
	if err := c.stream(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// WriteString is Write for strings, for io.StringWriter users.
func (c *captureWriter) WriteString(s string) (int, error) { return c.Write([]byte(s)) }

// Flush starts streaming: the record completes without the body, since
// the client will see the body before it is whole.
func (c *captureWriter) Flush() {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.wrote = true
	if !c.streaming {
		if c.stream() != nil {
			return
		}
	}
	_ = http.NewResponseController(c.w).Flush()
}

// Hijack is refused: a hijacked connection's response cannot be recorded.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("handlers: an idempotent route cannot hijack the connection: %w", http.ErrNotSupported)
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }

// stream finishes the record without the body and sends what was
// buffered.
func (c *captureWriter) stream() error {
	c.finish(true, false)
	c.streaming = true
	return c.send()
}

// send writes the status, headers and buffered body to the client.
func (c *captureWriter) send() error {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	h := c.w.Header()
	clear(h)
	for name, vs := range c.header {
		h[name] = vs
	}
	c.w.WriteHeader(c.status)
	if c.buf.Len() == 0 {
		return nil
	}
	_, err := c.w.Write(c.buf.Bytes())
	c.buf.Reset()
	return err
}

// finish ends the record once: released for a panic or a releasing
// status, else completed with the response (without its body when
// streaming).
func (c *captureWriter) finish(streaming, panicked bool) {
	if c.finished {
		return
	}
	c.finished = true
	if c.status == 0 {
		c.status = http.StatusOK
	}
	var err error
	if c.abandoned {
		c.run.Abandon()
		c.p.log.LogAttrs(c.r.Context(), slog.LevelWarn, "idempotency record abandoned: the outcome is unknown; duplicates get 409 until its lease ends, then one retry runs",
			slog.String("request_id", RequestID(c.r.Context())), slog.Int("status", c.status))
		return
	}
	if panicked || c.p.releases(c.status) {
		err = c.run.Release(c.r.Context())
	} else {
		if _, set := c.header["Content-Type"]; !set && c.buf.Len() > 0 {
			c.header.Set("Content-Type", http.DetectContentType(c.buf.Bytes())) // as net/http would
		}
		out := idempotency.Outcome{Status: c.status, Header: c.replayable(), BodyOmitted: streaming}
		if !streaming {
			out.Body = c.buf.Bytes()
		}
		err = c.run.Complete(c.r.Context(), out)
	}
	if err != nil {
		c.p.log.LogAttrs(c.r.Context(), slog.LevelWarn, "idempotency record not finished; duplicates get 409 until its lease ends",
			slog.String("request_id", RequestID(c.r.Context())), slog.String("error", err.Error()))
	}
}

// AbandonRecord marks the idempotency record of the response being
// written to w, if it has one (IdempotencyGuard, or a Guard with
// WithTokenRecords), to be left as it is when the handler returns:
// neither completed nor released, it stays processing until its lease
// ends (idempotency.Run.Abandon). A handler calls it when it cannot tell
// whether its work was done, such as a proxy whose upstream timed out
// after the request was sent: storing the failure would answer every
// retry with it, and releasing would let a retry run the work again at
// once. The response the handler writes still reaches the client. It
// reports whether w had a record; w may wrap the middleware's writer if
// it has an Unwrap method, as http.ResponseController expects.
func AbandonRecord(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case *captureWriter:
			x.abandoned = true
			return true
		case *ginCapture:
			x.abandoned = true
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

// replayable returns the headers the handler set that are worth replaying.
func (c *captureWriter) replayable() map[string][]string {
	drop := map[string]bool{}
	for _, v := range c.header["Connection"] {
		for _, name := range strings.Split(v, ",") {
			drop[http.CanonicalHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	var out map[string][]string
	for name, vs := range c.header {
		if unreplayed[name] || drop[name] || strings.HasPrefix(name, http.TrailerPrefix) || slices.Equal(vs, c.pre[name]) {
			continue
		}
		if out == nil {
			out = make(map[string][]string, len(c.header))
		}
		out[name] = vs
	}
	return out
}

// bodyAllowed reports whether a response with status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// ginCapture is a captureWriter that is also a gin.ResponseWriter: as
// with gin's own writer, a later WriteHeader wins until the body starts.
type ginCapture struct {
	*captureWriter
	gw gin.ResponseWriter
}

var _ gin.ResponseWriter = (*ginCapture)(nil)

func (c *ginCapture) WriteHeader(code int) {
	if code <= 0 || c.informational(code) || c.wrote {
		return
	}
	c.status = code
}

func (c *ginCapture) WriteHeaderNow() {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.wrote = true
}

func (c *ginCapture) Status() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}

func (c *ginCapture) Size() int {
	if !c.wrote {
		return -1
	}
	return c.size
}

func (c *ginCapture) Written() bool { return c.wrote }

func (c *ginCapture) CloseNotify() <-chan bool { return c.gw.CloseNotify() }

func (c *ginCapture) Pusher() http.Pusher { return nil }
