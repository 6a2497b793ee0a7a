package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// fastJSONHandler writes the same lines as slog.JSONHandler, byte for
// byte, for the records the server logs on every request: no groups, no
// attributes added with With, and attribute values that are strings,
// integers, finite floats, booleans, durations or times. It formats those
// with strconv into a pooled buffer (JSONHandler marshals each float with
// encoding/json, a third of a request line's cost); any other record goes
// to the JSONHandler it wraps. Each line is one Write, as with JSONHandler.
type fastJSONHandler struct {
	inner slog.Handler // a *slog.JSONHandler writing to w with the same level
	w     io.Writer
	level slog.Leveler
}

func newFastJSONHandler(w io.Writer, level slog.Leveler) *fastJSONHandler {
	if level == nil {
		level = slog.LevelInfo
	}
	return &fastJSONHandler{inner: slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}), w: w, level: level}
}

func (h *fastJSONHandler) Enabled(_ context.Context, l slog.Level) bool {
	return l >= h.level.Level()
}

func (h *fastJSONHandler) WithAttrs(as []slog.Attr) slog.Handler { return h.inner.WithAttrs(as) }
func (h *fastJSONHandler) WithGroup(name string) slog.Handler    { return h.inner.WithGroup(name) }

var lineBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func (h *fastJSONHandler) Handle(ctx context.Context, r slog.Record) error {
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
	b = appendJSONString(b, r.Level.String())
	b = append(b, `","msg":"`...)
	b = appendJSONString(b, r.Message)
	b = append(b, '"')
	r.Attrs(func(a slog.Attr) bool {
		if a.Equal(slog.Attr{}) {
			return true // JSONHandler drops empty attributes
		}
		b = append(b, `,"`...)
		b = appendJSONString(b, a.Key)
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
		b = appendJSONString(b, v.String())
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
		return appendJSONFloat(b, v.Float64())
	}
	panic("unreachable: fastKind admitted " + v.Kind().String())
}

// appendJSONFloat appends f as encoding/json writes a float64 (f is
// finite).
func appendJSONFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s escaped as JSONHandler escapes strings,
// without the quotes: ", \ and control characters escaped, invalid UTF-8
// as \ufffd, U+2028 and U+2029 escaped, HTML characters as they are.
func appendJSONString(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(b, s[start:]...)
}
