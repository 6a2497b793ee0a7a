package problem

import (
	"net/http"
	"strings"
	"testing"
)

// TestForwardAuthCoversTheTable checks every problem in the table, so
// that no code, including one added later, reaches nginx as a status it
// turns into 500 by mistake: a forward-auth refusal is 401 for a missing
// or wrong API key only, 403 for every other client error, and a server
// error keeps its status.
func TestForwardAuthCoversTheTable(t *testing.T) {
	for _, spec := range append(table[:len(table):len(table)], internal) {
		p := For(spec.err)
		got := p.ForwardAuth().Status
		switch {
		case got == http.StatusUnauthorized:
			if p.Code != "unauthorized" {
				t.Errorf("%s: 401, but only unauthorized may be", p.Code)
			}
		case got == http.StatusForbidden:
			if p.Status >= 500 || p.Code == "unauthorized" {
				t.Errorf("%s (%d): 403", p.Code, p.Status)
			}
		case got >= 500:
			if got != p.Status {
				t.Errorf("%s: %d, want the table's %d", p.Code, got, p.Status)
			}
		default:
			t.Errorf("%s (%d): forward-auth status %d, which nginx auth_request does not understand", p.Code, p.Status, got)
		}
	}
}

// TestDetailsReadAsOne checks the rule on spec: every fixed detail is
// written like the details errors carry, so a client never sees two
// styles.
func TestDetailsReadAsOne(t *testing.T) {
	for _, spec := range append(table[:len(table):len(table)], internal) {
		d := spec.detail
		switch {
		case d == "":
			t.Errorf("%s: no detail", spec.code)
		case d[0] < 'a' || d[0] > 'z':
			t.Errorf("%s: detail %q starts with %q, want a lower-case letter", spec.code, d, d[0])
		case strings.HasSuffix(d, "."):
			t.Errorf("%s: detail %q ends with a period", spec.code, d)
		case strings.Contains(d, ". "):
			t.Errorf("%s: detail %q has two sentences; join clauses with semicolons", spec.code, d)
		}
	}
}
