package handlers

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/web/sdk"
)

// Defaults for the options below.
const (
	// MaxBodyBytes bounds every request body the API reads.
	MaxBodyBytes = 64 << 10
	// TokenHeader carries a token to redeem.
	TokenHeader = "Idempotency-Token"
	// TokenField is the form field that carries a token.
	TokenField = "idempotency_token"
)

// DefaultIssueRate is the default per-client-IP issue rate: 120 a minute
// with bursts of 120.
var DefaultIssueRate = store.Limit{Rate: 120, Burst: 120, Period: time.Minute}

// API serves the token endpoints. Create it with New.
type API struct {
	tokens   *token.Service
	limiter  store.Limiter
	rate     store.Limit
	apiKeys  [][sha256.Size]byte
	origins  map[string]bool
	metrics  *metrics.Metrics
	log      *slog.Logger
	timeout  time.Duration
	verifier *replay.Verifier
	keeper   *idempotency.Keeper
}

// Option configures an API.
type Option func(*API)

// WithAPIKeys requires Authorization: Bearer <key> on redeem, with one of
// keys, and lets those callers issue subject-bound tokens. Keys are
// compared in constant time. Defaults to none: redeem is open and subjects
// cannot be requested.
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

// WithMetrics counts issued tokens and redemption outcomes in m.
// Defaults to nil: nothing is counted.
func WithMetrics(m *metrics.Metrics) Option { return func(a *API) { a.metrics = m } }

// WithLogger sets the logger for warnings. Defaults to slog.Default().
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
// execution through the API, as the Guard's WithTokenRecords does in Go:
// POST /v1/tokens/redeem with "record": true opens a processing record
// under the token's ID (leased for k's lock TTL, not renewed), POST
// /v1/tokens/complete stores the backend's response in it and POST
// /v1/tokens/release gives the token back for a retry. Every redeem of a
// token that has a record, with or without "record", answers from it:
// the stored response ("status": "replayed"), or 409 request_in_progress
// while it is processing, even after the token's exp. k's retention and
// body cap apply, and k must keep its records in the store the API's
// token.Service uses: a token's record lives beside the token. Like redeem,
// complete and release require Authorization: Bearer <key> when
// WithAPIKeys is set. Defaults to nil: "record": true is 400
// invalid_request and the two routes answer 404 not_found.
func WithRecords(k *idempotency.Keeper) Option { return func(a *API) { a.keeper = k } }

// WithReadyTimeout bounds the store ping behind GET /readyz. Defaults to
// one second.
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
		rate:    DefaultIssueRate,
		origins: map[string]bool{},
		log:     slog.Default(),
		timeout: time.Second,
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
// preflight for the former, POST /v1/tokens/complete and
// /v1/tokens/release (404 without WithRecords), the forward-auth
// endpoint ForwardAuthPath, POST /v1/signatures/verify (404 without
// WithVerifier), and the browser SDK
// (GET /sdk/replayguard.js, /sdk/replayguard.mjs and
// /sdk/replayguard.js.sri) to r.
func (a *API) Register(r gin.IRoutes) {
	r.POST("/v1/tokens", a.cors, a.issue)
	r.OPTIONS("/v1/tokens", a.preflight)
	r.POST("/v1/tokens/redeem", a.redeem)
	r.POST("/v1/tokens/complete", a.complete)
	r.POST("/v1/tokens/release", a.release)
	a.registerForwardAuth(r)
	r.POST("/v1/signatures/verify", a.verifySignature)
	files := gin.WrapH(sdk.Handler())
	for _, p := range []string{sdk.ScriptPath, sdk.ModulePath, sdk.SRIPath} {
		r.GET(p, files)
		r.HEAD(p, files)
	}
}

