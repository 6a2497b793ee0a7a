package handlers

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/replayguard/replayguard/internal/logjson"
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
		e.Use(traceRequests(a.tracer, a.prop)) // first, so its span covers the rest
	}
	e.Use(observe(a.metrics, a.log, a.tracer != nil))
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

// observe is the middleware every request goes through first (after
// tracing's): it gives the request its ID, turns a panic in a handler into
// 500 internal_error, and then counts, times and logs the request. One
// middleware rather than four, so that a request reads the clock twice,
// copies its *http.Request once and pays one deferred call. traced says
// that tracing's middleware runs before it: only then does the log line
// look for a span.
func observe(m *metrics.Metrics, log *slog.Logger, traced bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		ctx := problem.WithRequestID(c.Request.Context(), requestIDs(c))
		// The router has matched by now: only a request no route matched
		// (the gateway's, or a 404) needs a slot for a handler to name its
		// route in.
		route := c.FullPath()
		var named *string
		if m != nil && route == "" {
			ctx, named = metrics.WithRouteSlot(ctx)
		}
		c.Request = c.Request.WithContext(ctx)
		// Deferred, so that a request whose handler panicked is answered,
		// counted and logged too.
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					// net/http's way to abort the response: counted, not
					// logged, and passed on for net/http to drop the
					// connection quietly.
					countRequests(m, c, route, named, time.Since(start))
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
			end := time.Now()
			countRequests(m, c, route, named, end.Sub(start))
			logRequests(log, c, end, end.Sub(start), traced)
		}()
		c.Next()
	}
}

// requestIDs takes a well-formed incoming X-Request-ID or makes one,
// echoes it on the response and returns it.
func requestIDs(c *gin.Context) string {
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
	return id
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

// countRequests counts and times a request in
// replayguard_http_requests_total and
// replayguard_http_request_duration_seconds (when m is not nil), by the
// route gin matched (its pattern), else the one a handler named with
// metrics.SetRoute in named (the gateway's), else metrics.RouteUnmatched:
// never the raw path.
func countRequests(m *metrics.Metrics, c *gin.Context, route string, named *string, d time.Duration) {
	if m == nil {
		return
	}
	if route == "" && named != nil {
		route = *named
	}
	if route == "" {
		route = metrics.RouteUnmatched
	}
	m.Request(route, c.Request.Method, c.Writer.Status(), d)
}

// logRequests writes a request's line, stamped end, with its duration d.
// It logs the path without the query and never logs headers, so tokens
// and API keys stay out of logs. A request that opened or found an
// idempotency record (problem.SetRecordKey, which guard and the token
// API call) carries its record_id, which an operator looks up. When traced (WithTracerProvider) and the
// request's context holds a valid span context, the line carries its
// trace_id and span_id: the server span's, for joining logs and traces;
// untraced, no span is looked for. The server's handler (logjson) takes
// the line without a slog.Record; any other gets the same record.
func logRequests(log *slog.Logger, c *gin.Context, end time.Time, d time.Duration, traced bool) {
	status := c.Writer.Status()
	level := slog.LevelInfo
	if status >= 500 {
		level = slog.LevelError
	}
	ctx := c.Request.Context()
	h := log.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	line := logjson.Request{
		Time:       end,
		Level:      level,
		RequestID:  problem.RequestID(ctx),
		Method:     c.Request.Method,
		Path:       c.Request.URL.Path,
		Status:     status,
		DurationMS: float64(d.Microseconds()) / 1000,
		ClientIP:   c.ClientIP(),
		Bytes:      c.Writer.Size(),
		RecordID:   problem.RecordID(ctx),
	}
	if traced {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			line.TraceID, line.SpanID = sc.TraceID(), sc.SpanID()
		}
	}
	if status >= 500 {
		// The cause, which the problem body never carries for a 5xx (a
		// store's address, say): store and library errors hold no
		// secrets.
		if e := c.Errors.Last(); e != nil {
			line.Err = e // its text, even empty, as "error"
		}
	}
	if lh, ok := h.(*logjson.Handler); ok {
		_ = lh.LogRequest(ctx, line)
		return
	}
	_ = h.Handle(ctx, line.Record())
}
