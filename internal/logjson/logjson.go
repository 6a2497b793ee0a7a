// Package logjson is the server's log handler: it writes slog.JSONHandler's
// lines, byte for byte, without reflection for the records the server logs
// on every request.
package logjson

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/replayguard/replayguard/internal/jsonw"
)

// Handler writes the same lines as slog.JSONHandler, byte for
// byte, for the records the server logs on every request: no groups, no
// attributes added with With, and attribute values that are strings,
// integers, finite floats, booleans, durations or times. It formats those
// with strconv into a pooled buffer (JSONHandler marshals each float with
// encoding/json, a third of a request line's cost); any other record goes
// to the JSONHandler it wraps. Each line is one Write, as with JSONHandler.
type Handler struct {
	inner slog.Handler // a *slog.JSONHandler writing to w with the same level
	w     io.Writer
	level slog.Leveler
}

// NewHandler returns a Handler writing to w the records at level or
// above (nil: slog.LevelInfo).
func NewHandler(w io.Writer, level slog.Leveler) *Handler {
	if level == nil {
		level = slog.LevelInfo
	}
	return &Handler{inner: slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}), w: w, level: level}
}

// Enabled implements slog.Handler.
func (h *Handler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

// WithAttrs implements slog.Handler: the result is a slog.JSONHandler.
func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler { return h.inner.WithAttrs(as) }

// WithGroup implements slog.Handler: the result is a slog.JSONHandler.
func (h *Handler) WithGroup(name string) slog.Handler { return h.inner.WithGroup(name) }

var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	plain := true
	r.Attrs(func(a slog.Attr) bool {
		plain = fastKind(a.Value)
		return plain
	})
	if !plain {
		return h.inner.Handle(ctx, r)
	}
	bp := lineBufs.Get().(*[]byte)
	b := (*bp)[:0]
	b = append(b, '{')
	if !r.Time.IsZero() {
		b = append(b, `"time":"`...)
		b = r.Time.Round(0).AppendFormat(b, time.RFC3339Nano)
		b = append(b, `",`...)
	}
	b = append(b, `"level":"`...)
	b = jsonw.String(b, r.Level.String())
	b = append(b, `","msg":"`...)
	b = jsonw.String(b, r.Message)
	b = append(b, '"')
	r.Attrs(func(a slog.Attr) bool {
		if a.Equal(slog.Attr{}) {
			return true // JSONHandler drops empty attributes
		}
		b = append(b, `,"`...)
		b = jsonw.String(b, a.Key)
		b = append(b, `":`...)
		b = appendValue(b, a.Value)
		return true
	})
	b = append(b, "}\n"...)
	_, err := h.w.Write(b)
	if cap(b) <= 16<<10 {
		*bp = b
		lineBufs.Put(bp)
	}
	return err
}

// fastKind reports whether appendValue writes v as JSONHandler does.
func fastKind(v slog.Value) bool {
	switch v.Kind() {
	case slog.KindString, slog.KindInt64, slog.KindUint64, slog.KindBool, slog.KindDuration:
		return true
	case slog.KindTime:
		y := v.Time().Year()
		return y >= 0 && y < 10000
	case slog.KindFloat64:
		f := v.Float64()
		return !math.IsNaN(f) && !math.IsInf(f, 0)
	}
	return false
}

func appendValue(b []byte, v slog.Value) []byte {
	switch v.Kind() {
	case slog.KindString:
		b = append(b, '"')
		b = jsonw.String(b, v.String())
		return append(b, '"')
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10)
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10)
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool())
	case slog.KindDuration:
		return strconv.AppendInt(b, int64(v.Duration()), 10)
	case slog.KindTime:
		b = append(b, '"')
		b = v.Time().AppendFormat(b, time.RFC3339Nano)
		return append(b, '"')
	case slog.KindFloat64:
		return jsonw.Float(b, v.Float64())
	}
	panic("unreachable: fastKind admitted " + v.Kind().String())
}

