package handlers

import (
	"context"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/store"
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
	keeper  *idempotency.Keeper // record mode; nil when off
	log     *slog.Logger
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

// WithGuardMetrics counts redemption outcomes in m: "redeemed",
// "replayed" (record mode) or the problem code. Defaults to nil.
func WithGuardMetrics(m *metrics.Metrics) GuardOption {
	return func(g *Guard) { g.metrics = m }
}

// WithTokenRecords turns on record mode: the response of the one request
// that redeems a token is recorded under the token's ID in k's store, and
// a duplicate submit of the same token gets that response again, marked
// Idempotent-Replayed: true, instead of 409 token_used: for a form, the
// same 303 to the same order page.
//
// The redemption and the record are one atomic store step
// (idempotency.Keeper.StartToken). The response is buffered and the record
// completed before the first byte is sent, as with IdempotencyGuard (k's
// lease, retention and body cap apply; headers such as Set-Cookie are not
// replayed). A duplicate while the first request runs gets 409
// request_in_progress with Retry-After; a 5xx or a panic releases the
// record, so the token can be redeemed again by a retry; a response over
// the cap completes the record without its body, and duplicates get 409
// response_not_stored. When the store cannot be reached the handler does
// not run: 503 store_unavailable. A duplicate that arrives after the
// token's exp still gets the recorded response; an expired token without
// one is 401 token_expired and is never redeemed. k must keep its records
// in the store the Guard's token.Service uses: a token's record lives
// beside the token. Defaults to nil: a token is redeemed and a duplicate
// is refused with 409 token_used.
func WithTokenRecords(k *idempotency.Keeper) GuardOption {
	return func(g *Guard) { g.keeper = k }
}

// WithGuardLogger sets the logger for panics in record mode and for
// records the store failed to complete or release. Defaults to
// slog.Default().
func WithGuardLogger(l *slog.Logger) GuardOption {
	return func(g *Guard) {
		if l != nil {
			g.log = l
		}
	}
}

// NewGuard returns a Guard that redeems tokens with tokens.
func NewGuard(tokens *token.Service, opts ...GuardOption) *Guard {
	g := &Guard{tokens: tokens, log: slog.Default()}
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

// Redeem takes the token from the Idempotency-Token header, else from the
// idempotency_token form field, and redeems it for purpose and the
// request's subject. Reading the form field parses the body with
// net/http's limits (10 MB url-encoded, 32 MB multipart held in memory);
// cap bodies before the Guard with http.MaxBytesHandler where that is too
// much. It does not record anything, even with WithTokenRecords: the
// middlewares do.
func (g *Guard) Redeem(r *http.Request, purpose string) (token.Claims, error) {
	tok, subject, err := g.credentials(r)
	if err != nil {
		g.count(err)
		return token.Claims{}, err
	}
	c, err := g.tokens.Redeem(r.Context(), tok, purpose, subject)
	g.count(err)
	return c, err
}

// credentials returns r's token and subject.
func (g *Guard) credentials(r *http.Request) (tok, subject string, err error) {
	tok = r.Header.Get(TokenHeader)
	if tok == "" {
		tok = r.PostFormValue(TokenField)
	}
	if tok == "" {
		return "", "", fmt.Errorf("%w: no token: send the %s header or the %s form field", ErrBadRequest, TokenHeader, TokenField)
	}
	if g.subject != nil {
		subject = g.subject(r)
	}
	return tok, subject, nil
}

// count counts one redemption attempt: redeemed when err is nil.
func (g *Guard) count(err error) {
	outcome := "redeemed"
	if err != nil {
		outcome = specFor(err).code
	}
	g.metrics.Redemption(outcome)
}

// serve is the core both middlewares share: it redeems r's token for
// purpose and calls next at most once, with the claims in the request
// context; otherwise it answers w itself. In record mode next gets a
// capturing writer and duplicates get the recorded response.
func (g *Guard) serve(w http.ResponseWriter, r *http.Request, purpose string, next func(http.ResponseWriter, *http.Request)) {
	if g.keeper == nil {
		claims, err := g.Redeem(r, purpose)
		if err != nil {
			g.refuse(w, r, err)
			return
		}
		next(w, withClaims(r, claims))
		return
	}
	tok, subject, err := g.credentials(r)
	if err != nil {
		g.count(err)
		g.refuse(w, r, err)
		return
	}
	claims, expired, err := checkForRecord(g.tokens, tok, purpose, subject)
	if err != nil {
		g.count(err)
		g.refuse(w, r, err)
		return
	}
	want := store.Token{Purpose: claims.Purpose, Subject: claims.Subject}
	var (
		run    *idempotency.Run
		stored idempotency.Outcome
		res    store.RedeemResult
	)
	if expired { // only its record may answer
		stored, res, err = g.keeper.OpenToken(r.Context(), claims.ID, want, "")
	} else {
		run, stored, res, err = g.keeper.StartToken(r.Context(), claims.ID, want)
	}
	if err == nil && res == store.Recorded {
		g.metrics.Redemption("replayed")
		writeStored(w, stored)
		return
	}
	err = redemptionError(g.tokens, claims, expired, res, err)
	g.count(err)
	if err != nil {
		g.refuse(w, r, err)
		return
	}
	recordPolicy{releases: releaseServerErrors, log: g.log}.serve(w, withClaims(r, claims), run, g.keeper.MaxBody(), next)
}

// withClaims returns r with claims in its context, for TokenFrom.
func withClaims(r *http.Request, claims token.Claims) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), claimsKey{}, claims))
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
// request context (TokenFrom) and in the Gin context under
// "replayguard.token". With WithTokenRecords, a duplicate of a token that
// was redeemed gets the first response again instead.
func (g *Guard) RequireToken(purpose string) gin.HandlerFunc {
	return func(c *gin.Context) {
		next, called := ginNext(c)
		g.serve(c.Writer, c.Request, purpose, func(w http.ResponseWriter, r *http.Request) {
			claims, _ := TokenFrom(r.Context())
			c.Set("replayguard.token", claims)
			next(w, r)
		})
		if !*called {
			c.Abort()
		}
	}
}

// RequireTokenHandler is the net/http form of RequireToken.
func (g *Guard) RequireTokenHandler(purpose string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g.serve(w, r, purpose, next.ServeHTTP)
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