func fail(c *gin.Context, err error) {
	c.Abort()
	_ = c.Error(err) // the request log names the cause of a 5xx
	WriteProblem(c.Writer, c.Request, err)
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

func (a *API) issue(c *gin.Context) {
	authed := a.authorized(c.Request)
	if !authed && a.limiter != nil && !a.rate.IsZero() {
		ok, retry, err := a.limiter.Allow(c.Request.Context(), "issue:"+rateKey(c.ClientIP()), a.rate)
		if err != nil {
			fail(c, fmt.Errorf("%w: %w", token.ErrUnavailable, err))
			return
		}
		if !ok {
			fail(c, retryAfterError{fmt.Errorf("%w: at most %d tokens per %v per client", ErrRateLimited, a.rate.Rate, a.rate.Period), retry})
			return
		}
	}
	var body issueBody
	if err := readJSON(c.Request, &body, MaxBodyBytes); err != nil {
		fail(c, err)
		return
	}
	if body.Purpose == "" {
		body.Purpose = c.Query("purpose")
	}
	if body.Subject != "" && !authed {
		fail(c, fmt.Errorf("%w: present a valid API key to bind a token to a subject", ErrSubjectNotAllowed))
		return
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
		fail(c, err)
		return
	}
	a.metrics.Issued()
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusCreated, issueResponse{
		Token:     is.Token,
		ID:        is.ID,
		Purpose:   is.Purpose,
		ExpiresAt: is.ExpiresAt.UTC().Format(time.RFC3339),
		ExpiresIn: int64(is.TTL / time.Second),
	})
}

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

func (a *API) redeem(c *gin.Context) {
	if len(a.apiKeys) > 0 && !a.authorized(c.Request) {
		a.metrics.Redemption("unauthorized")
		fail(c, ErrUnauthorized)
		return
	}
	var body redeemBody
	if err := readJSON(c.Request, &body, MaxBodyBytes); err != nil {
		a.metrics.Redemption(specFor(err).code)
		fail(c, err)
		return
	}
	tok := c.GetHeader(TokenHeader)
	if tok == "" {
		tok = body.Token
	}
	if body.Purpose == "" {
		body.Purpose = c.Query("purpose")
	}
	var err error
	switch {
	case tok == "":
		err = fmt.Errorf("%w: no token: send the %s header or a JSON body with \"token\"", ErrBadRequest, TokenHeader)
	case body.Record && a.keeper == nil:
		err = fmt.Errorf("%w: this server does not record responses, so \"record\" cannot be true", ErrBadRequest)
	}
	if err != nil {
		a.metrics.Redemption(specFor(err).code)
		fail(c, err)
		return
	}
	if a.keeper == nil {
		claims, err := a.tokens.Redeem(c.Request.Context(), tok, body.Purpose, body.Subject)
		if err != nil {
			a.metrics.Redemption(specFor(err).code)
			fail(c, err)
			return
		}
		a.redeemed(c, claims, "", time.Time{})
		return
	}
	claims, expired, err := checkForRecord(a.tokens, tok, body.Purpose, body.Subject)
	if err != nil {
		a.metrics.Redemption(specFor(err).code)
		fail(c, err)
		return
	}
	owner, lease, leaseEnd := "", "", time.Time{}
	if body.Record && !expired {
		if lease, err = newLease(); err != nil {
			a.metrics.Redemption(specFor(err).code)
			fail(c, err)
			return
		}
		// Taken before the store computes its own from a later now, so
		// the time told is never past the record's real lease.
		owner, leaseEnd = apiOwner(claims.ID, lease), a.keeper.Now().Add(a.keeper.LockTTL())
	}
	stored, res, err := a.keeper.OpenToken(c.Request.Context(), claims.ID, store.Token{Purpose: claims.Purpose, Subject: claims.Subject}, owner)
	if err == nil && res == store.Recorded {
		a.metrics.Redemption("replayed")
		c.Header("Cache-Control", "no-store")
		c.JSON(http.StatusOK, redeemResponse{
			Status: "replayed", ID: claims.ID, Purpose: claims.Purpose, Subject: claims.Subject,
			Response: responseOf(stored),
		})
		return
	}
	if err = redemptionError(a.tokens, claims, expired, res, err); err != nil {
		a.metrics.Redemption(specFor(err).code)
		fail(c, err)
		return
	}
	a.redeemed(c, claims, lease, leaseEnd)
}

