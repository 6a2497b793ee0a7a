package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gin-gonic/gin"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/tracing"
)

// Trace and span IDs of the client's traceparent in the tests below.
const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	traceparent   = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// TestTracingInMemory wires the server's pieces as run does with tracing
// on (the store decorator, the engine's middleware, the gateway) around
// an in-memory span recorder, and checks the spans of the API and of
// the gateway, and what the app behind the gateway receives.
func TestTracingInMemory(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))

	// The app notes the trace context it receives.
	var mu sync.Mutex
	var appGot []trace.SpanContext
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := tracing.Propagator().Extract(context.Background(), propagation.HeaderCarrier(r.Header))
		mu.Lock()
		appGot = append(appGot, trace.SpanContextFromContext(ctx))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":1}`))
	})
	engine := tracedEngine(t, tp, tracing.Propagator(), app)

	do := func(method, path, body string, header ...string) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		for i := 0; i < len(header); i += 2 {
			r.Header.Set(header[i], header[i+1])
		}
		w := httptest.NewRecorder()
		engine.ServeHTTP(w, r)
		return w
	}
	// spans returns the spans ended since the last call, by name.
	seen := 0
	spans := func() map[string]sdktrace.ReadOnlySpan {
		ended := rec.Ended()
		out := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range ended[seen:] {
			out[s.Name()] = s
		}
		seen = len(ended)
		return out
	}

	w := do("POST", "/v1/tokens", `{"purpose":"checkout"}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("issue = %d %s", w.Code, w.Body)
	}
	var issued struct{ Token string }
	_ = json.Unmarshal(w.Body.Bytes(), &issued)
	got := spans()
	issue := got["POST /v1/tokens"]
	if issue == nil {
		t.Fatalf("no span POST /v1/tokens among %v", names(got))
	}
	wantAttrs(t, issue, map[string]any{
		"http.route": "/v1/tokens", "http.request.method": "POST", "http.response.status_code": int64(201),
		"replayguard.outcome": "issued",
	})
	if issue.SpanKind() != trace.SpanKindServer {
		t.Errorf("the request's span is %v, want server", issue.SpanKind())
	}
	if put := got["store.put"]; put == nil || put.Parent().SpanID() != issue.SpanContext().SpanID() {
		t.Errorf("no store.put span under the request's span among %v", names(got))
	}

	t.Run("a refused request carries its problem code and continues the client's trace", func(t *testing.T) {
		for range 2 {
			w = do("POST", "/v1/tokens/redeem", `{"purpose":"checkout","token":"`+issued.Token+`"}`, "traceparent", traceparent)
		}
		if w.Code != http.StatusConflict {
			t.Fatalf("second redeem = %d %s", w.Code, w.Body)
		}
		got := spans()
		redeem := got["POST /v1/tokens/redeem"]
		if redeem == nil {
			t.Fatalf("no span POST /v1/tokens/redeem among %v", names(got))
		}
		wantAttrs(t, redeem, map[string]any{
			"http.route": "/v1/tokens/redeem", "http.response.status_code": int64(409),
			"replayguard.outcome": "token_used", "replayguard.problem_code": "token_used",
		})
		if id := redeem.SpanContext().TraceID().String(); id != clientTraceID {
			t.Errorf("trace %s, want the client's %s", id, clientTraceID)
		}
		if id := redeem.Parent().SpanID().String(); id != clientSpanID || !redeem.Parent().IsRemote() {
			t.Errorf("parent %s, want the client's remote span %s", id, clientSpanID)
		}
		if s := got["store.redeem"]; s == nil || s.Parent().SpanID() != redeem.SpanContext().SpanID() {
			t.Errorf("no store.redeem span under the request's span among %v", names(got))
		}
	})

	t.Run("the gateway names its span for the route and the app continues the trace under the upstream span", func(t *testing.T) {
		w := do("POST", "/orders/42", `{}`, "Idempotency-Key", `"k1"`, "traceparent", traceparent)
		if w.Code != http.StatusCreated {
			t.Fatalf("order = %d %s", w.Code, w.Body)
		}
		got := spans()
		server := got["POST /orders/{id}"]
		if server == nil {
			t.Fatalf("no span named for the route among %v", names(got))
		}
		wantAttrs(t, server, map[string]any{
			"http.route": "/orders/{id}", "http.response.status_code": int64(201), "replayguard.outcome": "forwarded",
		})
		up := got["upstream POST"]
		if up == nil || up.Parent().SpanID() != server.SpanContext().SpanID() || up.SpanKind() != trace.SpanKindClient {
			t.Fatalf("no upstream client span under the request's span among %v", names(got))
		}
		wantAttrs(t, up, map[string]any{"http.response.status_code": int64(201)})
		if s := got["store.acquire"]; s == nil || s.Parent().SpanID() != server.SpanContext().SpanID() {
			t.Errorf("no store.acquire span under the request's span among %v", names(got))
		}
		mu.Lock()
		defer mu.Unlock()
		if len(appGot) != 1 {
			t.Fatalf("the app got %d requests", len(appGot))
		}
		if appGot[0].TraceID().String() != clientTraceID {
			t.Errorf("the app got trace %s, want the client's %s", appGot[0].TraceID(), clientTraceID)
		}
		if appGot[0].SpanID() != up.SpanContext().SpanID() {
			t.Errorf("the app's parent is %s, want the gateway's upstream span %s (the client's was %s)",
				appGot[0].SpanID(), up.SpanContext().SpanID(), clientSpanID)
		}
	})

	t.Run("a path no route matches is named for its method alone, never its path", func(t *testing.T) {
		for _, c := range []struct{ path, outcome, code string }{
			{"/v1/nope/secret-123", "not_found", "not_found"}, // Replayguard's own paths are never forwarded
			{"/static/secret-123", "forwarded", ""},           // passed through to the app
		} {
			do("GET", c.path, "")
			got := spans()
			s := got["GET"]
			if s == nil {
				t.Fatalf("GET %s: no span named GET among %v", c.path, names(got))
			}
			want := map[string]any{"replayguard.outcome": c.outcome}
			if c.code != "" {
				want["replayguard.problem_code"] = c.code
			}
			wantAttrs(t, s, want)
			for _, kv := range s.Attributes() {
				if kv.Key == "http.route" || strings.Contains(kv.Value.Emit(), "secret-123") {
					t.Errorf("GET %s: attribute %s = %s", c.path, kv.Key, kv.Value.Emit())
				}
			}
		}
	})

	t.Run("a replay is traced as replayed, without an upstream span", func(t *testing.T) {
		w := do("POST", "/orders/42", `{}`, "Idempotency-Key", `"k1"`)
		if w.Code != http.StatusCreated || w.Header().Get(idempotency.ReplayedHeader) != "true" {
			t.Fatalf("retry = %d %v", w.Code, w.Header())
		}
		got := spans()
		wantAttrs(t, got["POST /orders/{id}"], map[string]any{"replayguard.outcome": "replayed"})
		if got["upstream POST"] != nil {
			t.Error("a replay reached the app")
		}
	})
}

// tracedEngine wires the server's pieces as run does with tracing on,
// with tp and prop: the store decorator around a memory store, the
// engine's middleware, and the gateway to app, whose one route is POST
// /orders/{id} with an Idempotency-Key.
func tracedEngine(t *testing.T, tp trace.TracerProvider, prop propagation.TextMapPropagator, app http.Handler) *gin.Engine {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	mem := memory.New()
	t.Cleanup(func() { _ = mem.Close() })
	st := tracing.Store(mem, tp)
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := token.New(st, []token.Key{key}, token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	keeper := idempotency.New(st)
	srv := httptest.NewServer(app)
	t.Cleanup(srv.Close)
	upstream, _ := url.Parse(srv.URL)

	engine, err := handlers.New(svc, handlers.WithTracerProvider(tp), handlers.WithPropagator(prop),
		handlers.WithRecords(keeper), handlers.WithLogger(slog.New(slog.DiscardHandler))).Engine()
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(upstream, []gateway.Route{{Match: "POST /orders/{id}", Policy: gateway.PolicyIdempotencyKey}},
		gateway.WithKeeper(keeper), gateway.WithTracerProvider(tp), gateway.WithPropagator(prop))
	if err != nil {
		t.Fatal(err)
	}
	engine.NoRoute(serveGateway(gw))
	return engine
}

// wantAttrs checks that span has each attribute of want with its value.
func wantAttrs(t *testing.T, span sdktrace.ReadOnlySpan, want map[string]any) {
	t.Helper()
	if span == nil {
		t.Error("no span")
		return
	}
	have := map[attribute.Key]attribute.Value{}
	for _, kv := range span.Attributes() {
		have[kv.Key] = kv.Value
	}
	for k, v := range want {
		got, ok := have[attribute.Key(k)]
		if !ok {
			t.Errorf("%s: no attribute %s", span.Name(), k)
		} else if got.AsInterface() != v {
			t.Errorf("%s: %s = %v, want %v", span.Name(), k, got.AsInterface(), v)
		}
	}
}

func names(spans map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for n := range spans {
		out = append(out, n)
	}
	return out
}

// TestTracingOTLP runs the server configured only by OTEL_* variables
// against an OTLP/HTTP receiver and checks that the spans of a request
// arrive, in the batch the server flushes on SIGTERM, continuing the
// trace of the client's header (traceparent by default, b3 with
// OTEL_PROPAGATORS=b3), and that the request's log line names the span.
func TestTracingOTLP(t *testing.T) {
	for _, c := range []struct {
		name          string
		env           []string
		header, value string
	}{
		{"W3C traceparent by default", nil, "traceparent", traceparent},
		{"b3 with OTEL_PROPAGATORS=b3", []string{"OTEL_PROPAGATORS=b3"}, "b3", clientTraceID + "-" + clientSpanID + "-1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			received := make(chan *coltracepb.ExportTraceServiceRequest, 16)
			recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
					http.NotFound(w, r)
					return
				}
				var body io.Reader = r.Body
				if r.Header.Get("Content-Encoding") == "gzip" {
					zr, err := gzip.NewReader(r.Body)
					if err != nil {
						http.Error(w, err.Error(), http.StatusBadRequest)
						return
					}
					body = zr
				}
				data, err := io.ReadAll(body)
				req := &coltracepb.ExportTraceServiceRequest{}
				if err == nil {
					err = proto.Unmarshal(data, req)
				}
				if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
					http.Error(w, "not an OTLP protobuf export", http.StatusBadRequest)
					return
				}
				received <- req
				out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
				w.Header().Set("Content-Type", "application/x-protobuf")
				_, _ = w.Write(out)
			}))
			t.Cleanup(recv.Close)

			cmd, addr, out := server(t, append(c.env,
				"OTEL_EXPORTER_OTLP_ENDPOINT="+recv.URL,
				"OTEL_BSP_SCHEDULE_DELAY=60000", // only the shutdown's flush sends them
			)...)
			out.waitForLog(t, 0, "tracing: exporting spans over OTLP")
			req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/tokens", strings.NewReader(`{"purpose":"checkout"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(c.header, c.value)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("issue = %d", resp.StatusCode)
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
			}

			spans := map[string]*tracepb.Span{}
			var service string
			for more := true; more; {
				select {
				case r := <-received:
					for _, rs := range r.ResourceSpans {
						for _, kv := range rs.GetResource().GetAttributes() {
							if kv.Key == "service.name" {
								service = kv.Value.GetStringValue()
							}
						}
						for _, ss := range rs.ScopeSpans {
							for _, s := range ss.Spans {
								spans[s.Name] = s
							}
						}
					}
				default:
					more = false
				}
			}
			if service != defaultServiceName {
				t.Errorf("service.name %q, want %q", service, defaultServiceName)
			}
			issue, put := spans["POST /v1/tokens"], spans["store.put"]
			if issue == nil || put == nil {
				t.Fatalf("spans received: %v, want POST /v1/tokens and store.put\n%s", slices.Collect(maps.Keys(spans)), out.String())
			}
			if got := hex.EncodeToString(issue.TraceId); got != clientTraceID {
				t.Errorf("trace %s, want the client's %s", got, clientTraceID)
			}
			if got := hex.EncodeToString(issue.ParentSpanId); got != clientSpanID {
				t.Errorf("parent %s, want the client's %s", got, clientSpanID)
			}
			if !bytes.Equal(put.ParentSpanId, issue.SpanId) {
				t.Error("store.put is not a child of the request's span")
			}
			// The request's log line names the span it was exported as.
			line := out.waitForLog(t, 0, "request")
			if line["trace_id"] != hex.EncodeToString(issue.TraceId) || line["span_id"] != hex.EncodeToString(issue.SpanId) {
				t.Errorf("the request line has trace_id %v span_id %v, want the exported span's %x %x", line["trace_id"], line["span_id"], issue.TraceId, issue.SpanId)
			}
			attrs := map[string]any{}
			for _, kv := range issue.Attributes {
				switch v := kv.Value.Value.(type) {
				case *commonpb.AnyValue_StringValue:
					attrs[kv.Key] = v.StringValue
				case *commonpb.AnyValue_IntValue:
					attrs[kv.Key] = v.IntValue
				}
			}
			for k, v := range map[string]any{"http.route": "/v1/tokens", "replayguard.outcome": "issued", "http.response.status_code": int64(201)} {
				if attrs[k] != v {
					t.Errorf("POST /v1/tokens: %s = %v, want %v", k, attrs[k], v)
				}
			}

		})
	}
}

