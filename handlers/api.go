package handlers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/jsonw"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/tracing"
	"github.com/replayguard/replayguard/web/sdk"
)

// MaxBodyBytes bounds every request body the API reads but that of POST
// /v1/tokens/complete, which may carry a recorded response.
const MaxBodyBytes = 64 << 10

// DefaultIssueRate is the recommended per-client-IP issue rate: 120 a
// minute with bursts of 120.
var DefaultIssueRate = store.Limit{Rate: 120, Burst: 120, Period: time.Minute}

// DefaultReadyTimeout bounds the store ping behind GET /readyz.
const DefaultReadyTimeout = time.Second

// API serves the token endpoints. Create it with New.
type API struct {
	tokens   *token.Service
	limiter  store.Limiter
	rate     store.Limit
	apiKeys  [][sha256.Size]byte
	admin    [][sha256.Size]byte                 // WithAdminKeys
	keyOf    func(*http.Request) (string, error) // WithRecordKeys
	origins  map[string]bool
	metrics  *metrics.Metrics
	log      *slog.Logger
	timeout  time.Duration
	verifier *replay.Verifier
	keeper   *idempotency.Keeper
	proxies  []string
	usage    store.Usager
	tracer   trace.TracerProvider
	prop     propagation.TextMapPropagator // WithPropagator
}

// Option configures an API.
type Option func(*API)

// WithAPIKeys requires Authorization: Bearer <key> on redeem, complete,
// release, renew, forward-auth and verify, with one of keys, and lets those
// callers issue subject-bound tokens. Keys are compared in constant time.
// Defaults to none: those endpoints are open and subjects cannot be
// requested.
func WithAPIKeys(keys ...string) Option {
	return func(a *API) {
		for _, k := range keys {
			if k != "" {
				a.apiKeys = append(a.apiKeys, sha256.Sum256([]byte(k)))
			}
		}
	}
}

// WithIssueRate limits POST /v1/tokens per client IP (IPv6 per /64) to
// l, counted in lim (a store.Limiter such as the memory or Redis store);
// DefaultIssueRate is the recommended limit, a zero l turns it off.
// Callers presenting a valid API key are not limited. Without this option
// there is no limit. The client IP is gin's Context.ClientIP: on your own
// router call SetTrustedProxies with your proxies (or nil), since gin
// trusts X-Forwarded-For from every peer by default and a client could
// then choose its own address.
func WithIssueRate(lim store.Limiter, l store.Limit) Option {
	return func(a *API) { a.limiter, a.rate = lim, l }
}

// WithCORSOrigins allows browser pages on these exact origins (scheme,
// host and port, e.g. "https://shop.example") to issue tokens. Defaults to
// none; there is no wildcard.
func WithCORSOrigins(origins ...string) Option {
	return func(a *API) {
		for _, o := range origins {
			if o = strings.TrimSpace(o); o != "" {
				a.origins[o] = true
			}
		}
	}
}

// WithMetrics counts issued tokens, the outcomes of redemptions, token
// records and verifications, and issue rate refusals in m; the Engine
// also counts and times every request by route, and serves GET /metrics.
// Defaults to nil: nothing is counted.
func WithMetrics(m *metrics.Metrics) Option { return func(a *API) { a.metrics = m } }

// WithLogger sets the logger for request lines and panics. Defaults to
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(a *API) {
		if l != nil {
			a.log = l
		}
	}
}

// WithVerifier serves POST /v1/signatures/verify, which checks a signed
// request (RFC 9421) that a backend in another language received, with v.
// Like redeem, it requires Authorization: Bearer <key> when WithAPIKeys is
// set. Defaults to nil: the route answers 404 not_found.
func WithVerifier(v *replay.Verifier) Option { return func(a *API) { a.verifier = v } }

// WithRecords lets backends record the response of a token's one
// execution through the API, as guard.WithRecords does in Go: POST
// /v1/tokens/redeem with "record": true opens a processing record under
// the token's ID (leased for k's lock TTL, not renewed), POST
// /v1/tokens/complete stores the backend's response in it, POST
// /v1/tokens/release gives the token back for a retry and POST
// /v1/tokens/renew extends the lease for slow work. Every redeem of a
// token that has a record, with or without "record", answers from it:
// the stored response ("status": "replayed"), or 409 request_in_progress
// while it is processing, even after the token's exp. k's retention and
// body cap apply, and k must keep its records in the store the API's
// token.Service uses: a token's record lives beside the token. Like redeem,
// complete, release and renew require Authorization: Bearer <key> when
// WithAPIKeys is set. Defaults to nil: "record": true is 400
// invalid_request and the three routes answer 404 not_found.
func WithRecords(k *idempotency.Keeper) Option { return func(a *API) { a.keeper = k } }

