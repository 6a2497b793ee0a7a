package handlers_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/internal/logjson"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// failingRedeems fails every token redemption with err, which wraps
// store.ErrUnavailable whatever its message.
type failingRedeems struct {
	store.Store
	err error
}

func (f failingRedeems) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, f.err
}

// silentUnavailable is a store failure whose message is empty.
type silentUnavailable struct{}

func (silentUnavailable) Error() string        { return "" }
func (silentUnavailable) Is(target error) bool { return target == store.ErrUnavailable }

// TestRequestLogNamesTheCauseOf5xx: a 503 problem says nothing about the
// store (its address stays out of answers), so the request's log line is
// where an operator finds the cause, as "error" with the error's text even
// when that text is empty; 4xx lines carry no error. The server's handler
// (logjson, which takes the line without a slog.Record) and any other
// slog handler write the same field.
func TestRequestLogNamesTheCauseOf5xx(t *testing.T) {
	for _, h := range []struct {
		name string
		new  func(io.Writer) slog.Handler
	}{
		{"logjson.Handler", func(w io.Writer) slog.Handler { return logjson.NewHandler(w, nil) }},
		{"slog.JSONHandler", func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }},
	} {
		for _, tc := range []struct {
			name, target string
			storeErr     error
			status       int
			wantField    bool // the line has "error"
			wantError    string
		}{
			{"store down on redeem", "/v1/tokens/redeem", store.Unavailable("redeem", errStoreDown), http.StatusServiceUnavailable, true, errStoreDown.Error()},
			{"store down on forward-auth", handlers.ForwardAuthPath, store.Unavailable("redeem", errStoreDown), http.StatusServiceUnavailable, true, errStoreDown.Error()},
			{"a store error with an empty message is still logged", "/v1/tokens/redeem", silentUnavailable{}, http.StatusServiceUnavailable, true, ""},
			{"a refusal is not an error", "/v1/tokens/redeem?purpose=" + strings.Repeat("x", 100), errStoreDown, http.StatusBadRequest, false, ""},
		} {
			t.Run(h.name+"/"+tc.name, func(t *testing.T) {
				mem := memory.New()
				t.Cleanup(func() { _ = mem.Close() })
				svc, err := token.New(failingRedeems{mem, tc.storeErr}, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(9))
				if err != nil {
					t.Fatal(err)
				}
				is, err := svc.Issue(t.Context(), token.IssueRequest{})
				if err != nil {
					t.Fatal(err)
				}
				var logs testenv.LockedBuffer
				e, err := handlers.New(svc, handlers.WithLogger(slog.New(h.new(&logs)))).Engine()
				if err != nil {
					t.Fatal(err)
				}
				req := httptest.NewRequest(http.MethodPost, tc.target, nil)
				req.Header.Set(token.Header, is.Token)
				w := httptest.NewRecorder()
				e.ServeHTTP(w, req)
				if w.Code != tc.status {
					t.Fatalf("status = %d %s, want %d", w.Code, w.Body, tc.status)
				}
				if strings.Contains(w.Body.String(), "10.9.8.7") {
					t.Fatalf("the answer reveals the store's address: %s", w.Body)
				}
				line := logs.Bytes()
				var rec map[string]any
				if err := json.Unmarshal(line, &rec); err != nil {
					t.Fatalf("log = %q: %v", line, err)
				}
				got, ok := rec["error"]
				if ok != tc.wantField || (ok && !strings.Contains(got.(string), tc.wantError)) {
					t.Fatalf("log error = %q (present %v), want %q (present %v)", got, ok, tc.wantError, tc.wantField)
				}
			})
		}
	}
}

// TestRequestLogCarriesTraceIDs: with tracing on, a request's log line
// carries the trace_id and span_id of its server span, so that the line
// and the trace can be joined (a client's traceparent continues the
// trace, and the span_id is the server span's own, never the client's);
// with tracing off the line has neither field. The server's handler
// (logjson) and any other slog handler write the same fields.
func TestRequestLogCarriesTraceIDs(t *testing.T) {
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	mem := memory.New()
	t.Cleanup(func() { _ = mem.Close() })
	svc, err := token.New(mem, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(9))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []struct {
		name string
		new  func(io.Writer) slog.Handler
	}{
		{"logjson.Handler", func(w io.Writer) slog.Handler { return logjson.NewHandler(w, nil) }},
		{"slog.JSONHandler", func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }},
	} {
		for _, tc := range []struct {
			name        string
			traced      bool
			traceparent string
			target      string
			status      int
		}{
			{"tracing on: a new trace", true, "", "/healthz", http.StatusOK},
			{"tracing on: the client's trace continued", true, "00-" + clientTrace + "-" + clientSpan + "-01", "/healthz", http.StatusOK},
			{"tracing on: a problem answer", true, "", "/v1/nope", http.StatusNotFound},
			{"tracing off: no IDs, even with a traceparent", false, "00-" + clientTrace + "-" + clientSpan + "-01", "/healthz", http.StatusOK},
		} {
			t.Run(h.name+"/"+tc.name, func(t *testing.T) {
				rec := tracetest.NewSpanRecorder()
				var logs testenv.LockedBuffer
				opts := []handlers.Option{handlers.WithLogger(slog.New(h.new(&logs)))}
				if tc.traced {
					opts = append(opts, handlers.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
				}
				e, err := handlers.New(svc, opts...).Engine()
				if err != nil {
					t.Fatal(err)
				}
				req := httptest.NewRequest(http.MethodGet, tc.target, nil)
				if tc.traceparent != "" {
					req.Header.Set("traceparent", tc.traceparent)
				}
				w := httptest.NewRecorder()
				e.ServeHTTP(w, req)
				if w.Code != tc.status {
					t.Fatalf("status = %d %s, want %d", w.Code, w.Body, tc.status)
				}
				var line map[string]any
				if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
					t.Fatalf("log = %q: %v", logs.Bytes(), err)
				}
				if !tc.traced {
					for _, k := range []string{"trace_id", "span_id"} {
						if v, ok := line[k]; ok {
							t.Errorf("tracing off, the line has %s = %v", k, v)
						}
					}
					return
				}
				spans := rec.Ended()
				if len(spans) != 1 {
					t.Fatalf("%d spans ended, want the server span", len(spans))
				}
				sc := spans[0].SpanContext()
				if line["trace_id"] != sc.TraceID().String() || line["span_id"] != sc.SpanID().String() {
					t.Errorf("the line has trace_id %v span_id %v, want the server span's %s %s", line["trace_id"], line["span_id"], sc.TraceID(), sc.SpanID())
				}
				if tc.traceparent != "" && (line["trace_id"] != clientTrace || line["span_id"] == clientSpan) {
					t.Errorf("the line has trace_id %v span_id %v, want the client's trace %s and a span of the server's", line["trace_id"], line["span_id"], clientTrace)
				}
			})
		}
	}
}

