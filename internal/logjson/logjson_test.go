package logjson

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"
)

// TestFastJSONHandlerWritesWhatJSONHandlerWrites logs the same records
// through both handlers and compares the bytes.
func TestFastJSONHandlerWritesWhatJSONHandlerWrites(t *testing.T) {
	at := time.Date(2026, 11, 28, 10, 0, 0, 123456789, time.FixedZone("x", 3600)) // formatting only
	cases := []struct {
		name  string
		level slog.Level
		msg   string
		attrs []slog.Attr
	}{
		{"a request line", slog.LevelInfo, "request", []slog.Attr{
			slog.String("request_id", "0123abcd"), slog.String("method", "POST"), slog.String("path", "/v1/tokens/redeem"),
			slog.Int("status", 200), slog.Float64("duration_ms", 0.123), slog.String("client_ip", "127.0.0.1"), slog.Int("bytes", 57),
		}},
		{"an error line", slog.LevelError, "request", []slog.Attr{slog.Int("status", 503), slog.String("error", "store: unavailable: redis: dial tcp 127.0.0.1:1: connect: connection refused")}},
		{"strings that need escaping", slog.LevelWarn, "quote \" backslash \\ <html> & \u2028 \u2029 \x00 \x1f \x7f \t\r\n", []slog.Attr{
			slog.String("k\"ey", "\xff invalid \xc3 utf-8 é 日本 🙂"), slog.String("", "empty key"),
		}},
		{"floats as encoding/json writes them", slog.LevelDebug, "floats", []slog.Attr{
			slog.Float64("zero", 0), slog.Float64("neg", -1.5), slog.Float64("tiny", 1e-7), slog.Float64("small", 0.000001),
			slog.Float64("big", 1e21), slog.Float64("bigger", 1.234e300), slog.Float64("int", 42), slog.Float64("third", 1.0/3),
		}},
		{"other kinds", slog.LevelInfo, "kinds", []slog.Attr{
			slog.Int64("min", math.MinInt64), slog.Uint64("max", math.MaxUint64), slog.Bool("t", true), slog.Bool("f", false),
			slog.Duration("d", 1500*time.Millisecond), slog.Time("at", at), {},
		}},
		{"kinds left to JSONHandler", slog.LevelInfo, "fallback", []slog.Attr{
			slog.Any("err", errors.New("boom")), slog.Group("g", slog.Int("a", 1)), slog.Float64("nan", math.NaN()),
			slog.Any("list", []int{1, 2}), slog.Time("far", time.Date(10001, 1, 1, 0, 0, 0, 0, time.UTC)),
		}},
		{"no attributes", slog.LevelInfo, "replayguard started", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, when := range []time.Time{at, {}} {
				var want, got bytes.Buffer
				r := slog.NewRecord(when, tc.level, tc.msg, 0)
				r.AddAttrs(tc.attrs...)
				if err := slog.NewJSONHandler(&want, &slog.HandlerOptions{Level: slog.LevelDebug}).Handle(context.Background(), r); err != nil {
					t.Fatal(err)
				}
				if err := NewHandler(&got, slog.LevelDebug).Handle(context.Background(), r); err != nil {
					t.Fatal(err)
				}
				if got.String() != want.String() {
					t.Errorf("fast handler wrote\n%s\nJSONHandler writes\n%s", got.String(), want.String())
				}
			}
		})
	}
}

func TestFastJSONHandlerLevelAndDerivedLoggers(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(NewHandler(&buf, slog.LevelWarn))
	log.Info("dropped")
	log.With("component", "x").Warn("kept", "n", 1)
	log.WithGroup("g").Error("grouped", "n", 2)
	want := []string{`"msg":"kept","component":"x","n":1}`, `"msg":"grouped","g":{"n":2}}`}
	out := buf.String()
	if bytes.Contains(buf.Bytes(), []byte("dropped")) {
		t.Errorf("an info line passed a warn level:\n%s", out)
	}
	for _, w := range want {
		if !bytes.Contains(buf.Bytes(), []byte(w)) {
			t.Errorf("output lacks %s:\n%s", w, out)
		}
	}
}

