package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/fileread"
	"github.com/replayguard/replayguard/internal/size"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/webhook"
)

// Policies a route can have.
const (
	// PolicyToken redeems a single-use token (Idempotency-Token header or
	// idempotency_token form field) for the route's purpose.
	PolicyToken = "token"
	// PolicyIdempotencyKey runs the app once per Idempotency-Key and
	// replays its response to duplicates.
	PolicyIdempotencyKey = "idempotency_key"
	// PolicySignature requires a signed request (RFC 9421) that was never
	// seen before.
	PolicySignature = "signature"
	// PolicyFingerprint collapses identical keyless requests (double
	// submits) inside a short window; requests with an Idempotency-Key
	// are handled as with PolicyIdempotencyKey.
	PolicyFingerprint = "fingerprint"
	// PolicyWebhook lets through only webhook deliveries its scheme's
	// provider signed (Standard Webhooks, Stripe, GitHub, Slack), and
	// runs the app once per delivery ID.
	PolicyWebhook = "webhook"
)

// Limits of a routes file.
const (
	// MaxRoutesFile is the largest routes file LoadRoutes reads: 1 MiB.
	MaxRoutesFile = 1 << 20
)

// Route is one entry of a routes file. Zero overrides mean the server's
// settings apply.
type Route struct {
	// Match is a Go net/http ServeMux pattern: "POST /orders",
	// "PUT /orders/{id}", "/api/". Its path also matches the spellings
	// frameworks map onto it: in any case, with a trailing slash or a
	// .ext suffix, and the others Gateway.ServeHTTP lists; two patterns
	// that would then match the same requests conflict.
	Match string
	// Policy is PolicyToken, PolicyIdempotencyKey, PolicySignature or
	// PolicyFingerprint.
	Policy string
	// Required refuses requests without an Idempotency-Key with 400
	// idempotency_key_missing (PolicyIdempotencyKey only). When false,
	// they reach the app without a record.
	Required bool
	// Purpose is what a token must have been issued for (PolicyToken
	// only); "default" when the file gives none, as in the token API.
	Purpose string
	// LockTTL overrides the processing lease (REPLAYGUARD_IDEMPOTENCY_LOCK_TTL).
	LockTTL time.Duration
	// Retention overrides how long a completed record is kept
	// (REPLAYGUARD_IDEMPOTENCY_RETENTION).
	Retention time.Duration
	// MaxBody overrides the body cap (REPLAYGUARD_IDEMPOTENCY_MAX_BODY),
	// in bytes: the largest response stored, and the largest request body
	// the gateway reads.
	MaxBody int
	// Window overrides the fingerprint window
	// (REPLAYGUARD_FINGERPRINT_WINDOW; PolicyFingerprint), or how far a
	// delivery's signed timestamp may lie from the gateway's time, either
	// side (PolicyWebhook; webhook.DefaultWindow, 5m, when zero; not for
	// the github scheme, which signs no time).
	Window time.Duration
	// FailOpen lets requests reach the app without a record when the
	// store cannot be reached (unsafe; PolicyIdempotencyKey and
	// PolicyFingerprint only). Defaults to false: 503 store_unavailable.
	FailOpen bool
	// Scheme is the signature scheme of a PolicyWebhook route:
	// "standard", "stripe", "github" or "slack" (see package webhook).
	Scheme string
	// SecretEnv names the environment variable holding a PolicyWebhook
	// route's secret, or several comma-separated (any one verifies, for
	// rotation). Exactly one of SecretEnv and SecretFile is set.
	SecretEnv string
	// SecretFile is the path of a file holding a PolicyWebhook route's
	// secrets, one per line (surrounding white space trimmed, blank lines
	// ignored). LoadRoutes resolves a relative path against the routes
	// file's directory.
	SecretFile string
	// Line is where the route starts in its file; 0 for routes built in
	// code.
	Line int
	// secretLine is the line of a webhook route's secret_env or
	// secret_file key, for the errors New finds reading the secrets.
	secretLine int
}

