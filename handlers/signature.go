package handlers

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/replay"
)

// SignatureGuard protects an application's own routes with signed
// requests (HTTP Message Signatures, RFC 9421): a request passes once,
// inside its time window, and only when a known client signed it. One
// core function, Verify, serves both the Gin and the net/http middleware.
// Create it with NewSignatureGuard.
type SignatureGuard struct {
	verifier  *replay.Verifier
	scheme    string
	authority string
	onError   http.Handler
	metrics   *metrics.Metrics
}

// SignatureOption configures a SignatureGuard.
type SignatureOption func(*SignatureGuard)

// WithScheme fixes the scheme of the target URI the signature is checked
// against ("https" or "http"), for applications behind a proxy that
// terminates TLS: clients sign the URI they call, https://…, while the
// application sees plain HTTP. Defaults to "https" when the request came
// over TLS (r.TLS is set) and "http" otherwise; X-Forwarded-Proto is never
// believed, since any client could send it.
func WithScheme(scheme string) SignatureOption {
	return func(g *SignatureGuard) { g.scheme = strings.ToLower(scheme) }
}

// WithAuthority fixes the authority (host and, when not the default,
// port) of the target URI the signature is checked against, for
// applications behind a proxy that rewrites the Host header. Defaults to
// the request's Host header (r.Host), which the client chooses: when
// other services accept the same client keys but keep their nonces in
// another store, set your public host here (recommended), so a request
// signed for one of them cannot be replayed to this one with a forged
// Host.
func WithAuthority(authority string) SignatureOption {
	return func(g *SignatureGuard) { g.authority = authority }
}

// WithSignatureErrorHandler replaces the problem+json answer to a refused
// request, so applications can answer in their own format. The handler
// finds the reason with FailureReason(r) and the status with ProblemFor.
// Defaults to writing the problem JSON.
func WithSignatureErrorHandler(h http.Handler) SignatureOption {
	return func(g *SignatureGuard) { g.onError = h }
}

// WithSignatureMetrics counts verification outcomes in m
// (replayguard_signature_verifications_total). Defaults to nil: nothing
// is counted.
func WithSignatureMetrics(m *metrics.Metrics) SignatureOption {
	return func(g *SignatureGuard) { g.metrics = m }
}

// NewSignatureGuard returns a SignatureGuard that verifies requests with v.
func NewSignatureGuard(v *replay.Verifier, opts ...SignatureOption) *SignatureGuard {
	g := &SignatureGuard{verifier: v}
	for _, o := range opts {
		o(g)
	}
	return g
}

type signatureKey struct{}

// SignatureFrom returns the verified signature of the request ctx belongs
// to: its key ID, label, created time and nonce.
func SignatureFrom(ctx context.Context) (replay.Result, bool) {
	res, ok := ctx.Value(signatureKey{}).(replay.Result)
	return res, ok
}

// Verify is the core both middlewares share. An unsigned request is
// refused (replay.ErrMissing) before its body is read. Otherwise it reads
// the body (at most replay.MaxBodyBytes; a longer one is ErrTooLarge,
// 413) so its content digest can be checked, and puts it back in r.Body
// for the next handler.
// The target URI is the scheme (see WithScheme), the authority (r.Host,
// see WithAuthority) and the path and query exactly as the client sent
// them in the request line, so routers that rewrite r.URL.Path (such as
// http.StripPrefix) do not break signatures. It returns replay's errors
// as they are; ProblemFor maps them.
func (g *SignatureGuard) Verify(r *http.Request) (replay.Result, error) {
	res, err := g.verify(r)
	outcome := "verified"
	if err != nil {
		outcome = specFor(err).code
	}
	g.metrics.SignatureVerification(outcome)
	return res, err
}

func (g *SignatureGuard) verify(r *http.Request) (replay.Result, error) {
	if len(r.Header.Values("Signature-Input")) == 0 || len(r.Header.Values("Signature")) == 0 {
		return replay.Result{}, replay.ErrMissing // before reading a body for nothing
	}
	body, err := readSignedBody(r)
	if err != nil {
		return replay.Result{}, err
	}
	scheme := g.scheme
	if scheme == "" {
		scheme = "http"
		if r.TLS != nil {
			scheme = "https"
		}
	}
	authority := g.authority
	if authority == "" {
		authority = r.Host
	}
	src := r.URL
	if r.RequestURI != "" && r.RequestURI != "*" {
		if u, err := url.ParseRequestURI(r.RequestURI); err == nil {
			src = u
		}
	}
	target := &url.URL{
		Scheme:     scheme,
		Host:       authority,
		Path:       src.Path,
		RawPath:    src.RawPath,
		RawQuery:   src.RawQuery,
		ForceQuery: src.ForceQuery,
	}
	return g.verifier.Verify(r.Context(), replay.Message{Method: r.Method, URL: target, Header: r.Header, Body: body})
}