func BenchmarkRequestLine(b *testing.B) {
	attrs := []slog.Attr{
		slog.String("request_id", "0123abcd0123abcd"), slog.String("method", "POST"), slog.String("path", "/v1/tokens/redeem"),
		slog.Int("status", 200), slog.Float64("duration_ms", 0.123), slog.String("client_ip", "127.0.0.1"), slog.Int("bytes", 57),
	}
	for _, h := range []struct {
		name string
		h    slog.Handler
	}{
		{"slog.JSONHandler", slog.NewJSONHandler(discard{}, nil)},
		{"logjson.Handler", NewHandler(discard{}, nil)},
	} {
		b.Run(h.name, func(b *testing.B) {
			log := slog.New(h.h)
			ctx := context.Background()
			b.ReportAllocs()
			for range b.N {
				log.LogAttrs(ctx, slog.LevelInfo, "request", attrs...)
			}
		})
	}
	// What the server's request middleware calls: no slog.Record.
	r := Request{Time: time.Now(), Level: slog.LevelInfo, RequestID: "0123abcd0123abcd", Method: "POST", Path: "/v1/tokens/redeem",
		Status: 200, DurationMS: 0.123, ClientIP: "127.0.0.1", Bytes: 57}
	b.Run("logjson.Handler.LogRequest", func(b *testing.B) {
		h := NewHandler(discard{}, nil)
		ctx := context.Background()
		b.ReportAllocs()
		for range b.N {
			_ = h.LogRequest(ctx, r)
		}
	})
	// With tracing on: the line also carries trace_id and span_id.
	b.Run("logjson.Handler.LogRequest traced", func(b *testing.B) {
		h := NewHandler(discard{}, nil)
		r := r
		r.TraceID, r.SpanID = traceID, spanID
		ctx := context.Background()
		b.ReportAllocs()
		for range b.N {
			_ = h.LogRequest(ctx, r)
		}
	})
}

