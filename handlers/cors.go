package handlers

import (
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/problem"
)

// CORS for POST /v1/tokens: browser pages on allowlisted origins may
// issue tokens cross-origin. Only exact origins are allowed; there is no
// wildcard, and no credentials are involved.

const (
	corsAllowHeaders  = "Content-Type"
	corsExposeHeaders = "Retry-After, X-Request-ID"
	corsMaxAge        = "600"
)

// cors adds the CORS response headers to actual requests from allowed
// origins. Requests from other origins are served without them, so the
// browser withholds the response from the page. With no allowed origins
// the answer never depends on Origin, so it says nothing of it; with
// some, every answer has Vary: Origin, for caches.
func (a *API) cors(c *gin.Context) {
	if len(a.origins) == 0 {
		return
	}
	c.Writer.Header().Add("Vary", "Origin")
	if o := c.GetHeader("Origin"); o != "" && a.origins[o] {
		h := c.Writer.Header()
		h.Set("Access-Control-Allow-Origin", o)
		h.Set("Access-Control-Expose-Headers", corsExposeHeaders)
	}
}

// preflight answers OPTIONS /v1/tokens: 204 with the allow headers for an
// allowed origin asking for POST with at most Content-Type, else 403.
func (a *API) preflight(c *gin.Context) {
	h := c.Writer.Header()
	h.Add("Vary", "Origin")
	h.Add("Vary", "Access-Control-Request-Method")
	h.Add("Vary", "Access-Control-Request-Headers")
	origin := c.GetHeader("Origin")
	method := c.GetHeader("Access-Control-Request-Method")
	if origin == "" || method == "" {
		// Not a preflight: say what the resource allows.
		h.Set("Allow", "POST, OPTIONS")
		c.Status(http.StatusNoContent)
		return
	}
	if !a.origins[origin] || method != http.MethodPost || !allowedHeaders(c.GetHeader("Access-Control-Request-Headers")) {
		fail(c, problem.ErrCORSRejected)
		return
	}
	h.Set("Access-Control-Allow-Origin", origin)
	h.Set("Access-Control-Allow-Methods", "POST")
	h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
	h.Set("Access-Control-Max-Age", corsMaxAge)
	c.Status(http.StatusNoContent)
}

func allowedHeaders(list string) bool {
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name != "" && !strings.EqualFold(name, "content-type") {
			return false
		}
	}
	return true
}
