package guard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestDuplicateMember(t *testing.T) {
	tests := []struct {
		body          string
		first, second string // "" for none
	}{
		{`{"amount":1,"amount":1000}`, "amount", "amount"},
		{`{"a":{"b":1,"b":2}}`, "b", "b"},
		{`[{"a":1,"a":2}]`, "a", "a"},
		{`{"a":"x","b":"a","a":3}`, "a", "a"},
		{`{"a":[{"x":1},{"x":2}],"b":1}`, "", ""},
		{`{"a":1,"b":{"a":2}}`, "", ""},
		{`{"a":"b","b":"a"}`, "", ""},
		{`{"a":{},"b":[],"c":null}`, "", ""},
		{`"a"`, "", ""},
		{`not json`, "", ""},
		{`{"a":1,`, "", ""},
		// Names equal under simple case folding, as encoding/json matches
		// them to a struct field.
		{`{"item":"book","qty":1,"QTY":5}`, "qty", "QTY"},
		{`{"QTY":5,"item":"book","qty":1}`, "QTY", "qty"},
		{`{"Qty":1,"qTy":2}`, "Qty", "qTy"},
		{`{"order":{"lines":[{"sku":"a","SKU":"b"}]}}`, "sku", "SKU"},
		{`[{"a":1},{"b":{"id":1,"ID":2}}]`, "id", "ID"},
		{"{\"k\":1,\"\u212a\":2}", "k", "\u212a"}, // the Kelvin sign
		{`{"K":1,"\u212a":2}`, "K", "\u212a"},     // the same, escaped
		{"{\"s\":1,\"\u017f\":2}", "s", "\u017f"}, // the long s
		{`{"\u017F":1,"S":2}`, "\u017f", "S"},
		{"{\"\u00e9\":1,\"\u00c9\":2}", "\u00e9", "\u00c9"}, // é and É
		{`{"q\u0074y":1,"qty":2}`, "qty", "qty"},            // an escape is the letter it names
		{"{\"\u03c2\":1,\"\u03a3\":2}", "\u03c2", "\u03a3"}, // final sigma and capital sigma: one orbit
		// Not equal under simple folding, though full folding or
		// normalization may make them so: encoding/json tells them apart.
		{"{\"ss\":1,\"\u00df\":2}", "", ""},      // ss and ß
		{"{\"e\u0301\":1,\"\u00e9\":2}", "", ""}, // a combining accent and é
		{"{\"i\":1,\"\u0130\":2}", "", ""},       // i and İ
		{`{"qty":1,"order":{"QTY":2}}`, "", ""},  // another object
		{`{"qty":[{"QTY":1}],"Qt":2}`, "", ""},
	}
	for _, tc := range tests {
		first, second, dup := duplicateMember([]byte(tc.body))
		if dup != (tc.first != "") || first != tc.first || second != tc.second {
			t.Errorf("duplicateMember(%s) = %q, %q, %v; want %q, %q", tc.body, first, second, dup, tc.first, tc.second)
		}
	}
}

func TestNotUnicode(t *testing.T) {
	tests := []struct {
		body string
		want string // "" for Unicode text
	}{
		{`{"a":"\ud800"}`, "escapes a lone surrogate"},
		{`{"a":"\udbff"}`, "escapes a lone surrogate"},
		{`{"a":"\uDC00"}`, "escapes a lone surrogate"},
		{`{"a":"\ud800x"}`, "escapes a lone surrogate"},
		{`{"a":"\ud800\n"}`, "escapes a lone surrogate"},
		{`{"a":"\ud800\ud800"}`, "escapes a lone surrogate"},
		{`{"\ud800":1}`, "escapes a lone surrogate"},
		{`{"a":"\ud800`, "escapes a lone surrogate"},
		{"{\"a\":\"\xff\"}", "is not valid UTF-8"},
		{"{\"a\":\"\xed\xa0\x80\"}", "is not valid UTF-8"}, // a surrogate encoded in UTF-8
		{`{"a":"\ud83d\ude00"}`, ""},
		{`{"a":"\\ud800"}`, ""},
		{`{"a":"\"\ud800"}`, "escapes a lone surrogate"},
		{`{"a":"\u00e9","b":"é"}`, ""},
		{`{"a":"\u12"}`, ""}, // not JSON: left to the parser
		{`ud800`, ""},
	}
	for _, tc := range tests {
		if got := notUnicode([]byte(tc.body)); got != tc.want {
			t.Errorf("notUnicode(%q) = %q, want %q", tc.body, got, tc.want)
		}
	}
}

