package handlers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
)

// Engine returns a Gin engine serving the token API plus GET /healthz,
// GET /readyz and (with WithMetrics) GET /metrics, with request IDs,
// request counts and durations by route (with WithMetrics),
// request logging (one JSON line per request to WithLogger's logger) and
// panic recovery, and problem answers for unknown routes and methods. The
// client IP believes X-Forwarded-For and X-Real-IP from
// WithTrustedProxies only. Gin's own debug output must be off
// (gin.SetMode with gin.ReleaseMode) for every log line to be JSON.
func (a *API) Engine() (*gin.Engine, error) {
	e := gin.New()
	if err := e.SetTrustedProxies(a.proxies); err != nil {
		return nil, fmt.Errorf("trusted proxies: %w", err)
	}
	e.HandleMethodNotAllowed = true
	if a.tracer != nil {
		e.Use(traceRequests(a.tracer)) // first, so its span covers the rest
	}
	e.Use(requestIDs())
	if a.metrics != nil {
		e.Use(countRequests(a.metrics))
	}
	e.Use(logRequests(a.log), recoverPanics(a.log))
	e.NoRoute(func(c *gin.Context) { fail(c, problem.ErrNotFound) })
	e.NoMethod(func(c *gin.Context) { fail(c, problem.ErrMethodNotAllowed) })
	a.Register(e)
	e.GET("/healthz", func(c *gin.Context) {
		c.Header("Cache-Control", "no-store")
		c.JSON(http.StatusOK, gin.H{"status": "ok"})
	})
	e.GET("/readyz", func(c *gin.Context) {
		if err := a.Ready(c.Request.Context()); err != nil {
			fail(c, err)
			return
		}
		c.Header("Cache-Control", "no-store")
		body := gin.H{"status": "ready"}
		if w := a.readyWarnings(); w != nil {
			body["warnings"] = w
		}
		c.JSON(http.StatusOK, body)
	})
	if a.metrics != nil {
		e.GET("/metrics", gin.WrapH(promhttp.HandlerFor(a.metrics.Registry, promhttp.HandlerOpts{})))
	}
	return e, nil
}

// requestIDs takes a well-formed incoming X-Request-ID or makes one, puts
// it in the request context and echoes it on the response.
func requestIDs() gin.HandlerFunc {
	return func(c *gin.Context) {
		// The canonical key, so that neither lookup canonicalises (and
		// allocates) "X-Request-ID" on every request.
		var id string
		if v := c.Request.Header[requestIDKey]; len(v) > 0 {
			id = v[0]
		}
		if !validRequestID(id) {
			id = newRequestID()
		}
		c.Writer.Header()[requestIDKey] = []string{id}
		c.Request = c.Request.WithContext(problem.WithRequestID(c.Request.Context(), id))
		c.Next()
	}
}

// requestIDKey is problem.RequestIDHeader in canonical form.
var requestIDKey = http.CanonicalHeaderKey(problem.RequestIDHeader)

// newRequestID returns 128 random bits from crypto/rand as 32 lowercase
// hex digits: an ID that tells nothing of the process or of other
// requests, and that no one can guess to tie their request to another's
// log lines. crypto/rand never fails (since Go 1.24 it crashes the
// program instead). It costs about 0.5µs a call on a 2-core CI machine
// (BenchmarkNewRequestID); a pooled 4 KiB buffer of random bytes measured
// 0.3µs, too small a gain for keeping future IDs in memory.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		b := id[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '_' || b == '.') {
			return false
		}
	}
	return true
}

// countRequests counts and times every request in
// replayguard_http_requests_total and
// replayguard_http_request_duration_seconds, by the route gin matched
// (its pattern), else the one a handler named with metrics.SetRoute (the
// gateway's), else metrics.RouteUnmatched: never the raw path.
func countRequests(m *metrics.Metrics) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		// The router has matched by now: only a request no route matched
		// (the gateway's, or a 404) needs a slot for a handler to name its
		// route in, which costs a copy of the request.
		route := c.FullPath()
		var named *string
		if route == "" {
			var ctx context.Context
			ctx, named = metrics.WithRouteSlot(c.Request.Context())
			c.Request = c.Request.WithContext(ctx)
		}
		// Deferred, so that a response aborted by a panic counts too.
		defer func() {
			if route == "" {
				route = *named
			}
			if route == "" {
				route = metrics.RouteUnmatched
			}
			m.Request(route, c.Request.Method, c.Writer.Status(), time.Since(start))
		}()
		c.Next()
	}
}

// logRequests writes one line per request. It logs the path without the
// query and never logs headers, so tokens and API keys stay out of logs.
func logRequests(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		status := c.Writer.Status()
		level := slog.LevelInfo
		attrs := [8]slog.Attr{
			slog.String("request_id", problem.RequestID(c.Request.Context())),
			slog.String("method", c.Request.Method),
			slog.String("path", c.Request.URL.Path),
			slog.Int("status", status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
			slog.String("client_ip", c.ClientIP()),
			slog.Int("bytes", c.Writer.Size()),
		}
		n := 7
		if status >= 500 {
			level = slog.LevelError
			// The cause, which the problem body never carries for a 5xx
			// (a store's address, say): store and library errors hold no
			// secrets.
			if e := c.Errors.Last(); e != nil {
				attrs[n], n = slog.String("error", e.Error()), n+1
			}
		}
		// Straight to the handler: Logger.LogAttrs would also walk the
		// stack for the caller's PC (runtime.Callers), which no line uses.
		if h := log.Handler(); h.Enabled(c.Request.Context(), level) {
			r := slog.NewRecord(time.Now(), level, "request", 0)
			r.AddAttrs(attrs[:n]...)
			_ = h.Handle(c.Request.Context(), r)
		}
	}
}

// recoverPanics turns a panic in a handler into 500 internal_error and a
// log line, instead of a dropped connection.
func recoverPanics(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.LogAttrs(c.Request.Context(), slog.LevelError, "panic",
					slog.String("request_id", problem.RequestID(c.Request.Context())),
					slog.String("panic", fmt.Sprint(v)))
				if !c.Writer.Written() {
					fail(c, problem.ErrInternal)
				}
				c.Abort()
			}
		}()
		c.Next()
	}
}
