// Package tracing holds what Replayguard's OpenTelemetry spans share: the
// instrumentation scope, the default propagator (W3C Trace Context and
// Baggage), the replayguard.* attribute keys, and Store, a store.Store
// decorator that gives every store call a child span.
//
// It depends on the OpenTelemetry API only. The server builds the SDK's
// TracerProvider from the OTEL_* variables (cmd/server) and hands it to
// handlers.WithTracerProvider, gateway.WithTracerProvider and Store, and
// the propagators OTEL_PROPAGATORS names to handlers.WithPropagator and
// gateway.WithPropagator; when tracing is off it hands them nothing, so no
// span is ever started and no trace header is read or written.
//
//	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter))
//	st := tracing.Store(memory.New(), tp)
//	// st.Redeem(ctx, ...) now records a "store.redeem" span, a child of
//	// ctx's span.
package tracing