// A trace and span ID, as OpenTelemetry's documentation writes them.
var (
	traceID = [16]byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	spanID  = [8]byte{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}
)

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestLogRequestWritesWhatJSONHandlerWrites compares LogRequest's line
// with slog.JSONHandler's for the same record.
func TestLogRequestWritesWhatJSONHandlerWrites(t *testing.T) {
	at := time.Date(2026, 11, 28, 10, 0, 0, 123456789, time.FixedZone("x", 3600)) // formatting only
	cases := []Request{
		{Time: at, Level: slog.LevelInfo, RequestID: "0123abcd", Method: "POST", Path: "/v1/tokens/redeem", Status: 200, DurationMS: 0.123, ClientIP: "127.0.0.1", Bytes: 57},
		{Time: at.UTC(), Level: slog.LevelError, RequestID: "r", Method: "GET", Path: "/readyz", Status: 503, DurationMS: 1000.5, ClientIP: "::1", Bytes: 0, Err: errors.New("store: unavailable: redis: dial tcp 127.0.0.1:1: connect: connection refused")},
		{Time: at, Level: slog.LevelError, RequestID: "r", Method: "POST", Path: "/empty-error", Status: 500, DurationMS: 2, Err: errors.New("")},
		{Time: at, Level: slog.LevelWarn, RequestID: "", Method: "BREW", Path: "/\"quoted\"\\<html>&\u2028\x00\x1f\xff\xc3 é 日本 🙂", Status: 404, DurationMS: 1e-7, ClientIP: "", Bytes: -1},
		{Time: at, Level: slog.LevelInfo, Path: "/", Status: 200, DurationMS: 1e21},
		{Time: at, Level: slog.LevelInfo, Path: "/nan", DurationMS: math.NaN()},
		{Level: slog.LevelInfo, Path: "/no-time", DurationMS: 1},
		{Time: at, Level: slog.LevelInfo, RequestID: "r", Method: "POST", Path: "/traced", Status: 201, DurationMS: 0.5, ClientIP: "10.0.0.1", Bytes: 40,
			TraceID: traceID, SpanID: spanID},
		{Time: at, Level: slog.LevelError, Path: "/traced-error", Status: 503, DurationMS: 3, TraceID: traceID, SpanID: spanID, Err: errors.New("store: unavailable")},
		{Time: at, Level: slog.LevelInfo, Path: "/trace-without-span", TraceID: traceID},
		{Time: at, Level: slog.LevelInfo, Path: "/span-without-trace", SpanID: spanID},
		{Level: slog.LevelInfo, Path: "/traced-no-time", DurationMS: 1, TraceID: traceID, SpanID: spanID},
		{Time: at, Level: slog.LevelInfo, Path: "/traced-nan", DurationMS: math.NaN(), TraceID: traceID, SpanID: spanID},
		{Time: at, Level: slog.LevelInfo, RequestID: "r", Method: "POST", Path: "/orders", Status: 201, DurationMS: 0.5, ClientIP: "10.0.0.1", Bytes: 40,
			RecordID: "idem:" + strings.Repeat("0f", 32)},
		{Time: at, Level: slog.LevelError, Path: "/recorded-traced-error", Status: 503, DurationMS: 3, RecordID: "token:648159969924932521",
			TraceID: traceID, SpanID: spanID, Err: errors.New("store: unavailable")},
		{Time: at, Level: slog.LevelInfo, Path: "/recorded-odd", RecordID: "b64:\"<\u2028\xff"},
		{Level: slog.LevelInfo, Path: "/recorded-no-time", DurationMS: 1, RecordID: "token:1"},
	}
	for _, r := range cases {
		t.Run(r.Path, func(t *testing.T) {
			var want, got bytes.Buffer
			if err := slog.NewJSONHandler(&want, &slog.HandlerOptions{Level: slog.LevelDebug}).Handle(context.Background(), r.Record()); err != nil {
				t.Fatal(err)
			}
			if err := NewHandler(&got, slog.LevelDebug).LogRequest(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Errorf("LogRequest wrote\n%s\nJSONHandler\n%s", got.String(), want.String())
			}
		})
	}
}

// FuzzLogRequest holds LogRequest to slog.JSONHandler for any strings
// and trace IDs.
func FuzzLogRequest(f *testing.F) {
	f.Add("0123abcd", "POST", "/v1/tokens", "127.0.0.1", false, "", 200, 0.25, []byte(nil), []byte(nil))
	f.Add("", "GET", "/\xff\"<>&\u2028", "::1", true, "boom \x00", 500, 1e21, []byte(nil), []byte(nil))
	f.Add("r", "POST", "/v1/tokens/redeem", "::1", true, "", 503, 1.5, []byte(nil), []byte(nil)) // an error with an empty message
	f.Add("r", "POST", "/v1/tokens", "::1", false, "", 201, 0.5, traceID[:], spanID[:])
	f.Add("r", "GET", "/readyz", "::1", true, "down", 503, 2.0, traceID[:], []byte(nil))
	f.Fuzz(func(t *testing.T, id, method, path, ip string, hasErr bool, errText string, status int, d float64, traceID, spanID []byte) {
		r := Request{Time: time.Unix(1700000000, 123).UTC(), Level: slog.LevelInfo, RequestID: id, Method: method, Path: path,
			Status: status, DurationMS: d, ClientIP: ip, Bytes: len(path), RecordID: method}
		copy(r.TraceID[:], traceID)
		copy(r.SpanID[:], spanID)
		if hasErr {
			r.Err = errors.New(errText)
		}
		var want, got bytes.Buffer
		_ = slog.NewJSONHandler(&want, nil).Handle(context.Background(), r.Record())
		_ = NewHandler(&got, nil).LogRequest(context.Background(), r)
		if got.String() != want.String() {
			t.Fatalf("LogRequest wrote\n%s\nJSONHandler\n%s", got.String(), want.String())
		}
	})
}

