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