// redeemed answers a redemption that succeeded; lease and leaseEnd name
// the record it opened, empty and zero for none.
func (a *API) redeemed(c *gin.Context, claims token.Claims, lease string, leaseEnd time.Time) {
	a.metrics.Redemption("redeemed")
	c.Header("Cache-Control", "no-store")
	resp := redeemResponse{Status: "redeemed", ID: claims.ID, Purpose: claims.Purpose, Subject: claims.Subject, Lease: lease}
	if !leaseEnd.IsZero() {
		resp.LeaseExpiresAt = leaseEnd.UTC().Truncate(time.Second).Format(time.RFC3339)
	}
	c.JSON(http.StatusOK, resp)
}

// apiOwner is the owner of a record the API opens for token id: the lease
// its redemption answer gave the backend.
func apiOwner(id, lease string) string { return "api:" + id + ":" + lease }

// newLease returns a fresh lease: 128 random bits in hex.
func newLease() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("%w: no randomness for a lease: %w", idempotency.ErrUnavailable, err)
	}
	return hex.EncodeToString(b[:]), nil
}

// finishOwner is the owner /complete and /release end the record of: the
// one lease names, or any owner ("") when the backend sent none, as the
// issue's contract allows. Without a lease, a backend that outlived its
// lease may end the record a duplicate reopened meanwhile.
func finishOwner(id, lease string) (string, error) {
	if lease == "" {
		return "", nil
	}
	if len(lease) != 32 || strings.Trim(lease, "0123456789abcdef") != "" {
		return "", fmt.Errorf("%w: \"lease\" must be the 32 hex digits the redemption answered", ErrBadRequest)
	}
	return apiOwner(id, lease), nil
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

type completeBody struct {
	Token    string            `json:"token"`
	Response *recordedResponse `json:"response"`
	Lease    string            `json:"lease"`
}

type releaseBody struct {
	Token string `json:"token"`
	Lease string `json:"lease"`
}

// complete serves POST /v1/tokens/complete: it stores a backend's
// response in the token's processing record.
func (a *API) complete(c *gin.Context) {
	var body completeBody
	a.finish(c, "complete", "completed", &body, &body.Token, func(claims token.Claims) error {
		out, err := outcomeOf(body.Response)
		if err != nil {
			return err
		}
		owner, err := finishOwner(claims.ID, body.Lease)
		if err != nil {
			return err
		}
		return a.keeper.CompleteToken(c.Request.Context(), claims.ID, owner, out)
	})
}

// release serves POST /v1/tokens/release: it deletes the token's
// processing record, so that the token can be redeemed again.
func (a *API) release(c *gin.Context) {
	var body releaseBody
	a.finish(c, "release", "released", &body, &body.Token, func(claims token.Claims) error {
		owner, err := finishOwner(claims.ID, body.Lease)
		if err != nil {
			return err
		}
		return a.keeper.ReleaseToken(c.Request.Context(), claims.ID, owner)
	})
}

// finish is the part complete and release share: the API key, the body
// (decoded into body, whose token field is tok), the token (from the
// Idempotency-Token header, else the body; its exp may have passed, since
// the request it started may have outlived it), then do, and 204.
func (a *API) finish(c *gin.Context, op, done string, body any, tok *string, do func(token.Claims) error) {
	err := func() error {
		if a.keeper == nil {
			return fmt.Errorf("%w: this server does not record responses", ErrNotFound)
		}
		if len(a.apiKeys) > 0 && !a.authorized(c.Request) {
			return ErrUnauthorized
		}
		// A body over the cap still completes the record, without it: read
		// up to twice the cap in base64 beside the rest of the request.
		limit := int64(MaxBodyBytes) + 2*int64(base64.StdEncoding.EncodedLen(a.keeper.MaxBody()))
		if err := readJSON(c.Request, body, limit); err != nil {
			return err
		}
		if h := c.GetHeader(TokenHeader); h != "" {
			*tok = h
		}
		if *tok == "" {
			return fmt.Errorf("%w: no token: send the %s header or a JSON body with \"token\"", ErrBadRequest, TokenHeader)
		}
		claims, err := a.tokens.ParseExpired(*tok)
		if err != nil {
			return err
		}
		return do(claims)
	}()
	if err != nil {
		a.metrics.TokenRecord(op, specFor(err).code)
		fail(c, err)
		return
	}
	a.metrics.TokenRecord(op, done)
	c.Status(http.StatusNoContent)
}

// outcomeOf checks a response a backend sent to /complete and returns it
// as an Outcome. Header names are canonicalised; headers never replayed
// (Set-Cookie, Date, hop-by-hop ones) are left out.
func outcomeOf(r *recordedResponse) (idempotency.Outcome, error) {
	if r == nil {
		return idempotency.Outcome{}, fmt.Errorf("%w: no response: send \"response\": {\"status\", \"headers\", \"body\"}", ErrBadRequest)
	}
	if r.Status < 200 || r.Status > 599 {
		return idempotency.Outcome{}, fmt.Errorf("%w: response status %d is not between 200 and 599", ErrBadRequest, r.Status)
	}
	out := idempotency.Outcome{Status: r.Status}
	for name, v := range r.Headers {
		if !isToken(name) {
			return idempotency.Outcome{}, fmt.Errorf("%w: response header name %q is not an HTTP token", ErrBadRequest, name)
		}
		if !validFieldValue(v) {
			return idempotency.Outcome{}, fmt.Errorf("%w: the value of response header %q holds a control character", ErrBadRequest, name)
		}
		name = http.CanonicalHeaderKey(name)
		if _, dup := out.Header[name]; dup {
			return idempotency.Outcome{}, fmt.Errorf("%w: response header %q is given twice", ErrBadRequest, name)
		}
		if out.Header == nil {
			out.Header = make(map[string][]string, len(r.Headers))
		}
		out.Header[name] = []string{v}
	}
	for name := range out.Header {
		if unreplayed[name] {
			delete(out.Header, name)
		}
	}
	body, err := base64.StdEncoding.DecodeString(r.Body)
	if err != nil {
		return idempotency.Outcome{}, fmt.Errorf("%w: the response body is not standard base64: %v", ErrBadRequest, err)
	}
	out.Body = body
	return out, nil
}

// validFieldValue reports whether v may be an HTTP field value: no
// control characters but horizontal tab.
func validFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; b < ' ' && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}

