package handlers

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/token"
)

// Guard protects an application's own routes with single-use tokens. One
// core function serves both the Gin and the net/http middleware. Create it
// with NewGuard.
type Guard struct {
	tokens  *token.Service
	subject func(*http.Request) string
	onError http.Handler
	metrics *metrics.Metrics
}

// GuardOption configures a Guard.
type GuardOption func(*Guard)

// WithSubjectFunc binds redemption to a subject, typically the signed-in
// user of the request's session: a token issued for another subject is
// refused with subject_mismatch. Defaults to none: tokens must be unbound.
func WithSubjectFunc(f func(*http.Request) string) GuardOption {
	return func(g *Guard) { g.subject = f }
}

// WithErrorHandler replaces the problem+json answer to a refused request,
// so HTML apps can render their own page. The handler finds the reason
// with FailureReason(r) and the status with ProblemFor. Defaults to
// writing the problem JSON.
func WithErrorHandler(h http.Handler) GuardOption {
	return func(g *Guard) { g.onError = h }
}

// WithGuardMetrics counts redemption outcomes in m. Defaults to nil.
func WithGuardMetrics(m *metrics.Metrics) GuardOption {
	return func(g *Guard) { g.metrics = m }
}

// NewGuard returns a Guard that redeems tokens with tokens.
func NewGuard(tokens *token.Service, opts ...GuardOption) *Guard {
	g := &Guard{tokens: tokens}
	for _, o := range opts {
		o(g)
	}
	return g
}

type (
	claimsKey  struct{}
	failureKey struct{}
)

// TokenFrom returns the claims of the token redeemed for the request ctx
// belongs to.
func TokenFrom(ctx context.Context) (token.Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(token.Claims)
	return c, ok
}

// FailureReason returns why the Guard refused r, inside an error handler
// set with WithErrorHandler. Compare it with errors.Is against token's
// sentinels.
func FailureReason(r *http.Request) error {
	err, _ := r.Context().Value(failureKey{}).(error)
	return err
}

// Redeem is the core both middlewares share: it takes the token from the
// Idempotency-Token header, else from the idempotency_token form field,
// and redeems it for purpose and the request's subject. Reading the form
// field parses the body with net/http's limits (10 MB url-encoded, 32 MB
// multipart held in memory); cap bodies before the Guard with
// http.MaxBytesHandler where that is too much.
func (g *Guard) Redeem(r *http.Request, purpose string) (token.Claims, error) {
	tok := r.Header.Get(TokenHeader)
	if tok == "" {
		tok = r.PostFormValue(TokenField)
	}
	if tok == "" {
		return token.Claims{}, fmt.Errorf("%w: no token: send the %s header or the %s form field", ErrBadRequest, TokenHeader, TokenField)
	}
	subject := ""
	if g.subject != nil {
		subject = g.subject(r)
	}
	c, err := g.tokens.Redeem(r.Context(), tok, purpose, subject)
	outcome := "redeemed"
	if err != nil {
		outcome = specFor(err).code
	}
	g.metrics.Redemption(outcome)
	return c, err
}

func (g *Guard) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if g.onError == nil {
		WriteProblem(w, r, err)
		return
	}
	g.onError.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), failureKey{}, err)))
}

// RequireToken is Gin middleware that lets a request through only with a
// token for purpose that it redeems now; the claims are then in the
// request context (TokenFrom) and in the Gin context under "replayguard.token".
func (g *Guard) RequireToken(purpose string) gin.HandlerFunc {
	return func(c *gin.Context) {
		claims, err := g.Redeem(c.Request, purpose)
		if err != nil {
			c.Abort()
			g.refuse(c.Writer, c.Request, err)
			return
		}
		c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), claimsKey{}, claims))
		c.Set("replayguard.token", claims)
		c.Next()
	}
}

// RequireTokenHandler is the net/http form of RequireToken.
func (g *Guard) RequireTokenHandler(purpose string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			claims, err := g.Redeem(r, purpose)
			if err != nil {
				g.refuse(w, r, err)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), claimsKey{}, claims)))
		})
	}
}

var fieldTemplate = template.Must(template.New("field").Parse(
	`<input type="hidden" name="` + TokenField + `" value="{{.}}">`))

// HiddenField renders the hidden form input that carries tok, so a
// server-rendered form works without JavaScript:
//
//	<form method="post">{{ .TokenField }} ...</form>
func HiddenField(tok string) template.HTML {
	var b strings.Builder
	_ = fieldTemplate.Execute(&b, tok) // cannot fail on a string
	return template.HTML(b.String())   // escaped by html/template
}

// Field issues a token for purpose (bound to the request's subject when a
// subject function is set) and renders its hidden input.
func (g *Guard) Field(r *http.Request, purpose string) (template.HTML, error) {
	subject := ""
	if g.subject != nil {
		subject = g.subject(r)
	}
	is, err := g.tokens.Issue(r.Context(), token.IssueRequest{Purpose: purpose, Subject: subject})
	if err != nil {
		return "", err
	}
	return HiddenField(is.Token), nil
}
