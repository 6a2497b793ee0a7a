package gateway

import (
	"context"
	"net/http"
	"net/http/httputil"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/replayguard/replayguard/tracing"
)

// WithTracerProvider traces the gateway's requests with tp, in the span
// the request's context carries (cmd/server's engine starts one per
// request, see handlers.WithTracerProvider):
//
//   - a routed request's span is named for its method and route pattern
//     ("POST /orders"), with the pattern, without its method, as
//     http.route; a request passed through keeps its name;
//   - the request to the app gets a client span, "upstream POST", with
//     http.response.status_code, or the error when the app did not
//     answer; replayguard.outcome is forwarded;
//   - the app receives that client span as its parent in traceparent
//     (W3C Trace Context, with tracestate and baggage; or the headers of
//     WithPropagator's propagator): whatever the client sent in those
//     headers was continued by the request's span, and is replaced,
//     never passed on.
//
// Defaults to nil: no span is started and the headers pass through as
// the client sent them.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(g *Gateway) {
		if tp != nil {
			g.tracer = tp.Tracer(tracing.ScopeName)
		}
	}
}

// WithPropagator writes the upstream span's context into the request to
// the app with p, in place of the client's copies of p's headers
// (cmd/server builds p from OTEL_PROPAGATORS, and gives the same one to
// handlers.WithPropagator). Headers of other formats pass through as the
// client sent them. It applies only with WithTracerProvider. Defaults to
// tracing.Propagator(), W3C Trace Context and Baggage (recommended); nil
// keeps the default.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(g *Gateway) {
		if p != nil {
			g.prop = p
		}
	}
}

// traceProxy makes g's proxy inject the upstream span into the request
// to the app and record the app's answer on it.
func (g *Gateway) traceProxy() {
	rewrite, modify, fail := g.proxy.Rewrite, g.proxy.ModifyResponse, g.proxy.ErrorHandler
	prop := g.prop
	g.proxy.Rewrite = func(pr *httputil.ProxyRequest) {
		rewrite(pr)
		for _, f := range prop.Fields() {
			pr.Out.Header.Del(f)
		}
		prop.Inject(pr.Out.Context(), propagation.HeaderCarrier(pr.Out.Header))
	}
	g.proxy.ModifyResponse = func(resp *http.Response) error {
		span := trace.SpanFromContext(resp.Request.Context())
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 500 {
			span.SetStatus(codes.Error, http.StatusText(resp.StatusCode))
		}
		return modify(resp)
	}
	g.proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		span := trace.SpanFromContext(r.Context())
		span.RecordError(err)
		if bodyError(r) != nil {
			span.SetStatus(codes.Error, "request body not read from the client")
		} else {
			span.SetStatus(codes.Error, "upstream unavailable")
		}
		fail(w, r, err)
	}
}

// nameSpan names the span of r, routed by pattern, for the route.
func (g *Gateway) nameSpan(r *http.Request, pattern string) {
	span := trace.SpanFromContext(r.Context())
	if !span.IsRecording() {
		return
	}
	route := pattern
	if m := patternMethod(pattern); m != "" {
		route = strings.TrimLeft(pattern[len(m):], " \t")
	}
	span.SetName(r.Method + " " + route)
	span.SetAttributes(attribute.String("http.route", route))
}

// startUpstream starts the client span of r's request to the app, and
// returns its context and the function that ends it.
func (g *Gateway) startUpstream(ctx context.Context, r *http.Request) (context.Context, func()) {
	tracing.SetOutcome(ctx, "forwarded")
	ctx, span := g.tracer.Start(ctx, "upstream "+r.Method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("server.address", g.upstream.Hostname()),
		))
	return ctx, func() { span.End() }
}