func TestTracingSettings(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		on   bool
		err  string
	}{
		{"off when nothing is set", nil, false, ""},
		{"off with OTEL_TRACES_EXPORTER=none, even with an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false, ""},
		{"an endpoint turns it on", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, ""},
		{"a traces endpoint turns it on", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, ""},
		{"OTEL_TRACES_EXPORTER=otlp turns it on", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, ""},
		{"grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, true, ""},
		{"the traces protocol wins", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "bogus", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, true, ""},
		{"an unknown exporter stops the server", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER"},
		{"an unknown protocol stops the server", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			getenv := func(k string) string { return c.env[k] }
			tp, err := newTracerProvider(context.Background(), getenv, slog.New(slog.DiscardHandler))
			if tp != nil {
				defer shutdownTracing(tp, slog.New(slog.DiscardHandler))
			}
			switch {
			case c.err != "":
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one naming %s", err, c.err)
				}
			case err != nil:
				t.Fatal(err)
			case (tp != nil) != c.on:
				t.Fatalf("tracing on = %v, want %v", tp != nil, c.on)
			}
		})
	}
}

func TestPropagatorSettings(t *testing.T) {
	w3c := []string{"traceparent", "tracestate", "baggage"}
	cases := []struct {
		name   string
		value  string
		fields []string // the headers it writes, in any order
		err    bool
	}{
		{"unset: W3C Trace Context and Baggage", "", w3c, false},
		{"spaces alone are unset", " ", w3c, false},
		{"tracecontext,baggage is the default spelled out", "tracecontext,baggage", w3c, false},
		{"b3 is the single header", "b3", []string{"b3"}, false},
		{"b3multi then tracecontext", "b3multi,tracecontext", []string{"x-b3-traceid", "x-b3-spanid", "x-b3-sampled", "x-b3-flags", "traceparent", "tracestate"}, false},
		{"spaces around names are ignored", " b3 , baggage ", []string{"b3", "baggage"}, false},
		{"jaeger, xray and ottrace", "jaeger,xray,ottrace", []string{"uber-trace-id", "X-Amzn-Trace-Id", "ot-tracer-traceid", "ot-tracer-spanid", "ot-tracer-sampled"}, false},
		{"none reads and writes nothing", "none", nil, false},
		{"none wins over the others", "tracecontext,none", nil, false},
		{"an unknown name stops the server", "bogus", nil, true},
		{"an unknown name beside known ones stops the server", "tracecontext,bogus", nil, true},
		{"an unknown name beside none stops the server", "none,bogus", nil, true},
		{"names are case-sensitive", "TraceContext", nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			getenv := func(k string) string {
				if k == "OTEL_PROPAGATORS" {
					return c.value
				}
				return ""
			}
			p, err := newPropagator(getenv)
			if c.err {
				if err == nil || !strings.Contains(err.Error(), "OTEL_PROPAGATORS") {
					t.Fatalf("err = %v, want one naming OTEL_PROPAGATORS", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, want := slices.Sorted(slices.Values(p.Fields())), slices.Sorted(slices.Values(c.fields))
			if !slices.Equal(got, want) {
				t.Errorf("fields %q, want %q", got, c.fields)
			}
			// What it writes for a span it reads back.
			sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled})
			h := http.Header{}
			p.Inject(trace.ContextWithSpanContext(context.Background(), sc), propagation.HeaderCarrier(h))
			back := trace.SpanContextFromContext(p.Extract(context.Background(), propagation.HeaderCarrier(h)))
			if want := len(c.fields) > 0; back.IsValid() != want || (want && (back.TraceID() != sc.TraceID() || back.SpanID() != sc.SpanID())) {
				t.Errorf("read back %v from %v, want a span context: %v", back, h, want)
			}
		})
	}
}

