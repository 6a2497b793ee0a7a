package gateway_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/store/storetest"
	"github.com/replayguard/replayguard/webhook"
)

// Secrets of the webhook tests. They contain "s3cr3t" so that a test can
// tell whether one leaked into an error or a log line.
const (
	hookSecret    = "whsec_czNjcjN0LW9mLXRoZS1zdGFuZGFyZC1yb3V0ZQ=="
	hookSecretOld = "whsec_czNjcjN0LW9mLWxhc3QteWVhcg=="
	githubSecret  = "s3cr3t of the github route"
	slackSecret   = "s3cr3t of the slack route"
)

// leaked reports whether s shows any of the test secrets, as they are or
// decoded.
func leaked(s string) bool {
	return strings.Contains(s, "s3cr3t") || strings.Contains(s, "czNjcjN0")
}

func TestParseWebhookRoutes(t *testing.T) {
	routes, err := gateway.ParseRoutes([]byte(`routes:
  - match: "POST /hooks/standard"
    policy: webhook
    scheme: standard
    secret_env: STANDARD_WEBHOOK_SECRET
    window: 10m
    retention: 48h
    lock_ttl: 30s
    max_body: 256KiB
  - match: "POST /hooks/github"
    policy: webhook
    scheme: github
    secret_file: /run/secrets/github
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 2 {
		t.Fatalf("%d routes", len(routes))
	}
	std, gh := routes[0], routes[1]
	if std.Policy != gateway.PolicyWebhook || std.Scheme != "standard" || std.SecretEnv != "STANDARD_WEBHOOK_SECRET" || std.SecretFile != "" ||
		std.Window != 10*time.Minute || std.Retention != 48*time.Hour || std.LockTTL != 30*time.Second || std.MaxBody != 256<<10 || std.Line != 2 {
		t.Errorf("routes[0] = %+v", std)
	}
	if gh.Scheme != "github" || gh.SecretFile != "/run/secrets/github" || gh.SecretEnv != "" || gh.Window != 0 || gh.Line != 10 {
		t.Errorf("routes[1] = %+v", gh)
	}
}

func TestParseWebhookRoutesInvalid(t *testing.T) {
	hook := func(extra string) string {
		return "routes:\n  - match: \"POST /hooks\"\n    policy: webhook\n" + extra
	}
	tests := []struct {
		name, yaml, want string
	}{
		{"no scheme", hook("    secret_env: S\n"), "line 2: routes[0]: policy webhook needs scheme (standard, stripe, github, slack)"},
		{"an unknown scheme", hook("    scheme: paypal\n    secret_env: S\n"), `line 4: routes[0].scheme: want one of standard, stripe, github, slack, got "paypal"`},
		{"a scheme in capitals", hook("    scheme: Stripe\n    secret_env: S\n"), `routes[0].scheme: want one of`},
		{"both secret_env and secret_file", hook("    scheme: stripe\n    secret_env: S\n    secret_file: /s\n"), "line 5: routes[0].secret_env: set secret_env or secret_file, not both"},
		{"neither secret_env nor secret_file", hook("    scheme: stripe\n"), "line 2: routes[0].secret_env: policy webhook needs secret_env"},
		{"secret_env that is not a variable name", hook("    scheme: slack\n    secret_env: SLACK-SECRET\n"), `line 5: routes[0].secret_env: want the name of an environment variable, such as STRIPE_WEBHOOK_SECRET, got "SLACK-SECRET"`},
		{"secret_env that is a list", hook("    scheme: slack\n    secret_env: [A, B]\n"), "routes[0].secret_env: want the name of an environment variable"},
		{"an empty secret_file", hook("    scheme: slack\n    secret_file: \"\"\n"), "line 5: routes[0].secret_file: want the path of a file"},
		{"a window on a github route", hook("    scheme: github\n    secret_env: S\n    window: 5m\n"), "line 6: routes[0].window: scheme github signs no time"},
		{"a window under a second", hook("    scheme: standard\n    secret_env: S\n    window: 500ms\n"), "line 6: routes[0].window: must be at least 1s"},
		{"fail_open on a webhook route", hook("    scheme: standard\n    secret_env: S\n    fail_open: true\n"), "line 6: routes[0].fail_open: applies only to policy idempotency_key, fingerprint, not webhook"},
		{"required on a webhook route", hook("    scheme: standard\n    secret_env: S\n    required: true\n"), "routes[0].required: applies only to policy idempotency_key, not webhook"},
		{"secret_env on a token route", "routes:\n  - match: /x\n    policy: token\n    secret_env: S\n", "line 4: routes[0].secret_env: applies only to policy webhook, not token"},
		{"scheme on an idempotency_key route", "routes:\n  - match: /x\n    policy: idempotency_key\n    scheme: stripe\n", "routes[0].scheme: applies only to policy webhook"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := gateway.ParseRoutes([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant  %q", err, tc.want)
			}
		})
	}
}

func TestLoadRoutesResolvesSecretFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "routes.yaml")
	yaml := "routes:\n" +
		"  - {match: \"POST /a\", policy: webhook, scheme: github, secret_file: secrets/github}\n" +
		"  - {match: \"POST /b\", policy: webhook, scheme: github, secret_file: /abs/github}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	routes, err := gateway.LoadRoutes(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := routes[0].SecretFile; got != filepath.Join(dir, "secrets", "github") {
		t.Errorf("a relative secret_file = %q, want it beside the routes file", got)
	}
	if got := routes[1].SecretFile; got != "/abs/github" {
		t.Errorf("an absolute secret_file = %q", got)
	}
}

// TestWebhookSecretsAtStart: New reads each webhook route's secrets and
// refuses, naming the key, its line and the variable or the file, never
// a secret, when there are none or one does not fit the scheme.
func TestWebhookSecretsAtStart(t *testing.T) {
	up := &url.URL{Scheme: "http", Host: "127.0.0.1:1"}
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	blank := file("blank", "\n   \n\t\n")
	badSecond := file("bad-second", hookSecret+"\n\ns3cr3t-but-not-base64!\n")
	huge := file("huge", hookSecret+"\n"+strings.Repeat("#", gateway.MaxSecretFile))
	routesFile := func(scheme, key, value string) string {
		return "routes:\n  - match: \"POST /orders\"\n    policy: idempotency_key\n" +
			"  - match: \"POST /hooks\"\n    policy: webhook\n    scheme: " + scheme + "\n    " + key + ": " + value + "\n"
	}
	env := map[string]string{
		"EMPTY":           "",
		"COMMAS":          " , ,",
		"STRIPE_API_KEY":  "sk_live_s3cr3t",
		"STANDARD_SECRET": hookSecret,
	}
	getenv := gateway.WithGetenv(func(k string) string { return env[k] })
	d := newDeps(t)
	tests := []struct {
		name   string
		routes []gateway.Route // nil: from yaml
		yaml   string
		opts   []gateway.Option
		want   string
	}{
		{"an unset variable", nil, routesFile("standard", "secret_env", "UNSET_SECRET"), nil,
			"gateway: line 7: routes[1].secret_env: the environment variable UNSET_SECRET is not set or holds no secret"},
		{"an empty variable", nil, routesFile("slack", "secret_env", "EMPTY"), nil,
			"line 7: routes[1].secret_env: the environment variable EMPTY is not set or holds no secret"},
		{"a variable of commas", nil, routesFile("slack", "secret_env", "COMMAS"), nil,
			"line 7: routes[1].secret_env: the environment variable COMMAS is not set or holds no secret"},
		{"a Stripe API key in the variable", nil, routesFile("stripe", "secret_env", "STRIPE_API_KEY"), nil,
			"line 7: routes[1].secret_env: the environment variable STRIPE_API_KEY: webhook: stripe secret 1 of 1 does not start with whsec_"},
		{"a missing file", nil, routesFile("github", "secret_file", filepath.Join(dir, "missing")), nil,
			"line 7: routes[1].secret_file: open " + filepath.Join(dir, "missing") + ": no such file or directory"},
		{"a file over MaxSecretFile", nil, routesFile("github", "secret_file", huge), nil,
			"line 7: routes[1].secret_file: " + huge + " is over 1048576 bytes"},
		{"a file of blank lines", nil, routesFile("github", "secret_file", blank), nil,
			"line 7: routes[1].secret_file: " + blank + " holds no secret"},
		{"a file whose second secret is not base64", nil, routesFile("standard", "secret_file", badSecond), nil,
			"line 7: routes[1].secret_file: " + badSecond + ": webhook: standard secret 2 of 2 is not whsec_"},
		{"a route built in code, without a line", []gateway.Route{{Match: "POST /hooks", Policy: gateway.PolicyWebhook, Scheme: "github", SecretEnv: "UNSET"}}, "", nil,
			"gateway: routes[0].secret_env: the environment variable UNSET is not set"},
		{"a route built in code with both", []gateway.Route{{Match: "POST /hooks", Policy: gateway.PolicyWebhook, Scheme: "github", SecretEnv: "STANDARD_SECRET", SecretFile: badSecond}}, "", nil,
			"routes[0].secret_env: set secret_env or secret_file, not both"},
		{"a route built in code with an unknown scheme", []gateway.Route{{Match: "POST /hooks", Policy: gateway.PolicyWebhook, Scheme: "paypal", SecretEnv: "STANDARD_SECRET"}}, "", nil,
			`routes[0].scheme: webhook: unknown scheme "paypal"`},
		{"no keeper", []gateway.Route{{Match: "POST /hooks", Policy: gateway.PolicyWebhook, Scheme: "standard", SecretEnv: "STANDARD_SECRET"}}, "",
			[]gateway.Option{gateway.WithKeeper(nil)}, "WithKeeper"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			routes := tc.routes
			if routes == nil {
				var err error
				if routes, err = gateway.ParseRoutes([]byte(tc.yaml)); err != nil {
					t.Fatal(err)
				}
			}
			_, err := gateway.New(up, routes, append([]gateway.Option{quiet, getenv, gateway.WithKeeper(d.keeper)}, tc.opts...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant  %q", err, tc.want)
			}
			if leaked(err.Error()) {
				t.Fatalf("the error shows a secret: %v", err)
			}
		})
	}
}

// hookSigner signs Standard Webhooks deliveries with hookSecret.
func hookSigner(t *testing.T) *webhook.Signer {
	t.Helper()
	s, err := webhook.NewSigner([]string{hookSecret})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// delivery is a signed Standard Webhooks delivery of id to target, with
// extra headers (name, value pairs) set after signing.
func delivery(t *testing.T, s *webhook.Signer, target, id, body string, extra ...string) *http.Request {
	t.Helper()
	req := newRequest(t, "POST", target, body, "Content-Type", "application/json")
	if err := s.SignRequest(req, id); err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header[extra[i]] = append(req.Header[extra[i]], extra[i+1])
	}
	return req
}

func githubDelivery(t *testing.T, target, id, body string) *http.Request {
	t.Helper()
	m := hmac.New(sha256.New, []byte(githubSecret))
	m.Write([]byte(body))
	return newRequest(t, "POST", target, body, "X-Hub-Signature-256", "sha256="+hex.EncodeToString(m.Sum(nil)), "X-GitHub-Delivery", id)
}

// slackDelivery is a Slack request to target, signed at ts.
func slackDelivery(t *testing.T, target string, ts time.Time, body string, extra ...string) *http.Request {
	t.Helper()
	stamp := strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, []byte(slackSecret))
	m.Write([]byte("v0:" + stamp + ":" + body))
	return newRequest(t, "POST", target, body, append([]string{"X-Slack-Signature", "v0=" + hex.EncodeToString(m.Sum(nil)), "X-Slack-Request-Timestamp", stamp}, extra...)...)
}

const webhookRoutes = `routes:
  - match: "POST /hooks/billing"
    policy: webhook
    scheme: standard
    secret_env: BILLING_SECRETS
  - match: "POST /hooks/github"
    policy: webhook
    scheme: github
    secret_env: GITHUB_SECRET
  - match: "POST /hooks/slack"
    policy: webhook
    scheme: slack
    secret_env: SLACK_SECRET
`

func webhookEnv(t *testing.T) gateway.Option {
	env := map[string]string{"BILLING_SECRETS": hookSecretOld + ", " + hookSecret, "GITHUB_SECRET": githubSecret, "SLACK_SECRET": slackSecret}
	return gateway.WithGetenv(func(k string) string { return env[k] })
}

func TestWebhookPolicy(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	gw := serve(t, a.url(t), webhookRoutes, gateway.WithKeeper(d.keeper), webhookEnv(t))
	signer := hookSigner(t)

	t.Run("a delivery reaches the app once, with its verified ID and not a spoofed one", func(t *testing.T) {
		req := delivery(t, signer, gw.URL+"/hooks/billing", "msg_1", `{"type":"invoice.paid"}`, spoofs...)
		status, _, body := do(t, req)
		if status != http.StatusCreated {
			t.Fatalf("= %d %s", status, body)
		}
		got := a.requests()
		if len(got) != 1 {
			t.Fatalf("the app got %d requests", len(got))
		}
		h := got[0].Header
		if ids := h.Values(gateway.WebhookIDHeader); len(ids) != 1 || ids[0] != "msg_1" {
			t.Errorf("Replayguard-Webhook-Id = %q, want [msg_1]", ids)
		}
		for name, vs := range h {
			for _, v := range vs {
				if strings.HasPrefix(v, "spoof-") {
					t.Errorf("the app got a spoofed %s: %q", name, v)
				}
			}
		}
		if got[0].Body != `{"type":"invoice.paid"}` || h.Get("webhook-signature") == "" {
			t.Errorf("the app got the body %q and signature %q; want both as sent", got[0].Body, h.Get("webhook-signature"))
		}
		for range 3 {
			again := delivery(t, signer, gw.URL+"/hooks/billing", "msg_1", `{"type":"invoice.paid"}`)
			if s, h, b := do(t, again); s != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" || b != body {
				t.Fatalf("redelivery = %d %v %s", s, h, b)
			}
		}
		if n := len(a.requests()); n != 1 {
			t.Fatalf("the app ran %d times", n)
		}
	})

	t.Run("a delivery signed with the old secret still verifies while it rotates", func(t *testing.T) {
		old, err := webhook.NewSigner([]string{hookSecretOld})
		if err != nil {
			t.Fatal(err)
		}
		if s, _, b := do(t, delivery(t, old, gw.URL+"/hooks/billing", "msg_old", `{}`)); s != http.StatusCreated {
			t.Fatalf("= %d %s", s, b)
		}
	})

	t.Run("forged deliveries never reach the app", func(t *testing.T) {
		before := len(a.requests())
		signed := delivery(t, signer, gw.URL+"/hooks/billing", "msg_2", `{"amount":1}`)
		forged := newRequest(t, "POST", gw.URL+"/hooks/billing", `{"amount":100}`, // the signed headers, another body
			"webhook-id", "msg_2", "webhook-timestamp", signed.Header.Get("webhook-timestamp"), "webhook-signature", signed.Header.Get("webhook-signature"))
		for _, tc := range []struct {
			name string
			req  *http.Request
			code string
		}{
			{"another body", forged, "signature_invalid"},
			{"unsigned", newRequest(t, "POST", gw.URL+"/hooks/billing", `{}`), "signature_missing"},
			{"github, the body changed", func() *http.Request {
				r := githubDelivery(t, gw.URL+"/hooks/github", "d1", `{"zen":"a"}`)
				return newRequest(t, "POST", gw.URL+"/hooks/github", `{"zen":"b"}`, "X-Hub-Signature-256", r.Header.Get("X-Hub-Signature-256"), "X-GitHub-Delivery", "d1")
			}(), "signature_invalid"},
		} {
			if s, h, b := do(t, tc.req); s != http.StatusUnauthorized || problemCode(b) != tc.code || h.Get("Idempotent-Replayed") != "" {
				t.Errorf("%s = %d %s, want 401 %s", tc.name, s, b, tc.code)
			}
		}
		if n := len(a.requests()); n != before {
			t.Fatalf("the app ran %d times for forgeries", n-before)
		}
	})

	t.Run("github: no time is checked, and the delivery ID keys it", func(t *testing.T) {
		before := len(a.requests())
		for range 2 {
			req := githubDelivery(t, gw.URL+"/hooks/github", "72d3162e-cc78-11e3-81ab-4c9367dc0958", `{"zen":"x"}`)
			req.Header.Set("Date", "Thu, 01 Jan 2015 00:00:00 GMT")
			if s, _, b := do(t, req); s != http.StatusCreated {
				t.Fatalf("= %d %s", s, b)
			}
		}
		if n := len(a.requests()) - before; n != 1 {
			t.Fatalf("the app ran %d times", n)
		}
	})

	t.Run("slack: an event's retry, signed anew, gets the stored answer; the app runs once with the event_id", func(t *testing.T) {
		before := len(a.requests())
		body := `{"type":"event_callback","event_id":"Ev0PV52K25","event":{"type":"app_mention"}}`
		ts := time.Now()
		s, _, first := do(t, slackDelivery(t, gw.URL+"/hooks/slack", ts, body, "Content-Type", "application/json"))
		if s != http.StatusCreated {
			t.Fatalf("first = %d %s", s, first)
		}
		retry := slackDelivery(t, gw.URL+"/hooks/slack", ts.Add(time.Minute), body, "Content-Type", "application/json", "X-Slack-Retry-Num", "1", "X-Slack-Retry-Reason", "http_timeout")
		if s, h, b := do(t, retry); s != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" || b != first {
			t.Fatalf("retry = %d %v %s, want the first answer replayed", s, h, b)
		}
		got := a.requests()[before:]
		if len(got) != 1 {
			t.Fatalf("the app ran %d times, want 1", len(got))
		}
		if id := got[0].Header.Get(gateway.WebhookIDHeader); id != "event_id=Ev0PV52K25" {
			t.Fatalf("Replayguard-Webhook-Id = %q, want event_id=Ev0PV52K25", id)
		}
	})

	t.Run("an app's 5xx reaches the provider as sent, and the redelivery runs", func(t *testing.T) {
		a.mu.Lock()
		a.respond = func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-App", "down")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte("app says no"))
		}
		a.mu.Unlock()
		s, h, b := do(t, delivery(t, signer, gw.URL+"/hooks/billing", "msg_5xx", `{}`))
		if s != http.StatusInternalServerError || b != "app says no" || h.Get("X-App") != "down" {
			t.Fatalf("= %d %v %s, want the app's own 500", s, h, b)
		}
		a.mu.Lock()
		a.respond = nil
		a.mu.Unlock()
		if s, h, b := do(t, delivery(t, signer, gw.URL+"/hooks/billing", "msg_5xx", `{}`)); s != http.StatusCreated || h.Get("Idempotent-Replayed") != "" {
			t.Fatalf("redelivery = %d %v %s", s, h, b)
		}
	})
}

// TestWebhookUnknownOutcome: an app that times out may have done the
// work: the record is left to its lease (redeliveries get 409), not
// released for an immediate second run. What the gateway logs about it,
// at debug level, shows no secret.
func TestWebhookUnknownOutcome(t *testing.T) {
	a := newApp(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	a.respond = func(w http.ResponseWriter, r *http.Request) { <-release }
	clock := storetest.NewClock(time.Now())
	st := memory.New(memory.WithClock(clock.Now))
	t.Cleanup(func() { _ = st.Close() })
	keeper := idempotency.New(st, idempotency.WithClock(clock.Now), idempotency.WithLockTTL(time.Minute))
	var logs testenv.LockedBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	gw := serve(t, a.url(t), webhookRoutes, gateway.WithKeeper(keeper), webhookEnv(t), gateway.WithTimeout(100*time.Millisecond), gateway.WithLogger(logger))
	signer := hookSigner(t)
	if s, _, b := do(t, delivery(t, signer, gw.URL+"/hooks/billing", "msg_slow", `{}`)); s != http.StatusBadGateway || problemCode(b) != "upstream_unavailable" {
		t.Fatalf("first = %d %s", s, b)
	}
	s, h, b := do(t, delivery(t, signer, gw.URL+"/hooks/billing", "msg_slow", `{}`))
	if s != http.StatusConflict || problemCode(b) != "request_in_progress" || h.Get("Retry-After") == "" {
		t.Fatalf("redelivery = %d %s, want 409 request_in_progress until the lease ends", s, b)
	}
	if n := len(a.requests()); n != 1 {
		t.Fatalf("the app ran %d times", n)
	}
	out := logs.String()
	if !strings.Contains(out, "upstream request failed") || !strings.Contains(out, "abandoned") {
		t.Fatalf("the timeout and the abandoned record were not logged:\n%s", out)
	}
	if leaked(out) {
		t.Fatalf("a secret reached the logs:\n%s", out)
	}
}

// TestWebhookNotBefore: with WithWebhookNotBefore (the memory store),
// a delivery timestamped before it is refused as expired, though inside
// the window; GitHub's, which carry no time, are not.
func TestWebhookNotBefore(t *testing.T) {
	a := newApp(t)
	d := newDeps(t)
	start := time.Now()
	gw := serve(t, a.url(t), webhookRoutes, gateway.WithKeeper(d.keeper), webhookEnv(t), gateway.WithWebhookNotBefore(start))
	early, err := webhook.NewSigner([]string{hookSecret}, webhook.WithClock(func() time.Time { return start.Add(-2 * time.Second) }))
	if err != nil {
		t.Fatal(err)
	}
	if s, _, b := do(t, delivery(t, early, gw.URL+"/hooks/billing", "msg_before", `{}`)); s != http.StatusUnauthorized || problemCode(b) != "signature_expired" || !strings.Contains(b, "server_time") {
		t.Fatalf("a delivery from before the start = %d %s", s, b)
	}
	if s, _, b := do(t, delivery(t, hookSigner(t), gw.URL+"/hooks/billing", "msg_after", `{}`)); s != http.StatusCreated {
		t.Fatalf("a delivery from now = %d %s", s, b)
	}
	if s, _, b := do(t, githubDelivery(t, gw.URL+"/hooks/github", "d-any-time", `{}`)); s != http.StatusCreated {
		t.Fatalf("a github delivery = %d %s", s, b)
	}
	if n := len(a.requests()); n != 2 {
		t.Fatalf("the app ran %d times, want 2", n)
	}
}
