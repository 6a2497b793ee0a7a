package guard

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"strings"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
)

// WithSubject binds redemption to a subject, typically the signed-in user
// of the request's session (RequireToken, Field): a token issued for
// another subject is refused with subject_mismatch, and Field issues
// tokens bound to it. Defaults to none: tokens must be unbound.
func WithSubject(f func(*http.Request) string) Option { return func(s *settings) { s.subject = f } }

// WithRecords turns on RequireToken's record mode: the response of the one
// request that redeems a token is recorded under the token's ID in k's
// store, and a duplicate submit of the same token gets that response
// again, marked Idempotent-Replayed: true, instead of 409 token_used: for
// a form, the same 303 to the same order page.
//
// The redemption and the record are one atomic store step
// (idempotency.Keeper.RedeemToken). The response is buffered and the
// record completed before the first byte is sent, as with Idempotent (k's
// lease, retention and body cap apply; headers such as Set-Cookie are not
// replayed). A duplicate while the first request runs gets 409
// request_in_progress with Retry-After; a 5xx (see WithReleaseStatus) or a
// panic releases the record, so the token can be redeemed again by a
// retry; a response over the cap completes the record without its body,
// and duplicates get 409 response_not_stored. When the store cannot be
// reached the handler does not run: 503. A duplicate that arrives after
// the token's exp still gets the recorded response; an expired token
// without one is 401 token_expired and is never redeemed. k must keep its
// records in the store the token.Service uses: a token's record lives
// beside the token. Defaults to nil: a token is redeemed and a duplicate
// is refused with 409 token_used.
func WithRecords(k *idempotency.Keeper) Option { return func(s *settings) { s.records = k } }

type claimsKey struct{}

// TokenFrom returns the claims of the token RequireToken redeemed for the
// request ctx belongs to.
func TokenFrom(ctx context.Context) (token.Claims, bool) {
	c, ok := ctx.Value(claimsKey{}).(token.Claims)
	return c, ok
}

// RequireToken is middleware that lets a request through only with a
// token for purpose (empty means token.DefaultPurpose) that it redeems
// now, at most once per token; the claims are then in the request context
// (TokenFrom). The token comes from the Idempotency-Token header
// (token.Header), else from the idempotency_token form field
// (token.FormField) of a url-encoded or multipart body, read up to
// WithMaxBody and handed on unread, so server-rendered forms work without
// JavaScript (see Field). A request without a token is 400
// invalid_request; the token's refusals are 401, 403 or 409 (see package
// problem). With WithRecords, a duplicate of a token that was redeemed
// gets the first response again instead.
func RequireToken(tokens *token.Service, purpose string, opts ...Option) func(http.Handler) http.Handler {
	s := newSettings(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.redeem(w, r, tokens, purpose, next)
		})
	}
}

// redeem is RequireToken's core: it redeems r's token and calls next at
// most once, with the claims in the request context, or answers w itself.
// In record mode next gets a capturing writer and duplicates get the
// recorded response.
func (s *settings) redeem(w http.ResponseWriter, r *http.Request, tokens *token.Service, purpose string, next http.Handler) {
	tok, err := s.tokenOf(r)
	if err != nil {
		s.counted(w, r, err)
		return
	}
	subject := ""
	if s.subject != nil {
		subject = s.subject(r)
	}
	if s.records == nil {
		c, err := tokens.Redeem(r.Context(), tok, purpose, subject)
		if err != nil {
			s.counted(w, r, err)
			return
		}
		s.metrics.Redemption("redeemed")
		next.ServeHTTP(w, withClaims(r, c))
		return
	}
	red, err := s.records.RedeemToken(r.Context(), tokens, tok, purpose, subject, idempotency.Record)
	if red.Claims.ID != "" { // the token's record was opened or found
		problem.SetRecordKey(r.Context(), store.TokenRecordKey(red.Claims.ID))
	}
	s.countDuplicate(metrics.PolicyToken, err == nil && red.Replayed, err)
	switch {
	case err != nil:
		s.counted(w, r, err)
	case red.Replayed:
		s.metrics.Redemption("replayed")
		writeStored(w, red.Outcome)
	default:
		s.metrics.Redemption("redeemed")
		s.record(w, keeperRun{red.Run, withClaims(r, red.Claims)}, metrics.PolicyToken, s.records.MaxBody(), next)
	}
}

// counted refuses a redemption and counts it by its problem code.
func (s *settings) counted(w http.ResponseWriter, r *http.Request, err error) {
	s.metrics.Redemption(problem.Code(err))
	s.refuse(w, r, err)
}

// tokenOf returns r's token: its Idempotency-Token header, else its form
// field, from a body read within the limit and put back unread.
func (s *settings) tokenOf(r *http.Request) (string, error) {
	if tok := r.Header.Get(token.Header); tok != "" {
		return tok, nil
	}
	if r.PostForm != nil || r.MultipartForm != nil { // a handler before parsed it
		if tok := r.PostFormValue(token.FormField); tok != "" {
			return tok, nil
		}
		return "", errNoToken
	}
	body, err := request.ReadBody(r, s.maxBody)
	if err != nil {
		return "", err
	}
	if tok := formValue(r, body, token.FormField); tok != "" {
		return tok, nil
	}
	return "", errNoToken
}

var errNoToken = fmt.Errorf("%w: no token: send the %s header or the %s form field", problem.ErrBadRequest, token.Header, token.FormField)

// formValue returns the form field name of a url-encoded or multipart
// body, parsed from a copy of r so that r's body stays unread.
func formValue(r *http.Request, body []byte, name string) string {
	if len(body) == 0 {
		return ""
	}
	c := r.WithContext(r.Context())
	c.Body = io.NopCloser(bytes.NewReader(body))
	c.Form, c.PostForm, c.MultipartForm = nil, nil, nil
	v := c.PostFormValue(name)
	if c.MultipartForm != nil {
		_ = c.MultipartForm.RemoveAll()
	}
	return v
}

// withClaims returns r with claims in its context, for TokenFrom.
func withClaims(r *http.Request, claims token.Claims) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), claimsKey{}, claims))
}

var fieldTemplate = template.Must(template.New("field").Parse(
	`<input type="hidden" name="` + token.FormField + `" value="{{.}}">`))

// HiddenField renders the hidden form input that carries tok, so a
// server-rendered form works without JavaScript:
//
//	<form method="post">{{ .TokenField }} ...</form>
func HiddenField(tok string) template.HTML {
	var b strings.Builder
	_ = fieldTemplate.Execute(&b, tok) // cannot fail on a string
	return template.HTML(b.String())   // escaped by html/template
}

// Field issues a token for purpose (bound to the request's subject when
// WithSubject is given) and renders its hidden input, for a form that
// RequireToken protects with the same options.
func Field(r *http.Request, tokens *token.Service, purpose string, opts ...Option) (template.HTML, error) {
	s := newSettings(opts)
	subject := ""
	if s.subject != nil {
		subject = s.subject(r)
	}
	is, err := tokens.Issue(r.Context(), token.IssueRequest{Purpose: purpose, Subject: subject})
	if err != nil {
		return "", err
	}
	return HiddenField(is.Token), nil
}