// fail is an error about key of rt, routes[i]: "line N: routes[i].key:
// message", N being the line of the secret's key for secret_env and
// secret_file, else the route's, without a line for routes built in
// code.
func (rt Route) fail(i int, key, format string, args ...any) error {
	line := rt.Line
	if (key == "secret_env" || key == "secret_file") && rt.secretLine != 0 {
		line = rt.secretLine
	}
	msg := fmt.Sprintf("routes[%d].%s: %s", i, key, fmt.Sprintf(format, args...))
	if line == 0 {
		return errors.New(msg)
	}
	return fmt.Errorf("line %d: %s", line, msg)
}

// routeKeys lists the keys a route may have, with the policies each
// applies to (nil: every policy).
var routeKeys = []struct {
	name     string
	policies []string
}{
	{"match", nil},
	{"policy", nil},
	{"required", []string{PolicyIdempotencyKey}},
	{"purpose", []string{PolicyToken}},
	{"lock_ttl", []string{PolicyToken, PolicyIdempotencyKey, PolicyFingerprint, PolicyWebhook}},
	{"retention", []string{PolicyToken, PolicyIdempotencyKey, PolicyFingerprint, PolicyWebhook}},
	{"max_body", []string{PolicyToken, PolicyIdempotencyKey, PolicyFingerprint, PolicyWebhook}},
	{"window", []string{PolicyFingerprint, PolicyWebhook}},
	{"fail_open", []string{PolicyIdempotencyKey, PolicyFingerprint}},
	{"scheme", []string{PolicyWebhook}},
	{"secret_env", []string{PolicyWebhook}},
	{"secret_file", []string{PolicyWebhook}},
}

var policies = []string{PolicyToken, PolicyIdempotencyKey, PolicySignature, PolicyFingerprint, PolicyWebhook}

// routesFile is the shape of a routes file; each route is decoded on its
// own so errors can name it.
type routesFile struct {
	Routes []ast.Node `yaml:"routes"`
}

// routeFields holds one route's values as YAML gave them; their types are
// checked here, so messages can speak of the file rather than of Go.
type routeFields struct {
	Match      any `yaml:"match"`
	Policy     any `yaml:"policy"`
	Required   any `yaml:"required"`
	Purpose    any `yaml:"purpose"`
	LockTTL    any `yaml:"lock_ttl"`
	Retention  any `yaml:"retention"`
	MaxBody    any `yaml:"max_body"`
	Window     any `yaml:"window"`
	FailOpen   any `yaml:"fail_open"`
	Scheme     any `yaml:"scheme"`
	SecretEnv  any `yaml:"secret_env"`
	SecretFile any `yaml:"secret_file"`
}

