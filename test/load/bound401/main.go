// Command bound401 is the ceiling the load program (test/load) measures
// Replayguard's refusal of forged tokens against: the least a Gin service
// can do to give the answer Replayguard gives.
//
//	POST /v1/tokens/redeem  401 application/problem+json token_invalid,
//	                        whatever the request carries
//
// The answer is Replayguard's own, byte for byte but for the Date and the
// request ID: the status, the headers and the body that package problem
// writes for token.ErrInvalid (Cache-Control: no-store, Content-Type:
// application/problem+json, X-Request-Id, and net/http's Date and
// Content-Length), built once at start-up by problem.For and
// Problem.Write, as package handlers answers a forged token. Every answer
// carries the same fixed request ID, fixedRequestID, of the length of the
// ones Replayguard makes (32 hex digits), so that the body is as long as
// Replayguard's; Replayguard makes a new one per request.
//
// It uses gin.New() with no middleware (no logging, no recovery, no
// request IDs, no metrics), reads no token and has no store, so that its
// rate in forged mode, against the baseline's 204 (test/load/baseline,
// mode noop), bounds what any server that gives this answer can reach
// with this load program on this machine: the cost of carrying a 401 with
// a body rather than a bare 204, to the server and to the load program
// alike. It is a benchmark fixture, not a service: do not deploy it.
package main

import (
	"context"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/test/load/internal/fixture"
	"github.com/replayguard/replayguard/token"
)

// fixedRequestID is the X-Request-Id of every answer (and the request_id
// of its body): 32 hex digits, as long as the IDs Replayguard makes.
const fixedRequestID = "00000000000000000000000000000401"

// redeemPath is the route the load program's forged mode posts to.
const redeemPath = "/v1/tokens/redeem"

func main() {
	fixture.Main("bound401", "127.0.0.1:8091", func() http.Handler { return newRouter(forgedAnswer()) })
}

// run serves until ctx ends. onListen, when set, receives the bound
// address.
func run(ctx context.Context, addr string, onListen func(string)) error {
	return fixture.Serve(ctx, addr, newRouter(forgedAnswer()), onListen)
}

// forgedAnswer returns what Replayguard answers a forged token with,
// written once by package problem as package handlers writes it: the
// request ID set on the response first (by handlers' request-ID step),
// then problem.For(token.ErrInvalid).Write, which takes the ID into the
// body.
func forgedAnswer() fixture.Answer {
	return fixture.Problem(token.ErrInvalid, fixedRequestID)
}

// newRouter returns the one route on gin.New() without middleware. The
// header values are shared by every answer: net/http only reads them.
func newRouter(a fixture.Answer) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST(redeemPath, func(c *gin.Context) {
		a.Write(c.Writer)
	})
	return r
}
