package guard

import (
	"bufio"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/internal/request"
)

// Gin turns net/http middleware, such as this package's, into Gin
// middleware: the rest of the Gin chain runs as mw's next handler, at
// most once, with the request and writer mw gives it; when mw answers
// itself, the chain is aborted. The request mw sees carries gin's matched
// route as its Pattern and gin's ClientIP as its client IP (call
// SetTrustedProxies on your router: gin believes X-Forwarded-For from
// every peer by default).
//
//	r.POST("/orders", guard.Gin(guard.Idempotent(keeper)), createOrder)
func Gin(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		called := false
		orig := c.Writer
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			called = true
			c.Request = r
			if w == http.ResponseWriter(orig) {
				c.Next()
				return
			}
			gw := &ginWriter{w: w, orig: orig, status: http.StatusOK, size: -1}
			c.Writer = gw
			defer func() { c.Writer = orig }()
			c.Next()
			gw.WriteHeaderNow() // as gin does when its chain ends, for a status without a body
		})
		r := request.WithClientIP(c.Request, c.ClientIP())
		if r.Pattern == "" {
			r.Pattern = c.FullPath()
		}
		mw(next).ServeHTTP(orig, r)
		if !called {
			c.Abort()
		}
	}
}

// ginWriter is a gin.ResponseWriter over the writer a middleware handed
// on (one that records the response, say). As with gin's own writer, the
// status is held until the body starts, so a later WriteHeader wins until
// then.
type ginWriter struct {
	w      http.ResponseWriter
	orig   gin.ResponseWriter
	status int
	size   int // -1 until the status is sent
}

var _ gin.ResponseWriter = (*ginWriter)(nil)

func (g *ginWriter) Header() http.Header { return g.w.Header() }

// WriteHeader holds code until the body starts; informational statuses
// other than 101 go out at once.
func (g *ginWriter) WriteHeader(code int) {
	switch {
	case code >= 100 && code < 200 && code != http.StatusSwitchingProtocols:
		g.w.WriteHeader(code)
	case code > 0 && !g.Written():
		g.status = code
	}
}

func (g *ginWriter) WriteHeaderNow() {
	if !g.Written() {
		g.size = 0
		g.w.WriteHeader(g.status)
	}
}

func (g *ginWriter) Write(p []byte) (int, error) {
	g.WriteHeaderNow()
	n, err := g.w.Write(p)
	g.size += n
	return n, err
}

func (g *ginWriter) WriteString(s string) (int, error) { return g.Write([]byte(s)) }

func (g *ginWriter) Status() int { return g.status }

func (g *ginWriter) Size() int { return g.size }

func (g *ginWriter) Written() bool { return g.size != -1 }

func (g *ginWriter) Flush() {
	g.WriteHeaderNow()
	_ = http.NewResponseController(g.w).Flush()
}

func (g *ginWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(g.w).Hijack()
}

func (g *ginWriter) CloseNotify() <-chan bool { return g.orig.CloseNotify() }

func (g *ginWriter) Pusher() http.Pusher { return nil }

// Unwrap returns the writer the middleware handed on, for
// http.ResponseController and AbandonRecord.
func (g *ginWriter) Unwrap() http.ResponseWriter { return g.w }
