package handlers

import (
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"
)

// ForwardAuthPath is the token redemption endpoint for reverse proxies:
// nginx auth_request and Traefik ForwardAuth. Register serves it.
const ForwardAuthPath = "/v1/tokens/forward-auth"

// TokenIDHeader carries a redeemed token's ID: on forward-auth answers, for
// the proxy to pass upstream, and from a proxy to the protected app.
const TokenIDHeader = "Replayguard-Token-Id"

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

func (a *API) registerForwardAuth(r gin.IRoutes) {
	for _, m := range forwardAuthMethods {
		r.Handle(m, ForwardAuthPath, a.forwardAuth)
	}
}

// forwardAuth redeems the token in the Idempotency-Token header for the
// purpose (and subject) in the query, which the proxy configuration sets;
// the request body, if any, is never read. It answers 200 with
// TokenIDHeader and no body, or a problem, with its code in
// ProblemCodeHeader too, whose status forwardAuthStatus has made one that
// auth_request understands.
func (a *API) forwardAuth(c *gin.Context) {
	c.Header("Cache-Control", "no-store")
	if len(a.apiKeys) > 0 && !a.authorized(c.Request) {
		a.forwardAuthFail(c, ErrUnauthorized)
		return
	}
	tok := c.GetHeader(TokenHeader)
	if tok == "" {
		a.forwardAuthFail(c, fmt.Errorf("%w: no token: send the %s header", ErrBadRequest, TokenHeader))
		return
	}
	claims, err := a.tokens.Redeem(c.Request.Context(), tok, c.Query("purpose"), c.Query("subject"))
	if err != nil {
		a.forwardAuthFail(c, err)
		return
	}
	a.metrics.Redemption("redeemed")
	c.Header(TokenIDHeader, claims.ID)
	c.Status(http.StatusOK)
}

func (a *API) forwardAuthFail(c *gin.Context, err error) {
	p := ProblemFor(err)
	a.metrics.Redemption(p.Code)
	p.Status = forwardAuthStatus(p)
	c.Header(ProblemCodeHeader, p.Code)
	c.Abort()
	_ = c.Error(err) // the request log names the cause of a 5xx
	writeProblem(c.Writer, err, p)
}