// Request is one request's log line: the record "request" with these
// attributes, in this order, then "record_id" when RecordID is not empty,
// "trace_id" and "span_id" when TraceID is not zero, and "error" last
// when Err is not nil.
type Request struct {
	Time       time.Time
	Level      slog.Level
	RequestID  string
	Method     string
	Path       string
	Status     int
	DurationMS float64
	ClientIP   string
	Bytes      int
	// RecordID is the ID of the idempotency record the request opened or
	// found (idempotency.RecordID), for an operator to look it up; empty
	// for a request that met none.
	RecordID string
	// TraceID and SpanID are the request's span, when it has one (a
	// server with tracing on): the line's "trace_id" and "span_id", in
	// lowercase hex as OpenTelemetry writes them (32 and 16 digits), so
	// that a line finds its trace. Both are written when TraceID is not
	// all zeros, neither otherwise.
	TraceID [16]byte
	SpanID  [8]byte
	// Err is the error the request was answered for, or nil. Its text is
	// the line's "error", even when empty: the field says that an error
	// was the cause, whatever its message.
	Err error
}

// traced reports whether r's line carries trace_id and span_id.
func (r *Request) traced() bool { return r.TraceID != [16]byte{} }

// LogRequest writes r's line, byte for byte what Handle writes for the
// same record, without building the record: the request line is the one
// every request writes. A DurationMS that is NaN or infinite, which no
// request has, goes through Handle.
func (h *Handler) LogRequest(ctx context.Context, r Request) error {
	if math.IsNaN(r.DurationMS) || math.IsInf(r.DurationMS, 0) || r.Time.IsZero() {
		return h.Handle(ctx, r.Record())
	}
	bp := lineBufs.Get().(*[]byte)
	b := (*bp)[:0]
	b = append(b, `{"time":"`...)
	b = r.Time.Round(0).AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"`...)
	b = jsonw.String(b, r.Level.String())
	b = append(b, `","msg":"request","request_id":"`...)
	b = jsonw.String(b, r.RequestID)
	b = append(b, `","method":"`...)
	b = jsonw.String(b, r.Method)
	b = append(b, `","path":"`...)
	b = jsonw.String(b, r.Path)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(r.Status), 10)
	b = append(b, `,"duration_ms":`...)
	b = jsonw.Float(b, r.DurationMS)
	b = append(b, `,"client_ip":"`...)
	b = jsonw.String(b, r.ClientIP)
	b = append(b, `","bytes":`...)
	b = strconv.AppendInt(b, int64(r.Bytes), 10)
	if r.RecordID != "" {
		b = append(b, `,"record_id":"`...)
		b = jsonw.String(b, r.RecordID)
		b = append(b, '"')
	}
	if r.traced() {
		b = append(b, `,"trace_id":"`...)
		b = hex.AppendEncode(b, r.TraceID[:])
		b = append(b, `","span_id":"`...)
		b = hex.AppendEncode(b, r.SpanID[:])
		b = append(b, '"')
	}
	if r.Err != nil {
		b = append(b, `,"error":"`...)
		b = jsonw.String(b, r.Err.Error())
		b = append(b, '"')
	}
	b = append(b, "}\n"...)
	_, err := h.w.Write(b)
	if cap(b) <= 16<<10 {
		*bp = b
		lineBufs.Put(bp)
	}
	return err
}

// Record is r as a slog.Record, for any other handler.
func (r Request) Record() slog.Record {
	rec := slog.NewRecord(r.Time, r.Level, "request", 0)
	rec.AddAttrs(
		slog.String("request_id", r.RequestID),
		slog.String("method", r.Method),
		slog.String("path", r.Path),
		slog.Int("status", r.Status),
		slog.Float64("duration_ms", r.DurationMS),
		slog.String("client_ip", r.ClientIP),
		slog.Int("bytes", r.Bytes),
	)
	if r.RecordID != "" {
		rec.AddAttrs(slog.String("record_id", r.RecordID))
	}
	if r.traced() {
		rec.AddAttrs(
			slog.String("trace_id", hex.EncodeToString(r.TraceID[:])),
			slog.String("span_id", hex.EncodeToString(r.SpanID[:])),
		)
	}
	if r.Err != nil {
		rec.AddAttrs(slog.String("error", r.Err.Error()))
	}
	return rec
}