// WithTrustedProxies sets the IPs or CIDRs whose X-Forwarded-For and
// X-Real-IP headers the Engine believes for the client IP (the issue
// rate's key, the request log). Defaults to none: the client IP is the
// peer address. On your own router, call its SetTrustedProxies instead.
func WithTrustedProxies(proxies ...string) Option {
	return func(a *API) { a.proxies = append(a.proxies, proxies...) }
}

// WithUsage has GET /readyz report how full u, a bounded store such as
// the memory store, is: while it refuses new idempotency records but
// still serves tokens, nonces and replays, /readyz answers 200 with the
// warning "records_full" (the store is not taken out of service for it;
// a store that refuses tokens fails its ping and /readyz answers 503
// store_full). Defaults to nil: no warnings.
func WithUsage(u store.Usager) Option { return func(a *API) { a.usage = u } }

// WithReadyTimeout bounds the store ping behind GET /readyz. Defaults to
// DefaultReadyTimeout (1s); d <= 0 keeps the default.
func WithReadyTimeout(d time.Duration) Option {
	return func(a *API) {
		if d > 0 {
			a.timeout = d
		}
	}
}

// New returns an API over tokens.
func New(tokens *token.Service, opts ...Option) *API {
	a := &API{
		tokens:  tokens,
		origins: map[string]bool{},
		log:     slog.Default(),
		timeout: DefaultReadyTimeout,
		prop:    tracing.Propagator(),
	}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Mount registers the token API on an application's own Gin router (or
// group) in one call and returns it.
func Mount(r gin.IRoutes, tokens *token.Service, opts ...Option) *API {
	a := New(tokens, opts...)
	a.Register(r)
	return a
}

// Register adds POST /v1/tokens, POST /v1/tokens/redeem, the CORS
// preflight for the former, POST /v1/tokens/complete, /v1/tokens/release
// and /v1/tokens/renew (404 without WithRecords), the forward-auth
// endpoint ForwardAuthPath, POST /v1/signatures/verify (404 without
// WithVerifier), the operators' endpoints under /v1/admin/ (404 without
// WithAdminKeys), and the browser SDK (GET and HEAD of sdk.Paths:
// /sdk/replayguard.js, .mjs, .src.js, .min.js.map and .js.sri) to r.
func (a *API) Register(r gin.IRoutes) {
	r.POST("/v1/tokens", a.cors, a.handle(a.issue, a.countIssue))
	r.OPTIONS("/v1/tokens", a.preflight)
	r.POST("/v1/tokens/redeem", a.handle(a.redeem, a.metrics.Redemption))
	r.POST("/v1/tokens/complete", a.handle(a.finish(a.complete), func(o string) { a.metrics.TokenRecord("complete", o) }))
	r.POST("/v1/tokens/release", a.handle(a.finish(a.release), func(o string) { a.metrics.TokenRecord("release", o) }))
	r.POST("/v1/tokens/renew", a.handle(a.finish(a.renew), func(o string) { a.metrics.TokenRecord("renew", o) }))
	for _, m := range forwardAuthMethods {
		r.Handle(m, ForwardAuthPath, a.forwardAuth)
	}
	r.POST("/v1/signatures/verify", a.handle(a.verifySignature, a.metrics.SignatureVerification))
	a.registerAdmin(r)
	files := gin.WrapH(sdk.Handler())
	for _, p := range sdk.Paths() {
		r.GET(p, files)
		r.HEAD(p, files)
	}
}

// endpoint is an API handler: it answers a request that succeeds, with
// the outcome it counts, or returns the error it refuses it with.
type endpoint func(c *gin.Context) (outcome string, err error)

// handle is the one place where an endpoint's outcome is counted and its
// refusal written: count gets the outcome, or the problem code of the
// error, which is answered as a problem.
func (a *API) handle(e endpoint, count func(outcome string)) gin.HandlerFunc {
	traced := a.tracer != nil // else no request has a span to look for
	return func(c *gin.Context) {
		outcome, err := e(c)
		if err != nil {
			p := problem.For(err) // once, for the count and the answer
			outcome = p.Code
			answer(c, err, p)
		}
		if outcome != "" {
			count(outcome)
			if traced {
				tracing.SetOutcome(c.Request.Context(), outcome)
			}
		}
	}
}

// fail answers c with the problem for err.
func fail(c *gin.Context, err error) { answer(c, err, problem.For(err)) }

// answer answers c with p, the problem for err.
func answer(c *gin.Context, err error, p problem.Problem) {
	c.Abort()
	_ = c.Error(err) // the request log names the cause of a 5xx
	p.Write(c.Writer)
}

// countIssue counts an issued token.
func (a *API) countIssue(outcome string) {
	if outcome == "issued" {
		a.metrics.Issued()
	}
}

type issueBody struct {
	Purpose    string `json:"purpose"`
	TTLSeconds *int64 `json:"ttl_seconds"`
	Subject    string `json:"subject"`
}

type issueResponse struct {
	Token     string `json:"token"`
	ID        string `json:"id"`
	Purpose   string `json:"purpose"`
	ExpiresAt string `json:"expires_at"`
	ExpiresIn int64  `json:"expires_in"`
}

func (a *API) issue(c *gin.Context) (string, error) {
	authed := a.authorized(c.Request)
	if !authed && a.limiter != nil && !a.rate.IsZero() {
		ok, retry, err := a.limiter.Allow(c.Request.Context(), "issue:"+request.Network(c.ClientIP()), a.rate)
		if err != nil {
			return "", err
		}
		if !ok {
			a.metrics.RateLimited(metrics.RateLimitIssue)
			return "", problem.RetryAfter(fmt.Errorf("%w: at most %d tokens per %v per client", problem.ErrRateLimited, a.rate.Rate, a.rate.Period), retry)
		}
	}
	var body issueBody
	if err := readJSON(c.Request, &body, MaxBodyBytes); err != nil {
		return "", err
	}
	if body.Purpose == "" && c.Request.URL.RawQuery != "" {
		// Only then: gin parses the query into a map on the first look.
		body.Purpose = c.Query("purpose")
	}
	if body.Subject != "" && !authed {
		return "", fmt.Errorf("%w: present a valid API key to bind a token to a subject", problem.ErrSubjectNotAllowed)
	}
	req := token.IssueRequest{Purpose: body.Purpose, Subject: body.Subject}
	if body.TTLSeconds != nil {
		// Out-of-range values become -1s, which Issue refuses naming the bounds.
		req.TTL = -time.Second
		if ttl := *body.TTLSeconds; ttl > 0 && ttl < 1<<32 {
			req.TTL = time.Duration(ttl) * time.Second
		}
	}
	is, err := a.tokens.Issue(c.Request.Context(), req)
	if err != nil {
		return "", err
	}
	noStore(c)
	writeJSON(c, http.StatusCreated, issueResponse{
		Token:     is.Token,
		ID:        is.ID,
		Purpose:   is.Purpose,
		ExpiresAt: is.ExpiresAt.UTC().Format(time.RFC3339),
		ExpiresIn: int64(is.TTL / time.Second),
	}.appendJSON)
	return "issued", nil
}

// appendJSON appends r as json.Marshal writes it (but for '<', '>' and
// '&', left as they are, see internal/jsonw): the issue answer is on the
// hot path.
func (r issueResponse) appendJSON(b []byte) []byte {
	b = append(b, `{"token":`...)
	b = jsonw.Quoted(b, r.Token)
	b = append(b, `,"id":`...)
	b = jsonw.Quoted(b, r.ID)
	b = append(b, `,"purpose":`...)
	b = jsonw.Quoted(b, r.Purpose)
	b = append(b, `,"expires_at":`...)
	b = jsonw.Quoted(b, r.ExpiresAt)
	b = append(b, `,"expires_in":`...)
	b = strconv.AppendInt(b, r.ExpiresIn, 10)
	return append(b, '}')
}

// appendJSON appends r as json.Marshal writes it (see issueResponse's),
// for answers without a recorded response; those go through c.JSON.
func (r redeemResponse) appendJSON(b []byte) []byte {
	b = append(b, `{"status":`...)
	b = jsonw.Quoted(b, r.Status)
	b = append(b, `,"id":`...)
	b = jsonw.Quoted(b, r.ID)
	b = append(b, `,"purpose":`...)
	b = jsonw.Quoted(b, r.Purpose)
	b = append(b, `,"subject":`...)
	b = jsonw.Quoted(b, r.Subject)
	if r.Lease != "" {
		b = append(b, `,"lease":`...)
		b = jsonw.Quoted(b, r.Lease)
	}
	if r.LeaseExpiresAt != "" {
		b = append(b, `,"lease_expires_at":`...)
		b = jsonw.Quoted(b, r.LeaseExpiresAt)
	}
	return append(b, '}')
}

// writeJSON answers status with the JSON body that appendBody appends,
// as c.JSON would (the same Content-Type), without reflection.
func writeJSON(c *gin.Context, status int, appendBody func([]byte) []byte) {
	bp := jsonBodies.Get().(*[]byte)
	b := appendBody((*bp)[:0])
	c.Writer.Header()["Content-Type"] = jsonContentType
	c.Status(status)
	_, _ = c.Writer.Write(b)
	if cap(b) <= 4<<10 {
		*bp = b
		jsonBodies.Put(bp)
	}
}

// noStore sets Cache-Control: no-store, without canonicalising the name
// or allocating its value on every answer.
func noStore(c *gin.Context) { c.Writer.Header()["Cache-Control"] = noStoreValue }

// noStoreValue is Cache-Control's value on API answers. net/http only
// reads it.
var noStoreValue = []string{"no-store"}

// jsonContentType is c.JSON's Content-Type. net/http only reads it.
var jsonContentType = []string{"application/json; charset=utf-8"}

var jsonBodies = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

type redeemBody struct {
	Token   string `json:"token"`
	Purpose string `json:"purpose"`
	Subject string `json:"subject"`
	Record  bool   `json:"record"`
}

type redeemResponse struct {
	Status  string `json:"status"`
	ID      string `json:"id"`
	Purpose string `json:"purpose"`
	Subject string `json:"subject"`
	// Response is the recorded response, on "replayed" answers only.
	Response *recordedResponse `json:"response,omitempty"`
	// Lease names the execution a "record": true redemption started: sent
	// back with /complete or /release, it makes sure they end this
	// execution's record and never a later one's. Set on that answer only.
	Lease string `json:"lease,omitempty"`
	// LeaseExpiresAt is when the record a "record": true redemption opened
	// stops blocking duplicates, RFC 3339 UTC: complete or release it
	// before then. Not renewed; set on that answer only.
	LeaseExpiresAt string `json:"lease_expires_at,omitempty"`
}

// recordedResponse is a backend's response as the API stores and replays
// it: the status, one string per header name, and the body in standard
// base64 (RFC 4648, with padding).
type recordedResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

func (a *API) redeem(c *gin.Context) (string, error) {
	if !a.allowed(c.Request) {
		return "", problem.ErrUnauthorized
	}
	var body redeemBody
	if err := readJSON(c.Request, &body, MaxBodyBytes); err != nil {
		return "", err
	}
	tok := c.GetHeader(token.Header)
	if tok == "" {
		tok = body.Token
	}
	if body.Purpose == "" && c.Request.URL.RawQuery != "" {
		// Only then: gin parses the query into a map on the first look.
		body.Purpose = c.Query("purpose")
	}
	switch {
	case tok == "":
		return "", fmt.Errorf("%w: no token: send the %s header or a JSON body with \"token\"", problem.ErrBadRequest, token.Header)
	case body.Record && a.keeper == nil:
		return "", fmt.Errorf("%w: this server does not record responses, so \"record\" cannot be true", problem.ErrBadRequest)
	}
	noStore(c)
	if a.keeper == nil {
		claims, err := a.tokens.Redeem(c.Request.Context(), tok, body.Purpose, body.Subject)
		if err != nil {
			return "", err
		}
		writeJSON(c, http.StatusOK, redeemResponse{Status: "redeemed", ID: claims.ID, Purpose: claims.Purpose, Subject: claims.Subject}.appendJSON)
		return "redeemed", nil
	}
	mode := idempotency.NoRecord
	if body.Record {
		mode = idempotency.Detached
	}
	red, err := a.keeper.RedeemToken(c.Request.Context(), a.tokens, tok, body.Purpose, body.Subject, mode)
	if red.Claims.ID != "" && (red.Replayed || red.Run != nil || err != nil) {
		// The token's record was opened or found: the log line names it.
		problem.SetRecordKey(c.Request.Context(), store.TokenRecordKey(red.Claims.ID))
	}
	if err != nil {
		return "", err
	}
	resp := redeemResponse{Status: "redeemed", ID: red.Claims.ID, Purpose: red.Claims.Purpose, Subject: red.Claims.Subject}
	switch {
	case red.Replayed:
		resp.Status, resp.Response = "replayed", responseOf(red.Outcome)
	case red.Run != nil:
		resp.Lease = red.Run.Lease()
		resp.LeaseExpiresAt = red.Run.Expires().UTC().Truncate(time.Second).Format(time.RFC3339)
	}
	if resp.Response != nil {
		c.JSON(http.StatusOK, resp)
	} else {
		writeJSON(c, http.StatusOK, resp.appendJSON)
	}
	return resp.Status, nil
}

// responseOf is the API's form of a stored outcome: header values joined
// with ", ", the body in standard base64.
func responseOf(out idempotency.Outcome) *recordedResponse {
	r := &recordedResponse{Status: out.Status, Headers: make(map[string]string, len(out.Header)), Body: base64.StdEncoding.EncodeToString(out.Body)}
	for name, vs := range out.Header {
		r.Headers[name] = strings.Join(vs, ", ")
	}
	return r
}

// finishBody is the body of POST /v1/tokens/complete, /release and
// /renew.
type finishBody struct {
	Token    string            `json:"token"`
	Lease    string            `json:"lease"`
	Response *recordedResponse `json:"response"` // complete only
}

// finish is the part complete, release and renew share: the records,
// the API key, the body, the token (from the Idempotency-Token header,
// else the body; its exp may have passed, since the request it started
// may have outlived it) and its run, then end, and 204 unless end
// answered. A body over the cap still completes the record, without it:
// it reads up to twice the cap in base64 beside the rest of the request.
func (a *API) finish(end func(c *gin.Context, run *idempotency.Run, body finishBody) (string, error)) endpoint {
	return func(c *gin.Context) (string, error) {
		if a.keeper == nil {
			return "", fmt.Errorf("%w: this server does not record responses", problem.ErrNotFound)
		}
		if !a.allowed(c.Request) {
			return "", problem.ErrUnauthorized
		}
		var body finishBody
		limit := int64(MaxBodyBytes) + 2*int64(base64.StdEncoding.EncodedLen(a.keeper.MaxBody()))
		if err := readJSON(c.Request, &body, limit); err != nil {
			return "", err
		}
		if h := c.GetHeader(token.Header); h != "" {
			body.Token = h
		}
		if body.Token == "" {
			return "", fmt.Errorf("%w: no token: send the %s header or a JSON body with \"token\"", problem.ErrBadRequest, token.Header)
		}
		run, err := a.keeper.ResumeToken(a.tokens, body.Token, body.Lease)
		if err != nil {
			return "", err
		}
		problem.SetRecordKey(c.Request.Context(), run.Key())
		outcome, err := end(c, run, body)
		if err != nil {
			return "", err
		}
		if !c.Writer.Written() {
			c.Status(http.StatusNoContent)
		}
		return outcome, nil
	}
}

// complete ends POST /v1/tokens/complete: it stores a backend's response
// in the token's processing record.
func (a *API) complete(c *gin.Context, run *idempotency.Run, body finishBody) (string, error) {
	out, err := outcomeOf(body.Response)
	if err != nil {
		return "", err
	}
	return "completed", run.Complete(c.Request.Context(), out)
}

// release ends POST /v1/tokens/release: it deletes the token's processing
// record, so that the token can be redeemed again.
func (a *API) release(c *gin.Context, run *idempotency.Run, _ finishBody) (string, error) {
	return "released", run.Release(c.Request.Context())
}

// renew ends POST /v1/tokens/renew: it extends the lease of the token's
// processing record that the body's lease names to the lock TTL from
// now, for a backend whose work takes longer than the lease, and answers
// when the lease now ends.
func (a *API) renew(c *gin.Context, run *idempotency.Run, body finishBody) (string, error) {
	if body.Lease == "" {
		return "", fmt.Errorf("%w: no lease: send the \"lease\" the redemption answered; only the execution that holds the record renews it", problem.ErrBadRequest)
	}
	expires, err := run.Renew(c.Request.Context())
	if err != nil {
		return "", err
	}
	noStore(c)
	writeJSON(c, http.StatusOK, renewResponse{LeaseExpiresAt: expires.UTC().Truncate(time.Second).Format(time.RFC3339)}.appendJSON)
	return "renewed", nil
}

// renewResponse is the answer of POST /v1/tokens/renew.
type renewResponse struct {
	// LeaseExpiresAt is when the renewed lease ends, RFC 3339 UTC, never
	// later than the store's own end of it.
	LeaseExpiresAt string `json:"lease_expires_at"`
}

// appendJSON appends r as json.Marshal writes it (see issueResponse's),
// with "status" first.
func (r renewResponse) appendJSON(b []byte) []byte {
	b = append(b, `{"status":"renewed","lease_expires_at":`...)
	b = jsonw.Quoted(b, r.LeaseExpiresAt)
	return append(b, '}')
}

// outcomeOf checks a response a backend sent to /complete and returns it
// as an Outcome. Header names are canonicalised; headers never replayed
// (Set-Cookie, Date, hop-by-hop ones) are left out.
func outcomeOf(r *recordedResponse) (idempotency.Outcome, error) {
	if r == nil {
		return idempotency.Outcome{}, fmt.Errorf("%w: no response: send \"response\": {\"status\", \"headers\", \"body\"}", problem.ErrBadRequest)
	}
	if r.Status < 200 || r.Status > 599 {
		return idempotency.Outcome{}, fmt.Errorf("%w: response status %d is not between 200 and 599", problem.ErrBadRequest, r.Status)
	}
	out := idempotency.Outcome{Status: r.Status}
	for name, v := range r.Headers {
		if !request.IsToken(name) {
			return idempotency.Outcome{}, fmt.Errorf("%w: response header name %q is not an HTTP token", problem.ErrBadRequest, name)
		}
		if !request.ValidFieldValue(v) {
			return idempotency.Outcome{}, fmt.Errorf("%w: the value of response header %q holds a control character", problem.ErrBadRequest, name)
		}
		name = http.CanonicalHeaderKey(name)
		if _, dup := out.Header[name]; dup {
			return idempotency.Outcome{}, fmt.Errorf("%w: response header %q is given twice", problem.ErrBadRequest, name)
		}
		if out.Header == nil {
			out.Header = make(map[string][]string, len(r.Headers))
		}
		out.Header[name] = []string{v}
	}
	for name := range out.Header {
		if !idempotency.Replayable(name) {
			delete(out.Header, name)
		}
	}
	body, err := base64.StdEncoding.DecodeString(r.Body)
	if err != nil {
		return idempotency.Outcome{}, fmt.Errorf("%w: the response body is not standard base64: %v", problem.ErrBadRequest, err)
	}
	out.Body = body
	return out, nil
}

// allowed reports whether r may use an endpoint that requires an API key
// when WithAPIKeys is set.
func (a *API) allowed(r *http.Request) bool { return len(a.apiKeys) == 0 || a.authorized(r) }

// authorized reports whether r carries one of the API keys, comparing
// fixed-size digests in constant time.
func (a *API) authorized(r *http.Request) bool {
	_, ok := keyIndex(r, a.apiKeys)
	return ok
}

// readJSON decodes an optional JSON object body of at most limit bytes
// into v. An empty body leaves v as it is.
func readJSON(r *http.Request, v any, limit int64) error {
	data, err := request.ReadBody(r, limit)
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: the body is not a valid JSON object: %v", problem.ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: the body holds more than one JSON value", problem.ErrBadRequest)
	}
	return nil
}

// Ready reports whether the store answers within the ready timeout.
func (a *API) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	return a.tokens.Ping(ctx)
}

// readyWarnings returns what a ready store lacks (see WithUsage):
// "records_full" while it refuses new idempotency records. None is nil.
func (a *API) readyWarnings() []string {
	if a.usage != nil && a.usage.Usage().RecordsFull {
		return []string{"records_full"}
	}
	return nil
}