// TestLogRequestErrorField: a line has an "error" field exactly when the
// request has an error, with the error's text even when that is empty
// (an error with no message is still the cause of the answer), on
// LogRequest's path and on the slog.Record any other handler gets.
func TestLogRequestErrorField(t *testing.T) {
	at := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		err       error
		wantField bool
		want      string
	}{
		{"no error, no field", nil, false, ""},
		{"an error's text", errors.New("store: unavailable"), true, "store: unavailable"},
		{"an error with an empty message still has the field", errors.New(""), true, ""},
	} {
		r := Request{Time: at, Level: slog.LevelError, Path: "/", Status: 500, DurationMS: 1, Err: tc.err}
		bothPaths(t, tc.name, r, func(t *testing.T, buf *bytes.Buffer, line map[string]any) {
			got, ok := line["error"]
			if ok != tc.wantField || (ok && got != tc.want) {
				t.Fatalf("error field = %q (present %v), want %q (present %v) in %s", got, ok, tc.want, tc.wantField, buf.Bytes())
			}
		})
	}
}

// TestLogRequestTraceFields: a line has "trace_id" and "span_id", in
// lowercase hex, exactly when the request has a trace ID, before "error",
// on LogRequest's path and on the slog.Record any other handler gets.
func TestLogRequestTraceFields(t *testing.T) {
	at := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name                string
		traceID             [16]byte
		spanID              [8]byte
		wantTrace, wantSpan string // "": no field
	}{
		{"no trace, no fields", [16]byte{}, [8]byte{}, "", ""},
		{"a span's IDs in lowercase hex", traceID, spanID, "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"},
		{"a span ID alone writes nothing", [16]byte{}, spanID, "", ""},
	} {
		r := Request{Time: at, Level: slog.LevelError, Path: "/", Status: 500, DurationMS: 1, TraceID: tc.traceID, SpanID: tc.spanID, Err: errors.New("boom")}
		bothPaths(t, tc.name, r, func(t *testing.T, buf *bytes.Buffer, line map[string]any) {
			for _, f := range []struct{ key, want string }{{"trace_id", tc.wantTrace}, {"span_id", tc.wantSpan}} {
				got, ok := line[f.key]
				if ok != (f.want != "") || (ok && got != f.want) {
					t.Errorf("%s = %v (present %v), want %q in %s", f.key, got, ok, f.want, buf.Bytes())
				}
			}
			if tc.wantTrace != "" && !bytes.Contains(buf.Bytes(), []byte(`"span_id":"`+tc.wantSpan+`","error":`)) {
				t.Errorf("span_id is not just before error: %s", buf.Bytes())
			}
		})
	}
}

// bothPaths logs r through LogRequest and, as a slog.Record, through
// slog.JSONHandler, and runs check on each line, decoded, in a subtest
// named name/path.
func bothPaths(t *testing.T, name string, r Request, check func(t *testing.T, buf *bytes.Buffer, line map[string]any)) {
	t.Helper()
	for _, path := range []struct {
		name string
		log  func(*bytes.Buffer) error
	}{
		{"LogRequest", func(b *bytes.Buffer) error { return NewHandler(b, nil).LogRequest(context.Background(), r) }},
		{"Record through slog.JSONHandler", func(b *bytes.Buffer) error {
			return slog.NewJSONHandler(b, nil).Handle(context.Background(), r.Record())
		}},
	} {
		t.Run(name+"/"+path.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := path.log(&buf); err != nil {
				t.Fatal(err)
			}
			var line map[string]any
			if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
				t.Fatalf("line %q: %v", buf.Bytes(), err)
			}
			check(t, &buf, line)
		})
	}
}
