package guard

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
)

// WithScheme fixes the scheme of the target URI RequireSignature checks
// the signature against ("https" or "http"), for applications behind a
// proxy that terminates TLS: clients sign the URI they call, https://…,
// while the application sees plain HTTP. Defaults to "https" when the
// request came over TLS (r.TLS is set) and "http" otherwise;
// X-Forwarded-Proto is never believed, since any client could send it.
func WithScheme(scheme string) Option {
	return func(s *settings) { s.scheme = strings.ToLower(scheme) }
}

// WithAuthority fixes the authority (host and, when not the default,
// port) of the target URI RequireSignature checks the signature against,
// for applications behind a proxy that rewrites the Host header. Defaults
// to the request's Host header (r.Host), which the client chooses: when
// other services accept the same client keys but keep their nonces in
// another store, set your public host here (recommended), so a request
// signed for one of them cannot be replayed to this one with a forged
// Host.
func WithAuthority(authority string) Option { return func(s *settings) { s.authority = authority } }

type signatureKey struct{}

// SignatureFrom returns the verified signature of the request ctx belongs
// to: its key ID, label, created time and nonce.
func SignatureFrom(ctx context.Context) (replay.Result, bool) {
	res, ok := ctx.Value(signatureKey{}).(replay.Result)
	return res, ok
}

// RequireSignature is middleware that lets a request through only when
// its signature (HTTP Message Signatures, RFC 9421) verifies with v now,
// inside its window, and its nonce was never seen; the replay.Result is
// then in the request context (SignatureFrom). An unsigned request is
// refused (401 signature_missing) before its body is read. Otherwise the
// body is read (at most WithMaxBody; a longer one is 413
// payload_too_large) so its content digest can be checked, and handed on
// intact. The target URI is the scheme (see WithScheme), the authority
// (r.Host, see WithAuthority) and the path and query exactly as the
// client sent them in the request line, so routers that rewrite
// r.URL.Path (such as http.StripPrefix) do not break signatures.
func RequireSignature(v *replay.Verifier, opts ...Option) func(http.Handler) http.Handler {
	s := newSettings(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			res, err := s.verify(r, v)
			if err != nil {
				s.metrics.SignatureVerification(problem.Code(err))
				s.refuse(w, r, err)
				return
			}
			s.metrics.SignatureVerification("verified")
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), signatureKey{}, res)))
		})
	}
}

func (s *settings) verify(r *http.Request, v *replay.Verifier) (replay.Result, error) {
	if len(r.Header.Values("Signature-Input")) == 0 || len(r.Header.Values("Signature")) == 0 {
		return replay.Result{}, replay.ErrMissing // before reading a body for nothing
	}
	body, err := request.ReadBody(r, s.maxBody)
	if err != nil {
		return replay.Result{}, err
	}
	scheme := s.scheme
	if scheme == "" {
		scheme = "http"
		if r.TLS != nil {
			scheme = "https"
		}
	}
	authority := s.authority
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
	return v.Verify(r.Context(), replay.Message{Method: r.Method, URL: target, Header: r.Header, Body: body})
}
