package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/replayguard/replayguard/tracing"
)

// tracingEnv are the OTEL_* variables the server reads itself; the SDK
// and the OTLP exporter read the others they document (OTEL_RESOURCE_ATTRIBUTES,
// OTEL_TRACES_SAMPLER, OTEL_EXPORTER_OTLP_HEADERS, OTEL_BSP_*, ...) from
// the process environment. README.md's configuration table lists these.
var tracingEnv = []string{
	"OTEL_TRACES_EXPORTER",
	"OTEL_EXPORTER_OTLP_ENDPOINT",
	"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL",
	"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_SERVICE_NAME",
	"OTEL_PROPAGATORS",
}

// defaultServiceName is service.name unless OTEL_SERVICE_NAME or
// OTEL_RESOURCE_ATTRIBUTES says otherwise.
const defaultServiceName = "replayguard"

// traceFlushTimeout bounds the export of the last spans on shutdown,
// after the drain (REPLAYGUARD_SHUTDOWN_TIMEOUT, 8s by default): the
// process still exits within 10s, Docker's grace period.
const traceFlushTimeout = time.Second

// newTracerProvider returns the tracer provider the OTEL_* variables ask
// for, or nil when tracing is off: with OTEL_TRACES_EXPORTER=none, and
// when neither OTEL_TRACES_EXPORTER=otlp nor an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set. Off, nothing is traced and no middleware is installed. On, spans
// go in batches to an OTLP exporter over the protocol
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL
// names: http/protobuf (the default) or grpc.
func newTracerProvider(ctx context.Context, getenv func(string) string, log *slog.Logger) (*sdktrace.TracerProvider, error) {
	switch exp := getenv("OTEL_TRACES_EXPORTER"); exp {
	case "none":
		return nil, nil
	case "otlp":
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported: set otlp or none", exp)
	}
	name, protocol := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		name, protocol = "OTEL_EXPORTER_OTLP_PROTOCOL", getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exporter sdktrace.SpanExporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		protocol = "http/protobuf"
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("%s: %q is not supported: set http/protobuf or grpc", name, protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_*: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", defaultServiceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES: later detectors win
		resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	// The SDK reports failed exports here; without a handler it would
	// write them to stderr, outside the JSON log.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry: spans not exported", "error", err.Error())
	}))
	endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	service, _ := res.Set().Value("service.name")
	log.Info("tracing: exporting spans over OTLP", "protocol", protocol, "endpoint", redactURL(endpoint), "service_name", service.AsString())
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res)), nil
}

// propagatorNames are the names OTEL_PROPAGATORS takes, for its error.
const propagatorNames = "tracecontext, baggage, b3, b3multi, jaeger, xray, ottrace or none"

// newPropagator returns the propagator of the comma-separated list in
// OTEL_PROPAGATORS (tracecontext, baggage, b3, b3multi, jaeger, xray,
// ottrace, none; spaces around a name are ignored), composed in that
// order: the last one to find a trace context in a request's headers
// wins. Unset or empty, it is tracing.Propagator(), W3C Trace Context and
// Baggage, as the OpenTelemetry SDKs default; "none" anywhere reads and
// writes no header. A name it does not know is an error, also beside
// "none", and also when tracing is off, so that a typo does not wait for
// the day tracing is turned on.
func newPropagator(getenv func(string) string) (propagation.TextMapPropagator, error) {
	var names []string
	none := false
	for name := range strings.SplitSeq(getenv("OTEL_PROPAGATORS"), ",") {
		switch name = strings.TrimSpace(name); name {
		case "":
		case "none":
			none = true
		default:
			names = append(names, name)
		}
	}
	if len(names) == 0 && !none {
		return tracing.Propagator(), nil
	}
	// autoprop.TextMapPropagator stops at the first "none", which would
	// hide an unknown name after it: check the others without it.
	p, err := autoprop.TextMapPropagator(names...)
	if err != nil {
		return nil, fmt.Errorf("OTEL_PROPAGATORS: %w: set a comma-separated list of %s", err, propagatorNames)
	}
	if none {
		return autoprop.TextMapPropagator("none")
	}
	return p, nil
}

// shutdownTracing exports the spans still buffered in tp, for at most
// traceFlushTimeout, and stops it.
func shutdownTracing(tp *sdktrace.TracerProvider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: the last spans were not exported", "error", err.Error())
	}
}

// redactURL is u without its user information and query, for logs; ""
// for "" (the exporter's default endpoint).
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || u == "" {
		return ""
	}
	p.User, p.RawQuery = nil, ""
	return p.String()
}