// LoadRoutes reads the routes file at path (see ParseRoutes), of at most
// MaxRoutesFile bytes. Errors name the path; those about its contents
// start with it.
func LoadRoutes(path string) ([]Route, error) {
	data, err := fileread.AtMost(path, MaxRoutesFile)
	if err != nil {
		return nil, err
	}
	routes, err := ParseRoutes(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i := range routes {
		if f := routes[i].SecretFile; f != "" && !filepath.IsAbs(f) {
			routes[i].SecretFile = filepath.Join(filepath.Dir(path), f)
		}
	}
	return routes, nil
}

// ParseRoutes reads a routes file:
//
//	routes:
//	  - match: "POST /orders"          # Go net/http ServeMux pattern syntax
//	    policy: idempotency_key        # token | idempotency_key | signature | fingerprint
//	    required: true                 # idempotency_key: reject requests without a key
//	  - match: "POST /checkout"
//	    policy: token
//	    purpose: checkout
//	  - match: "POST /hooks/stripe"
//	    policy: webhook                # a provider's signed deliveries, each run once
//	    scheme: stripe                 # standard | stripe | github | slack
//	    secret_env: STRIPE_WEBHOOK_SECRET  # or secret_file: /run/secrets/stripe
//
// with the optional per-route keys lock_ttl, retention and window (Go
// durations such as 30s), max_body (bytes, or with a KiB or MiB suffix)
// and fail_open (true or false). A webhook route needs scheme and exactly
// one of secret_env (a variable holding a secret, or several
// comma-separated) and secret_file (one secret per line); the secrets are
// read by New, not here. It is strict: an unknown key, a key the
// route's policy does not use, a value of the wrong type, an invalid
// pattern and two patterns that ServeMux would refuse to register
// together are errors naming the line and the route (routes[i], counted
// from 0). An empty file has no routes.
func ParseRoutes(data []byte) ([]Route, error) {
	var file routesFile
	if err := yaml.UnmarshalWithOptions(data, &file, yaml.DisallowUnknownField()); err != nil {
		return nil, yamlError(err, "")
	}
	routes := make([]Route, 0, len(file.Routes))
	check, folded := http.NewServeMux(), http.NewServeMux()
	for i, node := range file.Routes {
		rt, err := parseRoute(node, fmt.Sprintf("routes[%d]", i))
		if err != nil {
			return nil, err
		}
		if err := register(check, rt.Match, http.NotFoundHandler()); err != nil {
			return nil, fmt.Errorf("line %d: routes[%d].match: %w", keyLine(node, "match"), i, describeRegisterError(err, rt, routes))
		}
		if _, err := registerFolded(folded, rt, routes, http.NotFoundHandler()); err != nil {
			return nil, fmt.Errorf("line %d: routes[%d].match: %w", keyLine(node, "match"), i, err)
		}
		routes = append(routes, rt)
	}
	return routes, nil
}

func parseRoute(node ast.Node, name string) (Route, error) {
	line := node.GetToken().Position.Line
	if _, ok := node.(ast.MapNode); !ok {
		return Route{}, fmt.Errorf("line %d: %s: want a mapping with match and policy", line, name)
	}
	var f routeFields
	if err := yaml.NodeToValue(node, &f, yaml.DisallowUnknownField()); err != nil {
		return Route{}, yamlError(err, name)
	}
	rt := Route{Line: line}
	fail := func(key, format string, args ...any) error {
		return fmt.Errorf("line %d: %s.%s: %s", keyLine(node, key), name, key, fmt.Sprintf(format, args...))
	}
	var ok bool
	if f.Match == nil {
		return Route{}, fmt.Errorf("line %d: %s: match is required", line, name)
	}
	if rt.Match, ok = f.Match.(string); !ok || strings.TrimSpace(rt.Match) == "" {
		return Route{}, fail("match", "want a ServeMux pattern such as \"POST /orders\", got %s", describe(f.Match))
	}
	if f.Policy == nil {
		return Route{}, fmt.Errorf("line %d: %s: policy is required (%s)", line, name, strings.Join(policies, ", "))
	}
	if rt.Policy, ok = f.Policy.(string); !ok || !slices.Contains(policies, rt.Policy) {
		return Route{}, fail("policy", "want one of %s, got %s", strings.Join(policies, ", "), describe(f.Policy))
	}
	set := map[string]any{
		"required": f.Required, "purpose": f.Purpose, "lock_ttl": f.LockTTL, "retention": f.Retention,
		"max_body": f.MaxBody, "window": f.Window, "fail_open": f.FailOpen,
		"scheme": f.Scheme, "secret_env": f.SecretEnv, "secret_file": f.SecretFile,
	}
	for _, k := range routeKeys {
		if set[k.name] != nil && k.policies != nil && !slices.Contains(k.policies, rt.Policy) {
			return Route{}, fail(k.name, "applies only to policy %s, not %s", strings.Join(k.policies, ", "), rt.Policy)
		}
	}
	var err error
	if f.Required != nil {
		if rt.Required, ok = f.Required.(bool); !ok {
			return Route{}, fail("required", "want true or false, got %s", describe(f.Required))
		}
	}
	if rt.Policy == PolicyToken {
		rt.Purpose = "default"
		if f.Purpose != nil {
			if rt.Purpose, ok = f.Purpose.(string); !ok || !token.ValidPurpose(rt.Purpose) {
				return Route{}, fail("purpose", "want a token purpose of 1 to 64 characters from A-Z a-z 0-9 . _ : / -, got %s", describe(f.Purpose))
			}
		}
	}
	if rt.LockTTL, err = durationValue(f.LockTTL, idempotency.MinLockTTL); err != nil {
		return Route{}, fail("lock_ttl", "%v", err)
	}
	if rt.Retention, err = durationValue(f.Retention, time.Millisecond); err != nil {
		return Route{}, fail("retention", "%v", err)
	}
	if rt.Window, err = durationValue(f.Window, time.Millisecond); err != nil {
		return Route{}, fail("window", "%v", err)
	}
	if f.MaxBody != nil {
		if rt.MaxBody, err = parseMaxBody(scalarText(f.MaxBody)); err != nil {
			return Route{}, fail("max_body", "%v", err)
		}
	}
	if f.FailOpen != nil {
		if rt.FailOpen, ok = f.FailOpen.(bool); !ok {
			return Route{}, fail("fail_open", "want true or false, got %s", describe(f.FailOpen))
		}
	}
	if rt.Policy == PolicyWebhook {
		if err := parseWebhook(&rt, f, name, fail); err != nil {
			return Route{}, err
		}
		key := "secret_env"
		if f.SecretFile != nil {
			key = "secret_file"
		}
		rt.secretLine = keyLine(node, key)
	}
	return rt, nil
}

// parseWebhook reads the keys of a webhook route: its scheme, and where
// its secrets are (exactly one of secret_env and secret_file).
func parseWebhook(rt *Route, f routeFields, name string, fail func(key, format string, args ...any) error) error {
	var schemes []string
	for _, s := range webhook.Schemes {
		schemes = append(schemes, string(s))
	}
	if f.Scheme == nil {
		return fmt.Errorf("line %d: %s: policy webhook needs scheme (%s)", rt.Line, name, strings.Join(schemes, ", "))
	}
	var ok bool
	if rt.Scheme, ok = f.Scheme.(string); !ok || !slices.Contains(schemes, rt.Scheme) {
		return fail("scheme", "want one of %s, got %s", strings.Join(schemes, ", "), describe(f.Scheme))
	}
	switch {
	case rt.Scheme == string(webhook.GitHub) && f.Window != nil:
		return fail("window", "scheme github signs no time, so it has no window")
	case f.Window != nil && rt.Window < time.Second:
		return fail("window", "must be at least 1s on a webhook route (signed timestamps are whole seconds), got %s", describe(f.Window))
	}
	switch {
	case f.SecretEnv != nil && f.SecretFile != nil:
		return fail("secret_env", "set secret_env or secret_file, not both")
	case f.SecretEnv != nil:
		if rt.SecretEnv, ok = f.SecretEnv.(string); !ok || !envName(rt.SecretEnv) {
			return fail("secret_env", "want the name of an environment variable, such as STRIPE_WEBHOOK_SECRET, got %s", describe(f.SecretEnv))
		}
	case f.SecretFile != nil:
		if rt.SecretFile, ok = f.SecretFile.(string); !ok || strings.TrimSpace(rt.SecretFile) == "" {
			return fail("secret_file", "want the path of a file with one secret per line, got %s", describe(f.SecretFile))
		}
	default:
		return fail("secret_env", "policy webhook needs secret_env (an environment variable holding the secret, or several comma-separated) or secret_file (a file with one secret per line)")
	}
	return nil
}

// envName reports whether s is a portable environment variable name:
// letters, digits and underscores, not starting with a digit.
func envName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '_' && (c < '0' || c > '9') && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// durationValue reads an optional duration of at least least; nil is 0.
func durationValue(v any, least time.Duration) (time.Duration, error) {
	if v == nil {
		return 0, nil
	}
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("want a Go duration with a unit, such as 30s or 5m, got %s", describe(v))
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want a Go duration with a unit, such as 30s or 5m, got %s", describe(v))
	}
	if d < least {
		return 0, fmt.Errorf("must be at least %v, got %s", least, s)
	}
	return d, nil
}

