package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of every Replayguard span.
const ScopeName = "github.com/replayguard/replayguard"

// Attribute keys of Replayguard's own span attributes. The HTTP ones
// follow OpenTelemetry's semantic conventions (http.route,
// http.request.method, http.response.status_code, ...).
const (
	// OutcomeKey is what became of a request: the endpoint's outcome
	// (issued, redeemed, completed, released, verified), replayed for a
	// stored response served again, forwarded for a request passed to the
	// app behind the gateway, or the problem code it was refused with.
	OutcomeKey = attribute.Key("replayguard.outcome")
	// ProblemCodeKey is the problem code of a problem answer
	// (token_used, say).
	ProblemCodeKey = attribute.Key("replayguard.problem_code")
)

// propagator is W3C Trace Context plus W3C Baggage.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Propagator returns the default propagator of incoming and outgoing
// requests: W3C Trace Context (traceparent, tracestate) and W3C Baggage,
// what OTEL_PROPAGATORS means when it is unset. handlers.WithPropagator
// and gateway.WithPropagator replace it (cmd/server passes them the
// propagators OTEL_PROPAGATORS names).
func Propagator() propagation.TextMapPropagator { return propagator }

// SetOutcome records outcome as OutcomeKey on ctx's span, when a span
// there records: without tracing it costs a context lookup.
func SetOutcome(ctx context.Context, outcome string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(OutcomeKey.String(outcome))
	}
}
