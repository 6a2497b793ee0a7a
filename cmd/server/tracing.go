package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
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
