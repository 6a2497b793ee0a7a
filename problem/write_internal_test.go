package problem

import (
	"bytes"
	"encoding/json"
	"testing"
)

// TestAppendJSONIsWhatEncodingJSONWrites compares the hand-written body
// with encoding/json's (HTML left unescaped) byte for byte.
func TestAppendJSONIsWhatEncodingJSONWrites(t *testing.T) {
	for _, p := range []Problem{
		{Type: "about:blank", Title: "Unauthorized", Status: 401, Detail: "Send Authorization: Bearer <API key>.", Code: "unauthorized"},
		{Type: "https://replayguard.dev/problems/x", Title: "T", Status: 422, Detail: `quote " backslash \ & é 日本 🙂 tab	nl
`, Code: "c", RequestID: "0123abcd", ServerTime: "2026-11-28T10:00:00Z"},
		{},
	} {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(p); err != nil {
			t.Fatal(err)
		}
		if got := p.appendJSON(nil); string(got) != want.String() {
			t.Errorf("got  %s\nwant %s", got, want.String())
		}
	}
}

func BenchmarkWriteBody(b *testing.B) {
	p := Problem{Type: "about:blank", Title: "Token invalid", Status: 401, Detail: "The token is malformed, forged or signed with an unknown key.", Code: "token_invalid", RequestID: "0123456789abcdef0123456789abcdef"}
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		var buf bytes.Buffer
		for range b.N {
			buf.Reset()
			_ = json.NewEncoder(&buf).Encode(p)
		}
	})
	b.Run("appendJSON", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for range b.N {
			buf = p.appendJSON(buf[:0])
		}
	})
}