// BenchmarkRequestLog prices a request through the Engine's middleware
// and its log line (logjson to a discarding writer), on GET /healthz,
// with tracing off and on (spans started and dropped: no exporter).
func BenchmarkRequestLog(b *testing.B) {
	mem := memory.New()
	b.Cleanup(func() { _ = mem.Close() })
	svc, err := token.New(mem, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(9))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts []handlers.Option
	}{
		{"tracing off", nil},
		{"tracing on", []handlers.Option{handlers.WithTracerProvider(sdktrace.NewTracerProvider())}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			log := slog.New(logjson.NewHandler(io.Discard, nil))
			e, err := handlers.New(svc, append(tc.opts, handlers.WithLogger(log))...).Engine()
			if err != nil {
				b.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
			b.ReportAllocs()
			for range b.N {
				w := httptest.NewRecorder()
				e.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}

// TestRequestLogNamesTheRecord: the request line of a request that opened
// or found a token's record carries its record_id, the ID an operator
// looks it up by; other lines carry none. The server's handler (logjson)
// and any other slog handler write the same field.
func TestRequestLogNamesTheRecord(t *testing.T) {
	for _, h := range []struct {
		name string
		new  func(io.Writer) slog.Handler
	}{
		{"logjson.Handler", func(w io.Writer) slog.Handler { return logjson.NewHandler(w, nil) }},
		{"slog.JSONHandler", func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }},
	} {
		t.Run(h.name, func(t *testing.T) {
			var logs testenv.LockedBuffer
			e := newAPIEnv(t, apiStores[0].open, nil, handlers.WithAdminKeys(adminKeys...), handlers.WithLogger(slog.New(h.new(&logs))))
			is := e.issue("checkout", 0)
			plain := e.issue("checkout", 0)
			id := "token:" + is.ID
			var lease struct{ Lease string }
			for _, s := range []struct {
				name, path string
				body       map[string]any
				bearer     string // for the operators' endpoints
				want       string // record_id, "" for none
			}{
				{"issue", "/v1/tokens", map[string]any{"purpose": "checkout"}, "", ""},
				{"a plain redeem opens no record", "/v1/tokens/redeem", map[string]any{"token": plain.Token, "purpose": "checkout"}, "", ""},
				{"a record redeem opens one", "/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": true}, "", id},
				{"a duplicate finds it in progress", "/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout"}, "", id},
				{"renew", "/v1/tokens/renew", map[string]any{"token": is.Token, "lease": &lease.Lease}, "", id},
				{"complete", "/v1/tokens/complete", map[string]any{"token": is.Token, "response": map[string]any{"status": 201}}, "", id},
				{"a duplicate gets the response", "/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout"}, "", id},
				{"an operator looks it up", "/v1/admin/records/lookup", map[string]any{"token": is.Token}, adminKeys[0], id},
				{"a refused operator names nothing", "/v1/admin/records/lookup", map[string]any{"token": is.Token}, "wrong", ""},
			} {
				before := len(logs.String())
				var status int
				if strings.HasPrefix(s.path, "/v1/admin/") {
					status = e.admin("POST", s.path, s.bearer, s.body).status
				} else {
					got := e.post(s.path, s.body, false)
					status = got.status
					if s.body["record"] == true {
						_ = json.Unmarshal(got.raw, &lease)
					}
				}
				var line map[string]any
				if err := json.Unmarshal([]byte(strings.TrimSpace(logs.String()[before:])), &line); err != nil {
					t.Fatalf("%s (%d): log %q: %v", s.name, status, logs.String()[before:], err)
				}
				got, ok := line["record_id"]
				if (s.want == "") == ok || (ok && got != s.want) {
					t.Fatalf("%s (%d): record_id = %v (present %v), want %q", s.name, status, got, ok, s.want)
				}
			}
		})
	}
}