// readSignedBody reads r's body, at most replay.MaxBodyBytes, and puts
// it back for the next handler. A request without a body gives nil.
func readSignedBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	tooLarge := fmt.Errorf("%w: the body is over %d bytes, the most a signed request may carry", ErrTooLarge, replay.MaxBodyBytes)
	if r.ContentLength > replay.MaxBodyBytes {
		return nil, tooLarge
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, replay.MaxBodyBytes+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("%w: the body is over %d bytes", ErrTooLarge, mbe.Limit)
		}
		return nil, fmt.Errorf("%w: reading the body: %v", ErrBadRequest, err)
	}
	if len(data) > replay.MaxBodyBytes {
		return nil, tooLarge
	}
	_ = r.Body.Close()
	if len(data) == 0 {
		r.Body, r.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
		return nil, nil
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	return data, nil
}

func (g *SignatureGuard) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if g.onError == nil {
		WriteProblem(w, r, err)
		return
	}
	g.onError.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), failureKey{}, err)))
}

// RequireSignature is Gin middleware that lets a request through only
// when its signature verifies now (and its nonce was never seen); the
// replay.Result is then in the request context (SignatureFrom) and in the
// Gin context under "replayguard.signature".
func (g *SignatureGuard) RequireSignature() gin.HandlerFunc {
	return func(c *gin.Context) {
		res, err := g.Verify(c.Request)
		if err != nil {
			c.Abort()
			g.refuse(c.Writer, c.Request, err)
			return
		}
		c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), signatureKey{}, res))
		c.Set("replayguard.signature", res)
		c.Next()
	}
}

// RequireSignatureHandler is the net/http form of RequireSignature.
func (g *SignatureGuard) RequireSignatureHandler() func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			res, err := g.Verify(r)
			if err != nil {
				g.refuse(w, r, err)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), signatureKey{}, res)))
		})
	}
}

// verifyRequest is the body of POST /v1/signatures/verify: the request a
// backend received, as it received it.
type verifyRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

type verifyResponse struct {
	Status  string `json:"status"`
	KeyID   string `json:"keyid"`
	Created int64  `json:"created"`
	Nonce   string `json:"nonce"`
}

// verifySignature serves POST /v1/signatures/verify.
func (a *API) verifySignature(c *gin.Context) {
	if a.verifier == nil {
		fail(c, fmt.Errorf("%w: signature verification is not configured on this server", ErrNotFound))
		return
	}
	if len(a.apiKeys) > 0 && !a.authorized(c.Request) {
		a.metrics.SignatureVerification("unauthorized")
		fail(c, ErrUnauthorized)
		return
	}
	m, err := readVerifyRequest(c.Request)
	if err == nil {
		var res replay.Result
		res, err = a.verifier.Verify(c.Request.Context(), m)
		if err == nil {
			a.metrics.SignatureVerification("verified")
			c.Header("Cache-Control", "no-store")
			c.JSON(http.StatusOK, verifyResponse{Status: "verified", KeyID: res.KeyID, Created: res.Created.Unix(), Nonce: res.Nonce})
			return
		}
	}
	a.metrics.SignatureVerification(specFor(err).code)
	fail(c, err)
}

// readVerifyRequest decodes and checks the body of POST
// /v1/signatures/verify into the message to verify.
func readVerifyRequest(r *http.Request) (replay.Message, error) {
	var body verifyRequest
	if err := readJSON(r, &body, MaxBodyBytes); err != nil {
		return replay.Message{}, err
	}
	if body.Method == "" {
		return replay.Message{}, fmt.Errorf("%w: \"method\" is required", ErrBadRequest)
	}
	if !isToken(body.Method) {
		return replay.Message{}, fmt.Errorf("%w: \"method\" is not an HTTP method", ErrBadRequest)
	}
	u, err := url.Parse(body.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return replay.Message{}, fmt.Errorf("%w: \"url\" must be an absolute http or https URL, such as https://api.example.com/v1/orders?id=7", ErrBadRequest)
	}
	if u.User != nil || u.Fragment != "" || strings.Contains(body.URL, "#") {
		return replay.Message{}, fmt.Errorf("%w: \"url\" must not carry user information or a fragment", ErrBadRequest)
	}
	h := make(http.Header, len(body.Headers))
	for name, value := range body.Headers {
		if !isToken(name) {
			return replay.Message{}, fmt.Errorf("%w: %q is not a header name", ErrBadRequest, name)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return replay.Message{}, fmt.Errorf("%w: the value of header %q holds a line break or NUL", ErrBadRequest, name)
		}
		key := http.CanonicalHeaderKey(name)
		if _, dup := h[key]; dup {
			return replay.Message{}, fmt.Errorf("%w: header %q is given twice (names are case-insensitive); join the values with \", \"", ErrBadRequest, name)
		}
		h[key] = []string{value}
	}
	var data []byte
	if body.Body != "" {
		if data, err = base64.StdEncoding.DecodeString(body.Body); err != nil {
			return replay.Message{}, fmt.Errorf("%w: \"body\" is not standard base64", ErrBadRequest)
		}
	}
	return replay.Message{Method: body.Method, URL: u, Header: h, Body: data}, nil
}

// isToken reports whether s is an RFC 9110 token, the syntax of methods
// and header names.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0) {
			return false
		}
	}
	return true
}