// foldNames are member names that simple case folding makes equal, or
// nearly so: ASCII letters, the Kelvin sign, the long s, sharp s and its
// capital, dotted and dotless i, the three sigmas.
var foldNames = []string{
	"k", "K", "\u212a", "s", "S", "\u017f", "ss", "SS", "\u00df", "\u1e9e",
	"i", "I", "\u0130", "\u0131", "\u03c3", "\u03a3", "\u03c2", "\u00e9", "\u00c9",
	"qty", "QTY", "Qty", "q\u212aty", "sku", "\u017fku",
}

// TestDuplicateMemberMatchesEncodingJSON: two names are one member to
// duplicateMember exactly when encoding/json decodes the second into a
// struct field tagged with the first, for every pair of foldNames.
func TestDuplicateMemberMatchesEncodingJSON(t *testing.T) {
	for _, a := range foldNames {
		typ := reflect.StructOf([]reflect.StructField{{Name: "F", Type: reflect.TypeFor[int](), Tag: reflect.StructTag(`json:"` + a + `"`)}})
		for _, b := range foldNames {
			body, _ := json.Marshal(map[string]int{b: 7})
			v := reflect.New(typ)
			if err := json.Unmarshal(body, v.Interface()); err != nil {
				t.Fatal(err)
			}
			sameField := v.Elem().Field(0).Int() == 7
			pair := fmt.Sprintf(`{%q:1,%q:7}`, a, b)
			_, _, dup := duplicateMember([]byte(pair))
			if dup != sameField {
				t.Errorf("%s: duplicateMember says %v, but encoding/json reads %q as the field %q: %v", pair, dup, b, a, sameField)
			}
		}
	}
}

// FuzzDuplicateMember holds duplicateMember to a quadratic oracle that
// compares each name with every earlier one of its object by
// strings.EqualFold.
func FuzzDuplicateMember(f *testing.F) {
	for _, seed := range []string{
		`{"item":"book","qty":1,"QTY":5}`, `{"a":[{"x":1,"X":2}]}`, "{\"k\":1,\"\u212a\":2}",
		"{\"s\":{\"\u017f\":1}}", `{"a":{"b":1},"A":2}`, `[{"a":1},{"a":1}]`, `{"ss":1,"SS":2}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		first, second, dup := duplicateMember(body)
		wantFirst, wantSecond, wantDup := duplicateMemberOracle(body)
		if dup != wantDup || first != wantFirst || second != wantSecond {
			t.Fatalf("duplicateMember(%q) = %q, %q, %v; the oracle says %q, %q, %v", body, first, second, dup, wantFirst, wantSecond, wantDup)
		}
	})
}

// duplicateMemberOracle is duplicateMember the slow way: each object's
// names in a list, each new one compared with all of them.
func duplicateMemberOracle(body []byte) (string, string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	type level struct {
		object bool
		names  []string
		key    bool
	}
	var stack []*level
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", "", false
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			top := stack[n-1]
			if name, ok := tok.(string); ok && top.key {
				for _, prev := range top.names {
					if strings.EqualFold(prev, name) {
						return prev, name, true
					}
				}
				top.names = append(top.names, name)
				top.key = false
				continue
			}
			if d, ok := tok.(json.Delim); !ok || d == '{' || d == '[' {
				top.key = true
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &level{object: true, key: true})
		case json.Delim('['):
			stack = append(stack, &level{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return "", "", false
			}
		}
	}
}

// TestDuplicateMemberIsLinear: an object of 200,000 members, all
// different but for the last, is checked with one map, not by comparing
// each name with every other (which would take minutes).
func TestDuplicateMemberIsLinear(t *testing.T) {
	const n = 200_000
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, `"member%d":%d,`, i, i)
	}
	b.WriteString(`"MEMBER12345":0}`)
	first, second, dup := duplicateMember([]byte(b.String()))
	if !dup || first != "member12345" || second != "MEMBER12345" {
		t.Fatalf("duplicateMember = %q, %q, %v; want member12345, MEMBER12345", first, second, dup)
	}
}

func BenchmarkDuplicateMember(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		var s strings.Builder
		s.WriteString("{")
		for i := range n {
			if i > 0 {
				s.WriteString(",")
			}
			fmt.Fprintf(&s, `"Member%d":{"qty":%d}`, i, i)
		}
		s.WriteString("}")
		body := []byte(s.String())
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, _, dup := duplicateMember(body); dup {
					b.Fatal("a duplicate")
				}
			}
		})
	}
}
