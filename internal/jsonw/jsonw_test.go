package jsonw_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/replayguard/replayguard/internal/jsonw"
)

func TestQuotedDecodesToTheSameString(t *testing.T) {
	for _, s := range []string{
		"", "plain", `quote " backslash \ slash /`, "<html> & 'apostrophe'", "\x00\x01\x1f\x7f\b\f\t\r\n",
		"é 日本 🙂", "\u2028\u2029", "Send Authorization: Bearer <API key>.",
	} {
		var got string
		if err := json.Unmarshal(jsonw.Quoted(nil, s), &got); err != nil || got != s {
			t.Errorf("%q: decoded %q, %v from %s", s, got, err, jsonw.Quoted(nil, s))
		}
		if out := string(jsonw.Quoted(nil, s)); strings.ContainsAny(out, "\u2028\u2029") {
			t.Errorf("%q: U+2028/2029 left unescaped in %s", s, out)
		}
	}
}

func TestInvalidUTF8BecomesReplacementCharacters(t *testing.T) {
	var got string
	if err := json.Unmarshal(jsonw.Quoted(nil, "a\xffb\xc3"), &got); err != nil || got != "a\ufffdb\ufffd" {
		t.Fatalf("got %q, %v", got, err)
	}
}

func FuzzQuoted(f *testing.F) {
	f.Add("a\"b\\c\x00\u2028é\xff")
	f.Fuzz(func(t *testing.T, s string) {
		out := jsonw.Quoted(nil, s)
		if !json.Valid(out) {
			t.Fatalf("invalid JSON %q for %q", out, s)
		}
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		if utf8.ValidString(s) && got != s {
			t.Fatalf("decoded %q, want %q", got, s)
		}
	})
}

func TestFloatIsWhatEncodingJSONWrites(t *testing.T) {
	for _, f := range []float64{0, -0.0, 1, -1.5, 0.123, 1e-6, 1e-7, 123456789.125, 1e20, 1e21, 1.5e300, -2.5e-300, math.MaxFloat64, math.SmallestNonzeroFloat64, 1.0 / 3} {
		want, _ := json.Marshal(f)
		if got := jsonw.Float(nil, f); string(got) != string(want) {
			t.Errorf("%v: got %s, want %s", f, got, want)
		}
	}
}

func TestHex4(t *testing.T) {
	for _, c := range []struct {
		in   string
		want rune
		ok   bool
	}{
		{"0041", 'A', true}, {"00e9x", 'é', true}, {"D83D", 0xD83D, true}, {"dbFf", 0xDBFF, true},
		{"004", 0, false}, {"", 0, false}, {"00g1", 0, false}, {"+041", 0, false}, {" 041", 0, false},
	} {
		if r, ok := jsonw.Hex4(c.in); r != c.want || ok != c.ok {
			t.Errorf("Hex4(%q) = %q, %v; want %q, %v", c.in, r, ok, c.want, c.ok)
		}
		if r, ok := jsonw.Hex4([]byte(c.in)); r != c.want || ok != c.ok {
			t.Errorf("Hex4([]byte(%q)) = %q, %v; want %q, %v", c.in, r, ok, c.want, c.ok)
		}
	}
}
