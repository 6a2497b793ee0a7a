package guard

import "testing"

func TestDuplicateMember(t *testing.T) {
	tests := []struct {
		body string
		want string // "" for none
	}{
		{`{"amount":1,"amount":1000}`, "amount"},
		{`{"a":{"b":1,"b":2}}`, "b"},
		{`[{"a":1,"a":2}]`, "a"},
		{`{"a":"x","b":"a","a":3}`, "a"},
		{`{"a":[{"x":1},{"x":2}],"b":1}`, ""},
		{`{"a":1,"b":{"a":2}}`, ""},
		{`{"a":"b","b":"a"}`, ""},
		{`{"a":{},"b":[],"c":null}`, ""},
		{`"a"`, ""},
		{`not json`, ""},
		{`{"a":1,`, ""},
	}
	for _, tc := range tests {
		name, dup := duplicateMember([]byte(tc.body))
		if dup != (tc.want != "") || name != tc.want {
			t.Errorf("duplicateMember(%s) = %q, %v; want %q", tc.body, name, dup, tc.want)
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