// TestTracingB3 wires the server's pieces as run does with
// OTEL_PROPAGATORS=b3: an incoming B3 header, single or multiple, is the
// parent of the server span, a traceparent no longer is, and the app
// behind the gateway gets the upstream span in a b3 header.
func TestTracingB3(t *testing.T) {
	prop, err := newPropagator(func(k string) string {
		if k == "OTEL_PROPAGATORS" {
			return "b3"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	var mu sync.Mutex
	var appGot []http.Header
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		appGot = append(appGot, r.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	engine := tracedEngine(t, tp, prop, app)
	// serve sends a request with header and returns its server span.
	serve := func(t *testing.T, method, path string, header http.Header) sdktrace.ReadOnlySpan {
		t.Helper()
		r := httptest.NewRequest(method, path, strings.NewReader(`{"purpose":"checkout"}`))
		r.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			r.Header[k] = v
		}
		before := len(rec.Ended())
		w := httptest.NewRecorder()
		engine.ServeHTTP(w, r)
		if w.Code >= 300 {
			t.Fatalf("%s %s = %d %s", method, path, w.Code, w.Body)
		}
		for _, s := range rec.Ended()[before:] {
			if s.SpanKind() == trace.SpanKindServer {
				return s
			}
		}
		t.Fatalf("%s %s: no server span", method, path)
		return nil
	}

	for _, c := range []struct {
		name   string
		header http.Header
	}{
		{"the single b3 header is the server span's parent", http.Header{"B3": {clientTraceID + "-" + clientSpanID + "-1"}}},
		{"the X-B3-* headers are the server span's parent", http.Header{"X-B3-Traceid": {clientTraceID}, "X-B3-Spanid": {clientSpanID}, "X-B3-Sampled": {"1"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := serve(t, "POST", "/v1/tokens", c.header)
			if id := s.SpanContext().TraceID().String(); id != clientTraceID {
				t.Errorf("trace %s, want the client's %s", id, clientTraceID)
			}
			if p := s.Parent(); p.SpanID().String() != clientSpanID || !p.IsRemote() {
				t.Errorf("parent %s (remote %v), want the client's remote span %s", p.SpanID(), p.IsRemote(), clientSpanID)
			}
		})
	}

	t.Run("a traceparent is not read", func(t *testing.T) {
		s := serve(t, "POST", "/v1/tokens", http.Header{"Traceparent": {traceparent}})
		if s.Parent().IsValid() || s.SpanContext().TraceID().String() == clientTraceID {
			t.Errorf("the server span continued the traceparent: trace %s, parent %s", s.SpanContext().TraceID(), s.Parent().SpanID())
		}
	})

	t.Run("the app gets the upstream span in b3", func(t *testing.T) {
		serve(t, "POST", "/orders/7", http.Header{"Idempotency-Key": {`"k1"`}, "B3": {clientTraceID + "-" + clientSpanID + "-1"}})
		var up sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.Name() == "upstream POST" {
				up = s
			}
		}
		if up == nil {
			t.Fatal("no upstream span")
		}
		mu.Lock()
		defer mu.Unlock()
		if len(appGot) != 1 {
			t.Fatalf("the app got %d requests", len(appGot))
		}
		want := clientTraceID + "-" + up.SpanContext().SpanID().String() + "-1"
		if got := appGot[0].Get("b3"); got != want {
			t.Errorf("the app got b3 %q, want the upstream span's %q", got, want)
		}
		if got := appGot[0].Get("traceparent"); got != "" {
			t.Errorf("the app got a traceparent %q with b3 alone configured", got)
		}
	})
}