// parseMaxBody reads a body cap, at most idempotency.MaxBodyLimit.
func parseMaxBody(s string) (int, error) {
	n, err := size.Parse(s, idempotency.MaxBodyLimit)
	return int(n), err
}

// register adds pattern to mux, turning ServeMux's panic on an invalid
// or conflicting pattern into an error.
func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			if e, ok := v.(error); ok {
				err = e
				return
			}
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// registerFolded adds rt's folded pattern (foldPattern) to mux with h
// and returns it. Its errors explain why rt cannot join the routes before
// it once every spelling of a path matches: the earlier route whose
// folded pattern it conflicts with (POST /Orders after POST /orders), or
// a path that no request can spell.
func registerFolded(mux *http.ServeMux, rt Route, before []Route, h http.Handler) (string, error) {
	fp, err := foldPattern(rt.Match)
	if err != nil {
		return "", fmt.Errorf("%q has a path that requests cannot spell: %s", rt.Match, strings.TrimPrefix(err.Error(), problem.ErrBadRequest.Error()+": "))
	}
	if err := register(mux, fp, h); err != nil {
		for j, prev := range before {
			pf, perr := foldPattern(prev.Match)
			pair := http.NewServeMux()
			if perr != nil || register(pair, pf, http.NotFoundHandler()) != nil {
				continue
			}
			if register(pair, fp, http.NotFoundHandler()) != nil {
				return "", fmt.Errorf("%q conflicts with routes[%d] %q (line %d) once paths match in any case, without trailing dots, spaces or slash (as %q and %q): a request could be read as either", rt.Match, j, prev.Match, prev.Line, fp, pf)
			}
		}
		return "", fmt.Errorf("%q, matched in every spelling as %q: %v", rt.Match, fp, err)
	}
	return fp, nil
}

