package gateway_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/gateway"
)

// issueExample is the routes file of the issue, exactly.
const issueExample = `routes:
  - match: "POST /orders"          # Go net/http ServeMux pattern syntax
    policy: idempotency_key        # token | idempotency_key | signature | fingerprint
    required: true                 # idempotency_key: reject requests without a key
  - match: "POST /checkout"
    policy: token
    purpose: checkout
`

func TestParseRoutesValid(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []gateway.Route
	}{
		{"the issue's example", issueExample, []gateway.Route{
			{Match: "POST /orders", Policy: "idempotency_key", Required: true, Line: 2},
			{Match: "POST /checkout", Policy: "token", Purpose: "checkout", Line: 5},
		}},
		{"every override", `routes:
  - match: "PUT /orders/{id}"
    policy: idempotency_key
    lock_ttl: 30s
    retention: 1h
    max_body: 512KiB
    fail_open: true
  - match: "POST example.com/comments"
    policy: fingerprint
    window: 5s
    max_body: 4096
  - match: "/payments/"
    policy: signature
  - match: "POST /checkout"
    policy: token
    retention: 10m
`, []gateway.Route{
			{Match: "PUT /orders/{id}", Policy: "idempotency_key", LockTTL: 30 * time.Second, Retention: time.Hour, MaxBody: 512 << 10, FailOpen: true, Line: 2},
			{Match: "POST example.com/comments", Policy: "fingerprint", Window: 5 * time.Second, MaxBody: 4096, Line: 8},
			{Match: "/payments/", Policy: "signature", Line: 12},
			{Match: "POST /checkout", Policy: "token", Purpose: "default", Retention: 10 * time.Minute, Line: 14},
		}},
		{"a more specific pattern beside a general one", `routes:
  - {match: "POST /orders/{id}", policy: idempotency_key}
  - {match: "POST /orders/special", policy: token, purpose: special}
`, []gateway.Route{
			{Match: "POST /orders/{id}", Policy: "idempotency_key", Line: 2},
			{Match: "POST /orders/special", Policy: "token", Purpose: "special", Line: 3},
		}},
		{"an empty file has no routes", "", []gateway.Route{}},
		{"an empty list has no routes", "routes: []\n", []gateway.Route{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := gateway.ParseRoutes([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseRoutesInvalid(t *testing.T) {
	route := func(extra string) string {
		return "routes:\n  - match: \"POST /orders\"\n    policy: idempotency_key\n" + extra
	}
	tests := []struct {
		name string
		yaml string
		want string // the message must contain this
	}{
		{"unknown key in a route", route("    polcy: token\n"), `line 4: routes[0]: unknown field "polcy"`},
		{"unknown top-level key", "route:\n  - match: /x\n", `line 1: unknown field "route"`},
		{"top level is a list", "- match: /x\n", "line 1:"},
		{"routes is a mapping", "routes:\n  match: /x\n", "line 2:"},
		{"a route is a string", "routes:\n  - POST /orders\n", "line 2: routes[0]: want a mapping"},
		{"duplicate key", route("    required: true\n    required: false\n"), `line 5: mapping key "required" already defined`},
		{"match missing", "routes:\n  - policy: token\n", "line 2: routes[0]: match is required"},
		{"match not a string", "routes:\n  - match: [POST, /x]\n    policy: token\n", "line 2: routes[0].match: want a ServeMux pattern"},
		{"invalid pattern", "routes:\n  - match: \"POST /o/{id\"\n    policy: token\n", `line 2: routes[0].match: "POST /o/{id" is not a ServeMux pattern`},
		{"pattern without a slash", "routes:\n  - match: \"POST orders\"\n    policy: token\n", "routes[0].match:"},
		{"policy missing", "routes:\n  - match: /x\n", "line 2: routes[0]: policy is required"},
		{"unknown policy", "routes:\n  - match: /x\n    policy: captcha\n", `line 3: routes[0].policy: want one of token, idempotency_key, signature, fingerprint, webhook, got "captcha"`},
		{"required not a bool", route("    required: yes\n"), `line 4: routes[0].required: want true or false, got "yes"`},
		{"required on a token route", "routes:\n  - match: /x\n    policy: token\n    required: true\n", "line 4: routes[0].required: applies only to policy idempotency_key, not token"},
		{"purpose on an idempotency route", route("    purpose: checkout\n"), "line 4: routes[0].purpose: applies only to policy token"},
		{"bad purpose", "routes:\n  - match: /x\n    policy: token\n    purpose: \"check out\"\n", `line 4: routes[0].purpose: want a token purpose`},
		{"duration without unit", route("    lock_ttl: 30\n"), "line 4: routes[0].lock_ttl: want a Go duration with a unit"},
		{"lock_ttl under a second", route("    lock_ttl: 100ms\n"), "line 4: routes[0].lock_ttl: must be at least 1s"},
		{"negative retention", route("    retention: -1h\n"), "line 4: routes[0].retention: must be at least"},
		{"bad retention", route("    retention: a day\n"), "line 4: routes[0].retention: want a Go duration"},
		{"window on an idempotency_key route", route("    window: 2s\n"), "line 4: routes[0].window: applies only to policy fingerprint"},
		{"bad window", "routes:\n  - match: /x\n    policy: fingerprint\n    window: soon\n", "line 4: routes[0].window: want a Go duration"},
		{"max_body with a decimal unit", route("    max_body: 1MB\n"), `line 4: routes[0].max_body: "1MB" is not a size`},
		{"max_body zero", route("    max_body: 0\n"), `routes[0].max_body: "0" is not a size`},
		{"max_body over 64MiB", route("    max_body: 65MiB\n"), `routes[0].max_body: "65MiB" is not a size`},
		{"fail_open not a bool", route("    fail_open: \"true\"\n"), `line 4: routes[0].fail_open: want true or false, got "true"`},
		{"fail_open on a token route", "routes:\n  - match: /x\n    policy: token\n    fail_open: true\n", "routes[0].fail_open: applies only to policy idempotency_key, fingerprint"},
		{"overrides on a signature route", "routes:\n  - match: /x\n    policy: signature\n    max_body: 1KiB\n", "routes[0].max_body: applies only to policy token, idempotency_key, fingerprint"},
		{"the same pattern twice", "routes:\n  - {match: \"POST /orders\", policy: token}\n  - {match: \"POST /orders\", policy: idempotency_key}\n",
			`line 3: routes[1].match: "POST /orders" conflicts with routes[0] "POST /orders" (line 2)`},
		{"conflicting wildcards", "routes:\n  - {match: \"POST /orders/{id}\", policy: token}\n  - {match: \"/x\", policy: token}\n  - {match: \"POST /orders/{name}\", policy: token}\n",
			`line 4: routes[2].match: "POST /orders/{name}" conflicts with routes[0] "POST /orders/{id}" (line 2)`},
		{"patterns neither more specific", "routes:\n  - {match: \"POST /orders/{id}/items\", policy: token}\n  - {match: \"POST /orders/new/{part}\", policy: token}\n",
			`routes[1].match: "POST /orders/new/{part}" conflicts with routes[0]`},
		{"a later route's error is found", issueExample + "  - match: /x\n    policy: token\n    bogus: 1\n", `line 10: routes[2]: unknown field "bogus"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			routes, err := gateway.ParseRoutes([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error; routes %+v", routes)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q\nlacks %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "gateway.") || strings.Contains(err.Error(), "registered at") {
				t.Fatalf("error speaks of Go, not of the file: %q", err)
			}
		})
	}
}

func TestLoadRoutes(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(good, []byte(issueExample), 0o600); err != nil {
		t.Fatal(err)
	}
	if routes, err := gateway.LoadRoutes(good); err != nil || len(routes) != 2 {
		t.Fatalf("LoadRoutes = %v, %v", routes, err)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("routes:\n  - match: /x\n    policy: nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := gateway.LoadRoutes(bad); err == nil || !strings.HasPrefix(err.Error(), bad+": line 3: routes[0].policy") {
		t.Fatalf("error %v does not start with the path and line", err)
	}

	huge := filepath.Join(dir, "huge.yaml")
	if err := os.WriteFile(huge, []byte("routes: []\n"+strings.Repeat("# padding\n", gateway.MaxRoutesFile/10+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := gateway.LoadRoutes(huge); err == nil || err.Error() != huge+" is over 1048576 bytes" {
		t.Fatalf("a file over the limit: %v, want an error naming the file and the limit", err)
	}

	missing := filepath.Join(dir, "missing.yaml")
	if _, err := gateway.LoadRoutes(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("a missing file: %v, want fs.ErrNotExist naming the file", err)
	}
}
