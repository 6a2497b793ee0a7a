package webhook_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/webhook"
)

// routesYAML is the routes file of the end-to-end test: one webhook
// route per scheme, the Stripe secrets in a file beside it.
const routesYAML = `routes:
  - match: "POST /hooks/standard"
    policy: webhook
    scheme: standard
    secret_env: STANDARD_WEBHOOK_SECRETS
  - match: "POST /hooks/stripe"
    policy: webhook
    scheme: stripe
    secret_file: stripe-secrets.txt
  - match: "POST /hooks/github"
    policy: webhook
    scheme: github
    secret_env: GITHUB_WEBHOOK_SECRET
  - match: "POST /hooks/slack"
    policy: webhook
    scheme: slack
    secret_env: SLACK_SIGNING_SECRET
    max_body: 4KiB
`

// secrets are one run's random secrets of every route.
type secrets struct {
	standard, standardOld, stripe, github, slack string
}

func newSecrets(t *testing.T) secrets {
	t.Helper()
	gen := func() string {
		s, err := webhook.GenerateSecret()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	return secrets{
		standard:    gen(),
		standardOld: gen(),
		stripe:      "whsec_" + randomHex(t, 16),
		github:      "github " + randomHex(t, 16),
		slack:       randomHex(t, 16),
	}
}

// values lists every secret, in every form a leak could take.
func (s secrets) values() []string {
	var out []string
	for _, v := range []string{s.standard, s.standardOld, s.stripe, s.github, s.slack} {
		out = append(out, v)
		if raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v, "whsec_")); err == nil && strings.HasPrefix(v, "whsec_") && len(raw) > 8 {
			out = append(out, strings.TrimPrefix(v, "whsec_"), fmt.Sprintf("%v", raw[:8]), hexOf(raw))
		}
	}
	return out
}

func hexOf(b []byte) string { return fmt.Sprintf("%x", b) }