// describeRegisterError explains why rt's pattern could not join the
// routes before it: the earlier route it conflicts with, or ServeMux's
// reason (an invalid pattern).
func describeRegisterError(err error, rt Route, before []Route) error {
	for j, prev := range before {
		pair := http.NewServeMux()
		if register(pair, prev.Match, http.NotFoundHandler()) != nil {
			continue
		}
		if perr := register(pair, rt.Match, http.NotFoundHandler()); perr != nil {
			why := "both match the same requests and neither is more specific"
			if _, d, ok := strings.Cut(perr.Error(), "\n"); ok && d != "" {
				why = d
			}
			return fmt.Errorf("%q conflicts with routes[%d] %q (line %d): %s", rt.Match, j, prev.Match, prev.Line, why)
		}
	}
	return fmt.Errorf("%q is not a ServeMux pattern ([METHOD ][HOST]/[PATH], such as \"POST /orders/{id}\"): %v", rt.Match, err)
}

// keyLine is the line of key in a mapping node, else of the node.
func keyLine(node ast.Node, key string) int {
	if m, ok := node.(ast.MapNode); ok {
		for it := m.MapRange(); it.Next(); {
			if k, ok := it.Key().(ast.ScalarNode); ok && fmt.Sprint(k.GetValue()) == key {
				return k.GetToken().Position.Line
			}
		}
	}
	return node.GetToken().Position.Line
}

// yamlError turns a YAML library error into "line N: [where: ]message".
func yamlError(err error, where string) error {
	if where != "" {
		where += ": "
	}
	var ye yaml.Error
	if errors.As(err, &ye) && ye.GetToken() != nil {
		msg := ye.GetMessage()
		if strings.HasPrefix(msg, "unknown field") {
			var keys []string
			for _, k := range routeKeys {
				keys = append(keys, k.name)
			}
			want := "routes"
			if where != "" {
				want = strings.Join(keys, ", ")
			}
			msg += " (want " + want + ")"
		}
		return fmt.Errorf("line %d: %s%s", ye.GetToken().Position.Line, where, msg)
	}
	return fmt.Errorf("%s%v", where, err)
}

// describe quotes a YAML value for a message.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "nothing"
	case string:
		return strconv.Quote(v)
	case bool, int, int64, uint64, float64:
		return fmt.Sprint(v)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("a %T", v)
}

// scalarText is a scalar's text: max_body may be an integer or a string.
func scalarText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case int, int64, uint64:
		return fmt.Sprint(v)
	}
	return describe(v)
}