// authorized reports whether r carries one of the API keys, comparing
// fixed-size digests in constant time.
func (a *API) authorized(r *http.Request) bool {
	if len(a.apiKeys) == 0 {
		return false
	}
	h := r.Header.Get("Authorization")
	scheme, key, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || key == "" {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(key)))
	found := 0
	for i := range a.apiKeys {
		found |= subtle.ConstantTimeCompare(sum[:], a.apiKeys[i][:])
	}
	return found == 1
}

// readJSON decodes an optional JSON object body of at most limit bytes
// (MaxBodyBytes but for /v1/tokens/complete) into v. An empty body leaves
// v as it is.
func readJSON(r *http.Request, v any, limit int64) error {
	if r.ContentLength > limit {
		return fmt.Errorf("%w: the body is over %d bytes", ErrTooLarge, limit)
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("%w: the body is over %d bytes", ErrTooLarge, limit)
		}
		return fmt.Errorf("%w: reading the body: %v", ErrBadRequest, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: the body is not a valid JSON object: %v", ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: the body holds more than one JSON value", ErrBadRequest)
	}
	return nil
}

// rateKey is the client's address, with IPv6 clients counted per /64 so
// one host cannot dodge the limit by rotating its interface ID.
func rateKey(ip string) string {
	addr := net.ParseIP(ip)
	if addr == nil || addr.To4() != nil {
		return ip
	}
	return addr.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// Ready reports whether the store answers within the ready timeout.
func (a *API) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if err := a.tokens.Ping(ctx); err != nil {
		return fmt.Errorf("%w: %w", token.ErrUnavailable, err)
	}
	return nil
}
