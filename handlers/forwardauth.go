package handlers

import (
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/token"
)

// ForwardAuthPath is the token redemption endpoint for reverse proxies:
// nginx auth_request and Traefik ForwardAuth. Register serves it.
const ForwardAuthPath = "/v1/tokens/forward-auth"

// ProblemCodeHeader carries the problem code on forward-auth refusals, for
// proxies that drop the problem body: nginx's auth_request keeps only the
// status, but auth_request_set can take this header for an error_page.
const ProblemCodeHeader = "Replayguard-Problem-Code"

// forwardAuthMethods are the methods ForwardAuthPath answers. nginx's
// auth_request subrequest is a GET, and so is Traefik's by default; with
// preserveRequestMethod Traefik, like some other proxies, asks with the
// guarded request's own method (without its body), so the write methods
// are served too.
var forwardAuthMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost,
	http.MethodPut, http.MethodPatch, http.MethodDelete,
}

// forwardAuth redeems the token in the Idempotency-Token header for the
// purpose (and subject) in the query, which the proxy configuration sets;
// the request body, if any, is never read. It answers 200 with
// token.IDHeader and no body, or a problem, with its code in
// ProblemCodeHeader too, whose status is one that auth_request
// understands (problem.Problem.ForwardAuth).
func (a *API) forwardAuth(c *gin.Context) {
	noStore(c)
	claims, err := a.forwardAuthRedeem(c)
	if err != nil {
		p := problem.For(err).ForwardAuth()
		a.metrics.Redemption(p.Code)
		c.Header(ProblemCodeHeader, p.Code)
		c.Abort()
		_ = c.Error(err) // the request log names the cause of a 5xx
		p.Write(c.Writer)
		return
	}
	a.metrics.Redemption("redeemed")
	c.Header(token.IDHeader, claims.ID)
	c.Status(http.StatusOK)
}

func (a *API) forwardAuthRedeem(c *gin.Context) (token.Claims, error) {
	if !a.allowed(c.Request) {
		return token.Claims{}, problem.ErrUnauthorized
	}
	tok := c.GetHeader(token.Header)
	if tok == "" {
		return token.Claims{}, fmt.Errorf("%w: no token: send the %s header", problem.ErrBadRequest, token.Header)
	}
	return a.tokens.Redeem(c.Request.Context(), tok, c.Query("purpose"), c.Query("subject"))
}
