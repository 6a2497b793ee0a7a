package gateway_test

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/gateway"
)

// TestFoldPath: the spellings frameworks map onto one path fold to it;
// those that lenient readers read in ways of their own are refused.
// Inputs are request paths decoded once, as Request.URL.Path holds them;
// they are written here as sent and decoded first.
func TestFoldPath(t *testing.T) {
	tests := []struct {
		name, sent string
		want       string // the folded path, or the refusal's reason
		refused    bool
	}{
		{"a folded path is itself", "/orders", "/orders", false},
		{"the root", "/", "/", false},
		{"capitals", "/ORDERS", "/orders", false},
		{"mixed case in a subtree", "/Admin/X", "/admin/x", false},
		{"a trailing slash", "/orders/", "/orders", false},
		{"an encoded trailing slash", "/orders%2f", "/orders", false},
		{"a .ext suffix is kept (extCuts cuts it)", "/orders.json", "/orders.json", false},
		{"a trailing dot", "/orders.", "/orders", false},
		{"a trailing dot inside", "/admin./x", "/admin/x", false},
		{"an encoded trailing dot", "/admin%2e/x", "/admin/x", false},
		{"an encoded trailing dot in capitals", "/admin%2E/x", "/admin/x", false},
		{"a trailing space", "/orders%20", "/orders", false},
		{"a trailing space inside", "/admin%20/x", "/admin/x", false},
		{"dots and spaces after a name", "/admin.%20./x", "/admin/x", false},
		{"a space inside stays", "/a%20b", "/a b", false},
		{"repeated slashes", "//orders//x", "/orders/x", false},
		{"dot segments", "/x/./../orders", "/orders", false},
		{"a dot-dot above the root", "/../orders", "/orders", false},
		{"a leading dot stays", "/.well-known/x", "/.well-known/x", false},
		{"a double-encoded letter", "/%256Frders", "/orders", false},
		{"a triple-encoded dot segment", "/x/%25252e%25252e/orders", "/orders", false},
		{"an encoded percent alone stays", "/discount/100%25", "/discount/100%", false},
		{"a letter encoded four times", "/%25252541", "/a", false},
		{"a letter encoded five times", "/%2525252541", "more than 4 times", true},
		{"a letter encoded 2000 times", "/%25" + strings.Repeat("25", 2000) + "41", "more than 4 times", true},
		{"an encoded query mark ends the path", "/orders%3Fx=1", "/orders", false},
		{"an encoded hash ends the path", "/orders%23x", "/orders", false},
		{"a fullwidth solidus is a slash", "/%EF%BC%8Fadmin/x", "/admin/x", false},
		{"fullwidth letters", "/%EF%BC%AF%EF%BD%92%EF%BD%84%EF%BD%85%EF%BD%92%EF%BD%93", "/orders", false},
		{"a long s", "/order%C5%BF", "/orders", false},
		{"a Kelvin sign", "/%E2%84%AAey", "/key", false},
		{"a dotless i", "/adm%C4%B1n/x", "/admin/x", false},
		{"a dotted capital I", "/adm%C4%B0n/x", "/admin/x", false},
		{"a two dot leader is a dot-dot segment", "/x/%E2%80%A5/orders", "/orders", false},
		{"a one dot leader is a trailing dot", "/orders%E2%80%A4", "/orders", false},
		{"a no-break space is a trailing space", "/admin%C2%A0/x", "/admin/x", false},
		{"an ideographic space is a trailing space", "/admin%E3%80%80/x", "/admin/x", false},
		{"a fullwidth full stop before a suffix", "/orders%EF%BC%8Ejson", "/orders.json", false},
		{"letters of other scripts stay", "/caf%C3%A9/%E6%97%A5%E6%9C%AC", "/café/日本", false},
		{"an overlong slash", "/admin%c0%afx", "not UTF-8", true},
		{"a three-byte overlong slash", "/admin%e0%80%afx", "not UTF-8", true},
		{"a Latin-1 letter", "/caf%E9", "not UTF-8", true},
		{"a double-encoded overlong slash", "/admin%25c0%25afx", "not UTF-8", true},
		{"three dots", "/.../orders", "only dots and spaces", true},
		{"a dot and a space", "/x/.%20/orders", "only dots and spaces", true},
		{"a space alone", "/x/%20/orders", "only dots and spaces", true},
		{"a fullwidth backslash", "/x/..%EF%BC%BCorders", "backslash", true},
		{"a fullwidth semicolon", "/orders%EF%BC%9Bx", "semicolon", true},
		{"a double-encoded NUL", "/orders%2500", "control character", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := url.ParseRequestURI(tc.sent)
			if err != nil {
				t.Fatal(err)
			}
			got, err := gateway.FoldPath(u.Path)
			switch {
			case tc.refused && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("= %q, %v; want refused for %q", got, err, tc.want)
			case !tc.refused && (err != nil || got != tc.want):
				t.Fatalf("= %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestFoldPathIsStable: a folded path folds to itself, so that patterns
// and paths folded once meet.
func TestFoldPathIsStable(t *testing.T) {
	for _, p := range []string{"/ORDERS/", "/Admin./x%20", "/%EF%BC%8Fadmin", "/x/%E2%80%A5/orders", "/caf%C3%A9", "/adm%C4%B0n", "/%E2%84%AA"} {
		u, _ := url.ParseRequestURI(p)
		once, err := gateway.FoldPath(u.Path)
		if err != nil {
			t.Fatal(err)
		}
		if twice, err := gateway.FoldPath(once); err != nil || twice != once {
			t.Errorf("%s: once %q, twice %q, %v", p, once, twice, err)
		}
	}
}

func TestExtCuts(t *testing.T) {
	tests := []struct {
		path string
		want []string
	}{
		{"/orders", nil},
		{"/orders.json", []string{"/orders"}},
		{"/a/orders.tar.gz", []string{"/a/orders", "/a/orders.tar"}},
		{"/orders .json", []string{"/orders"}},
		{"/.well-known", nil},
		{"/.well-known.json", []string{"/.well-known"}},
		{"/v1.2/orders", nil},
		{"/", nil},
	}
	for _, tc := range tests {
		if got := gateway.ExtCuts(tc.path); !slices.Equal(got, tc.want) {
			t.Errorf("ExtCuts(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestFoldPattern(t *testing.T) {
	tests := []struct{ pattern, want string }{
		{"POST /orders", "POST /orders"},
		{"POST /Orders", "POST /orders"},
		{"POST\t/Orders/", "POST\t/orders/"},
		{"/admin/", "/admin/"},
		{"/", "/"},
		{"/{$}", "/{$}"},
		{"GET /orders/{$}", "GET /orders"},
		{"PUT /Orders/{ID}/Pay", "PUT /orders/{ID}/pay"},
		{"/files/{path...}", "/files/{path...}"},
		{"POST Shop.Test/Cart", "POST shop.test/cart"},
		{"/a%20b/", "/a%20b/"},
		{"/%7Bx%7D", "/%7Bx%7D"},
		{"/report.PDF", "/report.pdf"},
	}
	for _, tc := range tests {
		if got, err := gateway.FoldPattern(tc.pattern); err != nil || got != tc.want {
			t.Errorf("FoldPattern(%q) = %q, %v; want %q", tc.pattern, got, err, tc.want)
		}
	}
}

// TestSpellingsShareTheRoutesRecord: a spelling of a route runs the
// route's policy under the route's pattern: a key sent to /ORDERS.json
// runs the app once, its retry is replayed, and the same key on another
// spelling of the route finds the same record and cannot run the app
// again (the fingerprint covers the path as sent: 422).
func TestSpellingsShareTheRoutesRecord(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), routingRoutes, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens))
	var first string
	for i, tc := range []struct {
		path, code string
		status     int
		replayed   bool
	}{
		{"/ORDERS.json", "", 201, false},
		{"/ORDERS.json", "", 201, true},
		{"/orders", "idempotency_key_reused", 422, false},
		{"/Orders/", "idempotency_key_reused", 422, false},
	} {
		status, h, body := do(t, newRequest(t, "POST", gw.URL+tc.path, `{"qty":1}`, "Idempotency-Key", "k-spelled", "Content-Type", "application/json"))
		if status != tc.status || problemCode(body) != tc.code || tc.replayed != (h.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("%d %s: = %d replayed=%q %s", i, tc.path, status, h.Get("Idempotent-Replayed"), body)
		}
		if i == 0 {
			first = body
		} else if tc.replayed && body != first {
			t.Fatalf("%s: replayed %s, want %s", tc.path, body, first)
		}
	}
	if got := a.requests(); len(got) != 1 || got[0].Path != "/ORDERS.json" {
		t.Fatalf("the app got %+v, want the first request only, as sent", got)
	}
}

// TestAmbiguousSpellings: a path that matches one route as sent and
// another once folded is refused, since the app may read it as either.
func TestAmbiguousSpellings(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), `routes:
  - {match: "PUT /orders/{id}", policy: idempotency_key, required: true}
  - {match: "PUT /orders/new", policy: token, purpose: new}
`, gateway.WithKeeper(d.keeper), gateway.WithTokens(d.tokens))
	for _, tc := range []struct {
		name, path string
		code       string
		detail     string
	}{
		{"an ID in capitals that is another route", "/orders/NEW", "invalid_request", "another spelling of a route"},
		{"an ID with a suffix that is another route", "/orders/new.json", "invalid_request", "another spelling of a route"},
		{"an ID in capitals", "/orders/A7", "idempotency_key_missing", ""},
		{"an ID with a suffix", "/orders/7.json", "idempotency_key_missing", ""},
		{"the other route in capitals", "/ORDERS/NEW", "invalid_request", "Idempotency-Token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := do(t, newRequest(t, "PUT", gw.URL+tc.path, ""))
			if status != http.StatusBadRequest || problemCode(body) != tc.code || !strings.Contains(body, tc.detail) {
				t.Fatalf("= %d %s, want 400 %s saying %q", status, body, tc.code, tc.detail)
			}
		})
	}
	if got := a.requests(); len(got) != 0 {
		t.Fatalf("the app ran: %+v", got)
	}
}

// TestSpellingConflicts: two routes that are one path once spellings
// fold together are refused, in a file and in code.
func TestSpellingConflicts(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"two cases of one path", "routes:\n  - {match: \"POST /orders\", policy: token}\n  - {match: \"POST /Orders\", policy: idempotency_key}\n",
			`line 3: routes[1].match: "POST /Orders" conflicts with routes[0] "POST /orders" (line 2) once paths match in any case`},
		{"a path and its trailing slash", "routes:\n  - {match: \"POST /orders\", policy: token}\n  - {match: \"POST /orders/{$}\", policy: idempotency_key}\n",
			`routes[1].match: "POST /orders/{$}" conflicts with routes[0] "POST /orders" (line 2)`},
		{"a path no request can spell", "routes:\n  - {match: \"POST /x/.../orders\", policy: token}\n",
			`line 2: routes[0].match: "POST /x/.../orders" has a path that requests cannot spell: a path segment is only dots`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.ParseRoutes([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v\nlacks %q", err, tc.want)
			}
		})
	}
	d := newDeps(t)
	_, err := gateway.New(&url.URL{Scheme: "http", Host: "app.test"}, []gateway.Route{
		{Match: "/Admin/", Policy: gateway.PolicyIdempotencyKey},
		{Match: "/admin/", Policy: gateway.PolicyIdempotencyKey},
	}, quiet, gateway.WithKeeper(d.keeper))
	if want := `gateway: routes[1]: "/admin/" conflicts with routes[0] "/Admin/"`; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("New: %v, want %q", err, want)
	}
}