// gatewayEnv writes the routes file and the Stripe secrets file into a
// temp dir and returns the server's environment for them.
func gatewayEnv(t *testing.T, up string, s secrets) []string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "routes.yaml"), []byte(routesYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	// One secret per line, white space around it and blank lines, as an
	// operator's file may have them.
	if err := os.WriteFile(filepath.Join(dir, "stripe-secrets.txt"), []byte("\n  whsec_retired_"+randomHex(t, 8)+"  \r\n\n"+s.stripe+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{
		"REPLAYGUARD_UPSTREAM=" + up,
		"REPLAYGUARD_ROUTES=" + filepath.Join(dir, "routes.yaml"),
		"REPLAYGUARD_LOG_LEVEL=debug",
		"STANDARD_WEBHOOK_SECRETS=" + s.standardOld + "," + s.standard,
		"GITHUB_WEBHOOK_SECRET=" + s.github,
		"SLACK_SIGNING_SECRET=" + s.slack,
	}
}

// TestGatewayWebhooks delivers webhooks of every scheme through the
// server in gateway mode to an app that counts its executions, on each
// store: one delivery runs once, redeliveries replay, concurrent copies
// run once, a 500 lets the redelivery run, and forged or stale deliveries
// never run. At debug level, no secret appears in the server's output.
func TestGatewayWebhooks(t *testing.T) {
	stores := []struct {
		name   string
		memory bool
		env    func(t *testing.T) []string
	}{
		{"memory", true, func(*testing.T) []string { return nil }},
		{"redis", false, func(t *testing.T) []string {
			return []string{
				"REPLAYGUARD_REDIS_URL=" + testenv.Var(t, "REPLAYGUARD_TEST_REDIS_URL"),
				"REPLAYGUARD_KEY_PREFIX=rgtest:webhook:" + randomHex(t, 6) + ":",
			}
		}},
		{"postgres", false, func(t *testing.T) []string {
			return []string{"REPLAYGUARD_POSTGRES_URL=" + testenv.Var(t, "REPLAYGUARD_TEST_POSTGRES_URL")}
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			storeEnv := st.env(t)
			app := newCountingApp(t)
			sec := newSecrets(t)
			before := time.Now() // the server starts after this
			srv := runServer(t, append(gatewayEnv(t, app.srv.URL, sec), storeEnv...)...)
			e := &e2e{t: t, srv: srv, app: app, sec: sec, run: randomHex(t, 6)}
			e.scenarios(st.memory, before)
			srv.stop() // its last lines are out
			for _, v := range sec.values() {
				if strings.Contains(srv.out.String(), v) {
					t.Fatalf("the server's output shows a secret (%.6s…)", v)
				}
			}
			if !strings.Contains(srv.out.String(), `"msg":"request"`) {
				t.Fatalf("the server logged no requests: the check above proves nothing\n%s", srv.out.String())
			}
		})
	}
}

// e2e is one store's run.
type e2e struct {
	t   *testing.T
	srv *server
	app *countingApp
	sec secrets
	run string // makes this run's IDs its own on a shared store
}

// id is an ID of this run.
func (e *e2e) id(name string) string { return name + "-" + e.run }

func (e *e2e) signer(t *testing.T, secret string, clock func() time.Time) *webhook.Signer {
	t.Helper()
	var opts []webhook.Option
	if clock != nil {
		opts = append(opts, webhook.WithClock(clock))
	}
	s, err := webhook.NewSigner([]string{secret}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// standard is a Standard Webhooks delivery of id signed now (or at
// clock) with secret, and extra headers.
func (e *e2e) standard(t *testing.T, secret, id, body string, clock func() time.Time, extra ...string) *http.Request {
	t.Helper()
	req := post(t, e.srv.base+"/hooks/standard", body, append([]string{"Content-Type", "application/json"}, extra...)...)
	if err := e.signer(t, secret, clock).SignRequest(req, id); err != nil {
		t.Fatal(err)
	}
	return req
}

func (e *e2e) stripe(t *testing.T, ts time.Time, body string) *http.Request {
	return post(t, e.srv.base+"/hooks/stripe", body, "Stripe-Signature", stripeSignature(e.sec.stripe, ts, body), "Content-Type", "application/json")
}

func (e *e2e) scenarios(memoryStore bool, serverStarted time.Time) {
	t := e.t
	spoofed := []string{"Replayguard-Webhook-Id", "spoof-1", "replayguard_webhook_id", "spoof-2", "REPLAYGUARD-WEBHOOK-ID", "spoof-3"}

	t.Run("one delivery of each scheme runs the app once, with its verified ID", func(t *testing.T) {
		evt := e.id("evt")
		stripeBody := `{"id":"` + evt + `","object":"event","type":"charge.succeeded"}`
		slackBody := "payload=" + e.run
		cases := []struct {
			name string
			req  *http.Request
			key  string
		}{
			{"standard", e.standard(t, e.sec.standard, e.id("msg_one"), `{"type":"invoice.paid"}`, nil, spoofed...), e.id("msg_one")},
			{"stripe", post(t, e.srv.base+"/hooks/stripe", stripeBody, append([]string{"Stripe-Signature", stripeSignature(e.sec.stripe, time.Now(), stripeBody)}, spoofed...)...), evt},
			{"github", post(t, e.srv.base+"/hooks/github", `{"zen":"x"}`, append(githubHeaders(e.sec.github, e.id("gh"), `{"zen":"x"}`), spoofed...)...), e.id("gh")},
			{"slack", post(t, e.srv.base+"/hooks/slack", slackBody, append(slackHeaders(e.sec.slack, time.Now(), slackBody), spoofed...)...), ""},
		}
		for _, c := range cases {
			a := send(c.req)
			if a.status != http.StatusOK || a.replayed() {
				t.Fatalf("%s: %v", c.name, a)
			}
			key := c.key
			if key == "" { // slack: the signature is the key
				key = c.req.Header.Get("X-Slack-Signature")
			}
			if n := e.app.count(key); n != 1 {
				t.Fatalf("%s: the app ran %d times, want 1", c.name, n)
			}
			if got := e.app.header(key).Values("Replayguard-Webhook-Id"); len(got) != 1 || got[0] != key {
				t.Fatalf("%s: the app got Replayguard-Webhook-Id %q, want [%s]", c.name, got, key)
			}
			for name, vs := range e.app.header(key) {
				for _, v := range vs {
					if strings.HasPrefix(v, "spoof-") {
						t.Errorf("%s: the app got the spoofed %s: %q", c.name, name, v)
					}
				}
			}
		}
	})

	t.Run("ten redeliveries: one run, ten replays", func(t *testing.T) {
		id, evt, slackEvt := e.id("msg_ten"), e.id("evt_ten"), e.id("Ev_ten")
		stripeBody := `{"id":"` + evt + `","object":"event"}`
		slackBody := `{"type":"event_callback","event_id":"` + slackEvt + `","event":{"type":"app_mention"}}`
		for _, c := range []struct {
			name    string
			deliver func(i int) *http.Request
			key     string
		}{
			// Each redelivery is signed again, with a later timestamp.
			{"standard", func(i int) *http.Request {
				at := time.Now().Add(time.Duration(i) * time.Second)
				return e.standard(t, e.sec.standard, id, `{"n":1}`, func() time.Time { return at })
			}, id},
			{"stripe", func(i int) *http.Request {
				return e.stripe(t, time.Now().Add(time.Duration(i)*time.Second), stripeBody)
			}, evt},
			// Slack's retries of an Events API event: new timestamp and
			// signature, X-Slack-Retry-Num; the event_id keys them.
			{"slack", func(i int) *http.Request {
				h := slackHeaders(e.sec.slack, time.Now().Add(time.Duration(i)*time.Second), slackBody)
				if i > 0 {
					h = append(h, "X-Slack-Retry-Num", strconv.Itoa(i), "X-Slack-Retry-Reason", "http_timeout")
				}
				return post(t, e.srv.base+"/hooks/slack", slackBody, append(h, "Content-Type", "application/json")...)
			}, "event_id=" + slackEvt},
		} {
			first := send(c.deliver(0))
			if first.status != http.StatusOK || first.replayed() {
				t.Fatalf("%s first: %v", c.name, first)
			}
			for i := 1; i <= 10; i++ {
				a := send(c.deliver(i))
				if a.status != http.StatusOK || !a.replayed() || a.body != first.body {
					t.Fatalf("%s redelivery %d: %v %v, want the first answer replayed", c.name, i, a, a.header)
				}
			}
			if n := e.app.count(c.key); n != 1 {
				t.Fatalf("%s: the app ran %d times, want 1", c.name, n)
			}
		}
	})

	t.Run("20 concurrent copies: one run", func(t *testing.T) {
		id := e.id("msg_race")
		hold := make(chan struct{})
		e.app.mu.Lock()
		e.app.hold[id] = hold
		e.app.mu.Unlock()
		first := e.standard(t, e.sec.standard, id, `{"race":true}`, nil)
		const copies = 20
		answers := make(chan answer, copies)
		var wg sync.WaitGroup
		for range copies {
			req := first.Clone(first.Context())
			req.Body, _ = first.GetBody()
			wg.Go(func() { answers <- send(req) })
		}
		// The app holds its run until every other copy was answered: none
		// of them can arrive after the run completed.
		released := false
		release := func() {
			if !released {
				close(hold)
				released = true
			}
		}
		defer func() { release(); wg.Wait() }()
		timeout := time.After(60 * time.Second)
		for conflicts := 0; conflicts < copies-1; {
			select {
			case a := <-answers:
				if a.status != http.StatusConflict || a.code() != "request_in_progress" || a.header.Get("Retry-After") == "" {
					t.Fatalf("a copy got %v while the first ran", a)
				}
				conflicts++
			case <-timeout:
				t.Fatalf("only %d copies were answered", conflicts)
			}
		}
		release()
		wg.Wait()
		if a := <-answers; a.status != http.StatusOK || a.replayed() {
			t.Fatalf("the running copy: %v", a)
		}
		if n := e.app.count(id); n != 1 {
			t.Fatalf("the app ran %d times, want 1", n)
		}
		if a := send(e.standard(t, e.sec.standard, id, `{"race":true}`, nil)); a.status != http.StatusOK || !a.replayed() {
			t.Fatalf("a redelivery after the run: %v", a)
		}
	})

	t.Run("a 500 from the app reaches the provider, and its redelivery runs again", func(t *testing.T) {
		id := e.id("msg_500")
		e.app.mu.Lock()
		e.app.failFirst[id] = true
		e.app.mu.Unlock()
		if a := send(e.standard(t, e.sec.standard, id, `{}`, nil)); a.status != http.StatusInternalServerError || a.body != "the app failed" {
			t.Fatalf("first: %v, want the app's own 500", a)
		}
		if a := send(e.standard(t, e.sec.standard, id, `{}`, nil)); a.status != http.StatusOK || a.replayed() {
			t.Fatalf("redelivery: %v", a)
		}
		if a := send(e.standard(t, e.sec.standard, id, `{}`, nil)); a.status != http.StatusOK || !a.replayed() {
			t.Fatalf("third: %v", a)
		}
		if n := e.app.count(id); n != 2 {
			t.Fatalf("the app ran %d times, want 2", n)
		}
	})

	t.Run("a delivery signed with the previous secret verifies while it rotates", func(t *testing.T) {
		id := e.id("msg_old_secret")
		if a := send(e.standard(t, e.sec.standardOld, id, `{}`, nil)); a.status != http.StatusOK {
			t.Fatalf("%v", a)
		}
	})

	t.Run("forged and stale deliveries never run", func(t *testing.T) {
		id := e.id("msg_forged")
		good := e.standard(t, e.sec.standard, id, `{"amount":1}`, nil)
		other, err := webhook.GenerateSecret()
		if err != nil {
			t.Fatal(err)
		}
		stale := time.Now().Add(-10 * time.Minute)
		ts, _ := strconv.ParseInt(good.Header.Get("webhook-timestamp"), 10, 64)
		retimed := good.Clone(good.Context())
		retimed.Body, _ = good.GetBody()
		retimed.Header.Set("webhook-timestamp", strconv.FormatInt(ts-1, 10))
		renamed := good.Clone(good.Context())
		renamed.Body, _ = good.GetBody()
		renamed.Header.Set("webhook-id", id+"-other")
		evt := e.id("evt_forged")
		for _, c := range []struct {
			name string
			req  *http.Request
			code string
		}{
			{"a body byte changed", post(t, e.srv.base+"/hooks/standard", `{"amount":9}`, "webhook-id", id,
				"webhook-timestamp", good.Header.Get("webhook-timestamp"), "webhook-signature", good.Header.Get("webhook-signature")), "signature_invalid"},
			{"the timestamp changed", retimed, "signature_invalid"},
			{"the ID changed", renamed, "signature_invalid"},
			{"signed with an unknown secret", e.standard(t, other, id, `{}`, nil), "signature_invalid"},
			{"unsigned", post(t, e.srv.base+"/hooks/standard", `{}`, "webhook-id", id), "signature_missing"},
			{"stale: signed 10 minutes ago", e.standard(t, e.sec.standard, id, `{}`, func() time.Time { return stale }), "signature_expired"},
			{"stripe: stale", e.stripe(t, stale, `{"id":"`+evt+`"}`), "signature_expired"},
			{"stripe: another secret", post(t, e.srv.base+"/hooks/stripe", `{"id":"`+evt+`"}`, "Stripe-Signature", stripeSignature("whsec_other", time.Now(), `{"id":"`+evt+`"}`)), "signature_invalid"},
			{"github: another secret", post(t, e.srv.base+"/hooks/github", `{}`, githubHeaders("other", id, `{}`)...), "signature_invalid"},
			{"slack: stale", post(t, e.srv.base+"/hooks/slack", "p=1", slackHeaders(e.sec.slack, stale, "p=1")...), "signature_expired"},
		} {
			a := send(c.req)
			if a.status != http.StatusUnauthorized || a.code() != c.code {
				t.Errorf("%s: %v, want 401 %s", c.name, a, c.code)
			}
			if c.code == "signature_expired" && !strings.Contains(a.body, `"server_time":"`) {
				t.Errorf("%s: no server_time in %s", c.name, a.body)
			}
		}
		for _, key := range []string{id, id + "-other", evt} {
			if n := e.app.count(key); n != 0 {
				t.Fatalf("the app ran %s %d times", key, n)
			}
		}
	})

	t.Run("a verified Stripe event without an id, and a body over max_body, never run", func(t *testing.T) {
		if a := send(e.stripe(t, time.Now(), `{"object":"event"}`)); a.status != http.StatusBadRequest || a.code() != "invalid_request" {
			t.Errorf("no id: %v", a)
		}
		big := "p=" + strings.Repeat("x", 5000)
		if a := send(post(t, e.srv.base+"/hooks/slack", big, slackHeaders(e.sec.slack, time.Now(), big)...)); a.status != http.StatusRequestEntityTooLarge || a.code() != "payload_too_large" {
			t.Errorf("over max_body: %v", a)
		}
	})

	t.Run("a delivery timestamped before the server started", func(t *testing.T) {
		id := e.id("msg_before_start")
		at := serverStarted.Add(-2 * time.Second)
		a := send(e.standard(t, e.sec.standard, id, `{}`, func() time.Time { return at }))
		if memoryStore {
			// The memory store forgot what ran before a restart.
			if a.status != http.StatusUnauthorized || a.code() != "signature_expired" || e.app.count(id) != 0 {
				t.Fatalf("on the memory store: %v, want 401 signature_expired", a)
			}
			return
		}
		// Redis and PostgreSQL remember: the window alone decides.
		if a.status != http.StatusOK || e.app.count(id) != 1 {
			t.Fatalf("%v, want it run", a)
		}
	})

	t.Run("unrouted requests lose client-sent Replayguard-Webhook-Id too", func(t *testing.T) {
		if a := send(post(t, e.srv.base+"/plain", `{}`, spoofed...)); a.status != http.StatusOK {
			t.Fatalf("%v", a)
		}
		for name := range e.app.header("unrouted /plain") {
			if strings.EqualFold(strings.ReplaceAll(name, "_", "-"), "Replayguard-Webhook-Id") {
				t.Errorf("the app got %s", name)
			}
		}
	})
}

// TestServerRefusesToStart: a webhook route whose secrets cannot be had
// stops the server at start with a non-zero exit and an error naming the
// routes file's key, its line and the variable or path, never a secret.
func TestServerRefusesToStart(t *testing.T) {
	dir := t.TempDir()
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a secret that must never be shown"))
	routes := func(name, key, value string) string {
		p := filepath.Join(dir, name+".yaml")
		yaml := "routes:\n  - match: \"POST /orders\"\n    policy: idempotency_key\n" +
			"  - match: \"POST /hooks\"\n    policy: webhook\n    scheme: standard\n"
		if key != "" {
			yaml += "    " + key + ": " + value + "\n"
		}
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	malformed := filepath.Join(dir, "malformed.txt")
	if err := os.WriteFile(malformed, []byte(secret+"\nnot base64: "+secret+"!\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		routes string
		env    []string
		want   string
	}{
		{"an unset variable", routes("unset", "secret_env", "HOOK_SECRET"), nil,
			"line 7: routes[1].secret_env: the environment variable HOOK_SECRET is not set or holds no secret"},
		{"an empty variable", routes("empty", "secret_env", "HOOK_SECRET"), []string{"HOOK_SECRET="},
			"line 7: routes[1].secret_env: the environment variable HOOK_SECRET is not set or holds no secret"},
		{"a missing file", routes("missing", "secret_file", "/nonexistent/hook-secrets"), nil,
			"line 7: routes[1].secret_file: open /nonexistent/hook-secrets: no such file or directory"},
		{"a malformed secret in the file", routes("malformed", "secret_file", malformed), nil,
			"line 7: routes[1].secret_file: " + malformed + ": webhook: standard secret 2 of 2 is not whsec_"},
		{"both secret_env and secret_file", routes("both", "secret_env", "HOOK_SECRET\n    secret_file: /x"), []string{"HOOK_SECRET=" + secret},
			"line 7: routes[1].secret_env: set secret_env or secret_file, not both"},
		{"neither", routes("neither", "", ""), nil,
			"line 4: routes[1].secret_env: policy webhook needs secret_env"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exit(t, append([]string{"REPLAYGUARD_UPSTREAM=http://127.0.0.1:1", "REPLAYGUARD_ROUTES=" + tc.routes, "REPLAYGUARD_LOG_LEVEL=debug"}, tc.env...)...)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("the server did not exit non-zero: %v\n%s", err, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("output lacks %q:\n%s", tc.want, out)
			}
			if strings.Contains(out, strings.TrimPrefix(secret, "whsec_")) || strings.Contains(out, "never be shown") {
				t.Fatalf("the output shows the secret:\n%s", out)
			}
		})
	}
}
