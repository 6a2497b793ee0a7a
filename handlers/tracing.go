package handlers

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/tracing"
)

// WithTracerProvider gives every request the Engine serves a server span
// from tp, named for its method and route pattern ("POST
// /v1/tokens/redeem"; the method alone for a path no route matches), that
// continues the trace the request's headers carry (W3C traceparent and
// baggage, or what WithPropagator reads). Its attributes:
// http.request.method, http.route, http.response.status_code,
// replayguard.outcome and, on a problem answer, replayguard.problem_code.
// Handlers further in (the store, the gateway) find the span in the
// request's context. Defaults to nil: no middleware is installed, and the
// API's handlers (also those Register adds to an application's router)
// look for no span to set replayguard.outcome on.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(a *API) { a.tracer = tp }
}

// WithPropagator reads the trace context of incoming requests with p
// (cmd/server builds p from OTEL_PROPAGATORS). It applies only with
// WithTracerProvider: without a tracer no header is read. Defaults to
// tracing.Propagator(), W3C Trace Context and Baggage (recommended); nil
// keeps the default.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(a *API) {
		if p != nil {
			a.prop = p
		}
	}
}

// traceRequests is the middleware of WithTracerProvider: it reads the
// incoming trace context with prop.
func traceRequests(tp trace.TracerProvider, prop propagation.TextMapPropagator) gin.HandlerFunc {
	tracer := tp.Tracer(tracing.ScopeName)
	return func(c *gin.Context) {
		r := c.Request
		ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		name, route := r.Method, c.FullPath()
		attrs := []attribute.KeyValue{attribute.String("http.request.method", r.Method)}
		if route != "" {
			name += " " + route
			attrs = append(attrs, attribute.String("http.route", route))
		}
		ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		defer span.End()
		c.Request = r.WithContext(ctx)
		pw := &problemWriter{ResponseWriter: c.Writer}
		c.Writer = pw
		c.Next()

		status := pw.Status()
		span.SetAttributes(attribute.Int("http.response.status_code", status))
		if pw.code != "" {
			span.SetAttributes(tracing.ProblemCodeKey.String(pw.code), tracing.OutcomeKey.String(pw.code))
		}
		if pw.Header().Get(idempotency.ReplayedHeader) == "true" {
			span.SetAttributes(tracing.OutcomeKey.String("replayed"))
		}
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
			if e := c.Errors.Last(); e != nil {
				span.RecordError(e.Err)
			}
		}
	}
}

// problemWriter notes the problem code of a problem answer, whoever
// writes it (a handler, the gateway, a guard middleware), from the start
// of its body: problem.Write encodes the type URI, TypePrefix + code,
// first.
type problemWriter struct {
	gin.ResponseWriter
	code    string
	started bool
}

func (w *problemWriter) Write(b []byte) (int, error) {
	w.sniff(b)
	return w.ResponseWriter.Write(b)
}

func (w *problemWriter) WriteString(s string) (int, error) {
	if !w.started {
		w.sniff([]byte(s))
	}
	return w.ResponseWriter.WriteString(s)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *problemWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

var problemStart = []byte(`{"type":"` + problem.TypePrefix)

func (w *problemWriter) sniff(b []byte) {
	if w.started {
		return
	}
	w.started = true
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "application/problem+json") {
		return
	}
	rest, ok := bytes.CutPrefix(b, problemStart)
	if !ok {
		return
	}
	if i := bytes.IndexByte(rest, '"'); i > 0 && i <= 64 {
		w.code = string(rest[:i])
	}
}
