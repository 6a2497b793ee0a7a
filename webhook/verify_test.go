package webhook_test

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/webhook"
)

// The tests sign with their own few lines of HMAC per scheme, written
// from the providers' documentation, rather than with the package's
// Signer: a mistake shared by signer and verifier would pass otherwise.
// (interop_test.go signs with the providers' own libraries.)

const (
	stdSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	stdSecret2   = "whsec_c2Vjb25kIHNlY3JldCBvZiB0d2VudHktZm91cg=="
	stripeSecret = "whsec_test_secret_of_the_endpoint"
	githubSecret = "a github webhook secret"
	slackSecret2 = "0123456789abcdef0123456789abcdef"
)

var now = time.Unix(1_750_000_000, 0)

func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

func stdKey(secret string) []byte {
	k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		panic(err)
	}
	return k
}

// stdHeaders signs a Standard Webhooks delivery with secret at ts.
func stdHeaders(secret, id string, ts int64, body string) http.Header {
	t := strconv.FormatInt(ts, 10)
	sig := "v1," + base64.StdEncoding.EncodeToString(mac(stdKey(secret), id, ".", t, ".", body))
	return hdr("webhook-id", id, "webhook-timestamp", t, "webhook-signature", sig)
}

func stripeHeader(secret string, ts int64, body string) string {
	t := strconv.FormatInt(ts, 10)
	return "t=" + t + ",v1=" + hex.EncodeToString(mac([]byte(secret), t, ".", body))
}

func githubHeaders(secret, delivery, body string) http.Header {
	return hdr("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac([]byte(secret), body)), "X-GitHub-Delivery", delivery)
}

func slackHeaders(secret string, ts int64, body string) http.Header {
	t := strconv.FormatInt(ts, 10)
	return hdr("X-Slack-Signature", "v0="+hex.EncodeToString(mac([]byte(secret), "v0:", t, ":", body)), "X-Slack-Request-Timestamp", t)
}

const stripeBody = `{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"payment_intent.succeeded"}`

func TestVerify(t *testing.T) {
	ts := now.Unix()
	edPub, edPriv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	whpk := "whpk_" + base64.StdEncoding.EncodeToString(edPub)
	v1a := func(id string, ts int64, body string) string {
		return "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(edPriv, []byte(id+"."+strconv.FormatInt(ts, 10)+"."+body)))
	}
	std := stdHeaders(stdSecret, "msg_1", ts, `{"a":1}`)
	tests := []struct {
		name    string
		scheme  webhook.Scheme
		secrets []string
		opts    []webhook.Option
		header  http.Header
		body    string
		wantID  string // "" when refused
		wantErr error
	}{
		// Standard Webhooks
		{"standard: a v1 delivery verifies", webhook.Standard, []string{stdSecret}, nil, std, `{"a":1}`, "msg_1", nil},
		{"standard: the secret without its whsec_ prefix", webhook.Standard, []string{strings.TrimPrefix(stdSecret, "whsec_")}, nil, std, `{"a":1}`, "msg_1", nil},
		{"standard: any one of several secrets verifies (rotation)", webhook.Standard, []string{stdSecret2, stdSecret}, nil, std, `{"a":1}`, "msg_1", nil},
		{"standard: one valid signature among several suffices", webhook.Standard, []string{stdSecret}, nil,
			with(std, "webhook-signature", "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v2,abc v1a,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= "+std.Get("webhook-signature")+" garbage"), `{"a":1}`, "msg_1", nil},
		{"standard: a v1a signature verifies with the whpk_ key", webhook.Standard, []string{stdSecret, whpk}, nil,
			hdr("webhook-id", "msg_2", "webhook-timestamp", strconv.FormatInt(ts, 10), "webhook-signature", v1a("msg_2", ts, "body")), "body", "msg_2", nil},
		{"standard: Svix's svix-* headers verify", webhook.Standard, []string{stdSecret}, nil,
			hdr("svix-id", "msg_1", "svix-timestamp", std.Get("webhook-timestamp"), "svix-signature", std.Get("webhook-signature")), `{"a":1}`, "msg_1", nil},
		{"standard: an empty body verifies", webhook.Standard, []string{stdSecret}, nil, stdHeaders(stdSecret, "msg_e", ts, ""), "", "msg_e", nil},
		{"standard: webhook-id missing", webhook.Standard, []string{stdSecret}, nil, without(std, "webhook-id"), `{"a":1}`, "", webhook.ErrMissing},
		{"standard: webhook-timestamp missing", webhook.Standard, []string{stdSecret}, nil, without(std, "webhook-timestamp"), `{"a":1}`, "", webhook.ErrMissing},
		{"standard: webhook-signature blank", webhook.Standard, []string{stdSecret}, nil, with(std, "webhook-signature", " "), `{"a":1}`, "", webhook.ErrMissing},
		{"standard: webhook-* and svix-* are never mixed", webhook.Standard, []string{stdSecret}, nil,
			hdr("webhook-id", "msg_1", "svix-timestamp", std.Get("webhook-timestamp"), "svix-signature", std.Get("webhook-signature")), `{"a":1}`, "", webhook.ErrMissing},
		{"standard: the body changed", webhook.Standard, []string{stdSecret}, nil, std, `{"a":2}`, "", webhook.ErrInvalid},
		{"standard: a signature by another secret", webhook.Standard, []string{stdSecret2}, nil, std, `{"a":1}`, "", webhook.ErrInvalid},
		{"standard: a v1a signature with only whsec_ secrets", webhook.Standard, []string{stdSecret}, nil,
			hdr("webhook-id", "msg_2", "webhook-timestamp", strconv.FormatInt(ts, 10), "webhook-signature", v1a("msg_2", ts, "body")), "body", "", webhook.ErrInvalid},
		{"standard: a v1 signature's bytes under v1a", webhook.Standard, []string{stdSecret, whpk}, nil,
			with(std, "webhook-signature", strings.Replace(std.Get("webhook-signature"), "v1,", "v1a,", 1)), `{"a":1}`, "", webhook.ErrInvalid},
		{"standard: a webhook-id with a dot", webhook.Standard, []string{stdSecret}, nil, stdHeaders(stdSecret, "msg.1", ts, "x"), "x", "", webhook.ErrInvalid},
		{"standard: two webhook-id fields", webhook.Standard, []string{stdSecret}, nil, added(std, "webhook-id", "msg_other"), `{"a":1}`, "", webhook.ErrInvalid},
		{"standard: a timestamp with a leading zero", webhook.Standard, []string{stdSecret}, nil, with(std, "webhook-timestamp", "0"+std.Get("webhook-timestamp")), `{"a":1}`, "", webhook.ErrInvalid},
		{"standard: a timestamp in milliseconds is outside the window", webhook.Standard, []string{stdSecret}, nil,
			stdHeaders(stdSecret, "msg_ms", now.UnixMilli(), "x"), "x", "", webhook.ErrExpired},
		{"standard: more than 16 signatures", webhook.Standard, []string{stdSecret}, nil,
			with(std, "webhook-signature", strings.Repeat("v1,AAAA ", 16)+std.Get("webhook-signature")), `{"a":1}`, "", webhook.ErrInvalid},
		{"standard: an ID over 255 characters", webhook.Standard, []string{stdSecret}, nil,
			stdHeaders(stdSecret, strings.Repeat("m", 256), ts, "x"), "x", "", webhook.ErrNoID},

		// Stripe
		{"stripe: a delivery verifies, keyed by the event's id", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, stripeBody)), stripeBody, "evt_1NG8Du2eZvKYlo2CUI79vXWy", nil},
		{"stripe: several v1 entries, one valid", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, stripeBody)+",v1="+strings.Repeat("ab", 32)+",v0="+strings.Repeat("cd", 32)), stripeBody, "evt_1NG8Du2eZvKYlo2CUI79vXWy", nil},
		{"stripe: the second of two secrets", webhook.Stripe, []string{"whsec_old", stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, stripeBody)), stripeBody, "evt_1NG8Du2eZvKYlo2CUI79vXWy", nil},
		{"stripe: Stripe-Signature missing", webhook.Stripe, []string{stripeSecret}, nil, hdr(), stripeBody, "", webhook.ErrMissing},
		{"stripe: no t", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", strings.SplitN(stripeHeader(stripeSecret, ts, stripeBody), ",", 2)[1]), stripeBody, "", webhook.ErrInvalid},
		{"stripe: two t", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", "t=1,"+stripeHeader(stripeSecret, ts, stripeBody)), stripeBody, "", webhook.ErrInvalid},
		{"stripe: only a v0 signature", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", strings.Replace(stripeHeader(stripeSecret, ts, stripeBody), "v1=", "v0=", 1)), stripeBody, "", webhook.ErrInvalid},
		{"stripe: the body changed", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, stripeBody)), stripeBody + " ", "", webhook.ErrInvalid},
		{"stripe: t changed", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", strings.Replace(stripeHeader(stripeSecret, ts, stripeBody), "t="+strconv.FormatInt(ts, 10), "t="+strconv.FormatInt(ts+1, 10), 1)), stripeBody, "", webhook.ErrInvalid},
		{"stripe: a verified body without an id", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, `{"object":"event"}`)), `{"object":"event"}`, "", webhook.ErrNoID},
		{"stripe: a verified body whose id is a number", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, `{"id":7}`)), `{"id":7}`, "", webhook.ErrNoID},
		{"stripe: a verified body whose id is spelled ID", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, `{"ID":"evt_1"}`)), `{"ID":"evt_1"}`, "", webhook.ErrNoID},
		{"stripe: a verified body that is not JSON", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, `evt_1`)), `evt_1`, "", webhook.ErrNoID},
		{"stripe: a verified id with a line break", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, `{"id":"evt_1\nX-Evil: 1"}`)), `{"id":"evt_1\nX-Evil: 1"}`, "", webhook.ErrNoID},

		// GitHub
		{"github: a delivery verifies, keyed by X-GitHub-Delivery", webhook.GitHub, []string{githubSecret}, nil,
			githubHeaders(githubSecret, "d1", `{"zen":"x"}`), `{"zen":"x"}`, "d1", nil},
		{"github: no window: an old Date is ignored", webhook.GitHub, []string{githubSecret}, []webhook.Option{webhook.WithNotBefore(now)},
			added(githubHeaders(githubSecret, "d2", "x"), "Date", "Mon, 02 Jan 2006 15:04:05 GMT"), "x", "d2", nil},
		{"github: X-GitHub-Delivery missing", webhook.GitHub, []string{githubSecret}, nil,
			without(githubHeaders(githubSecret, "d1", "x"), "X-GitHub-Delivery"), "x", "", webhook.ErrMissing},
		{"github: X-Hub-Signature-256 missing (the SHA-1 X-Hub-Signature is not read)", webhook.GitHub, []string{githubSecret}, nil,
			hdr("X-Hub-Signature", "sha1=0000", "X-GitHub-Delivery", "d1"), "x", "", webhook.ErrMissing},
		{"github: the body changed", webhook.GitHub, []string{githubSecret}, nil, githubHeaders(githubSecret, "d1", "x"), "y", "", webhook.ErrInvalid},
		{"github: no sha256= prefix", webhook.GitHub, []string{githubSecret}, nil,
			with(githubHeaders(githubSecret, "d1", "x"), "X-Hub-Signature-256", strings.TrimPrefix(githubHeaders(githubSecret, "d1", "x").Get("X-Hub-Signature-256"), "sha256=")), "x", "", webhook.ErrInvalid},

		// Slack
		{"slack: a request verifies, keyed by its signature", webhook.Slack, []string{slackSecret2}, nil,
			slackHeaders(slackSecret2, ts, "payload=1"), "payload=1", slackHeaders(slackSecret2, ts, "payload=1").Get("X-Slack-Signature"), nil},
		{"slack: an uppercase signature is the same key", webhook.Slack, []string{slackSecret2}, nil,
			with(slackHeaders(slackSecret2, ts, "payload=1"), "X-Slack-Signature", "v0="+strings.ToUpper(strings.TrimPrefix(slackHeaders(slackSecret2, ts, "payload=1").Get("X-Slack-Signature"), "v0="))),
			"payload=1", slackHeaders(slackSecret2, ts, "payload=1").Get("X-Slack-Signature"), nil},
		{"slack: X-Slack-Request-Timestamp missing", webhook.Slack, []string{slackSecret2}, nil,
			without(slackHeaders(slackSecret2, ts, "p"), "X-Slack-Request-Timestamp"), "p", "", webhook.ErrMissing},
		{"slack: the timestamp changed", webhook.Slack, []string{slackSecret2}, nil,
			with(slackHeaders(slackSecret2, ts, "p"), "X-Slack-Request-Timestamp", strconv.FormatInt(ts-1, 10)), "p", "", webhook.ErrInvalid},
		{"slack: a timestamp that is not a number", webhook.Slack, []string{slackSecret2}, nil,
			with(slackHeaders(slackSecret2, ts, "p"), "X-Slack-Request-Timestamp", "soon"), "p", "", webhook.ErrInvalid},

		// Windows
		{"window: 5m before now is inside", webhook.Standard, []string{stdSecret}, nil, stdHeaders(stdSecret, "m", ts-300, "x"), "x", "m", nil},
		{"window: 5m1s before now is outside", webhook.Standard, []string{stdSecret}, nil, stdHeaders(stdSecret, "m", ts-301, "x"), "x", "", webhook.ErrExpired},
		{"window: 5m after now is inside", webhook.Slack, []string{slackSecret2}, nil, slackHeaders(slackSecret2, ts+300, "x"), "x", slackHeaders(slackSecret2, ts+300, "x").Get("X-Slack-Signature"), nil},
		{"window: 5m1s after now is outside", webhook.Stripe, []string{stripeSecret}, nil,
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts+301, stripeBody)), stripeBody, "", webhook.ErrExpired},
		{"window: WithWindow widens it", webhook.Stripe, []string{stripeSecret}, []webhook.Option{webhook.WithWindow(time.Hour)},
			hdr("Stripe-Signature", stripeHeader(stripeSecret, ts-3000, stripeBody)), stripeBody, "evt_1NG8Du2eZvKYlo2CUI79vXWy", nil},
		{"window: before WithNotBefore", webhook.Slack, []string{slackSecret2}, []webhook.Option{webhook.WithNotBefore(now.Add(-time.Second))},
			slackHeaders(slackSecret2, ts-2, "x"), "x", "", webhook.ErrExpired},
		{"window: at WithNotBefore", webhook.Standard, []string{stdSecret}, []webhook.Option{webhook.WithNotBefore(now.Add(-1500 * time.Millisecond))},
			stdHeaders(stdSecret, "m", ts-2, "x"), "x", "m", nil},
		{"window: a forged stale delivery is invalid, not expired", webhook.Standard, []string{stdSecret2}, nil, stdHeaders(stdSecret, "m", ts-3600, "x"), "x", "", webhook.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := webhook.New(tc.scheme, tc.secrets, append([]webhook.Option{webhook.WithClock(func() time.Time { return now })}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			d, err := v.Verify(tc.header, []byte(tc.body))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Verify = %+v, %v; want %v", d, err, tc.wantErr)
				}
				if tc.wantErr == webhook.ErrExpired {
					ee, ok := errors.AsType[*replay.ExpiredError](err)
					if !ok || !ee.ServerTime.Equal(now) {
						t.Errorf("the expiry carries no server time: %#v", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if d.ID != tc.wantID || d.Scheme != tc.scheme {
				t.Fatalf("Delivery = %+v, want ID %q", d, tc.wantID)
			}
			if tc.scheme == webhook.GitHub != d.Timestamp.IsZero() {
				t.Errorf("Timestamp = %v", d.Timestamp)
			}
		})
	}
}

func TestCheckNeedsNoBody(t *testing.T) {
	v, err := webhook.New(webhook.GitHub, []string{githubSecret})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Check(githubHeaders(githubSecret, "d", "any body")); err != nil {
		t.Errorf("Check with every header: %v", err)
	}
	if err := v.Check(hdr("X-GitHub-Delivery", "d")); !errors.Is(err, webhook.ErrMissing) || !strings.Contains(err.Error(), "X-Hub-Signature-256") {
		t.Errorf("Check without the signature: %v, want ErrMissing naming X-Hub-Signature-256", err)
	}
}

func TestNewRefusesBadSecretsWithoutQuotingThem(t *testing.T) {
	tests := []struct {
		name    string
		scheme  webhook.Scheme
		secrets []string
		want    string
	}{
		{"no secret", webhook.Slack, nil, "no secret"},
		{"an unknown scheme", webhook.Scheme("paypal"), []string{"s3cr3t-value"}, "unknown scheme"},
		{"an empty secret", webhook.GitHub, []string{"s3cr3t-value", ""}, "secret 2 of 2 is empty"},
		{"white space around a secret", webhook.Slack, []string{"s3cr3t-value\n"}, "white space"},
		{"a Standard secret that is not base64", webhook.Standard, []string{"whsec_s3cr3t-value!"}, "is not whsec_"},
		{"a whpk_ key of the wrong length", webhook.Standard, []string{"whpk_czNjcjN0LXZhbHVl"}, "32-byte"},
		{"a whsk_ signing key on the receiving side", webhook.Standard, []string{"whsk_" + base64.StdEncoding.EncodeToString([]byte("s3cr3t-value-of-thirty-two-bytes"))}, "only the sender"},
		{"a Stripe API key instead of the signing secret", webhook.Stripe, []string{"sk_live_s3cr3t-value"}, "does not start with whsec_"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := webhook.New(tc.scheme, tc.secrets)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error saying %q", err, tc.want)
			}
			for _, s := range []string{"s3cr3t", "czNjcjN0"} {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("the error quotes the secret: %v", err)
				}
			}
		})
	}
}

func TestVerifierPrintsNoSecret(t *testing.T) {
	v, err := webhook.New(webhook.GitHub, []string{"s3cr3t-value"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := webhook.NewSigner([]string{stdSecret})
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		for _, x := range []any{v, s} {
			out := fmt.Sprintf(format, x)
			if strings.Contains(out, "s3cr3t") || strings.Contains(out, "MfKQ9r8") || strings.Contains(out, "115 51 99") {
				t.Errorf("%s printed a secret: %s", format, out)
			}
		}
	}
}

func TestParseScheme(t *testing.T) {
	for _, s := range webhook.Schemes {
		if got, err := webhook.ParseScheme(string(s)); err != nil || got != s {
			t.Errorf("ParseScheme(%q) = %q, %v", s, got, err)
		}
	}
	if _, err := webhook.ParseScheme("Stripe"); err == nil {
		t.Error("ParseScheme is case-sensitive, as the routes file is")
	}
}

func without(h http.Header, name string) http.Header {
	c := h.Clone()
	c.Del(name)
	return c
}

func added(h http.Header, name, value string) http.Header {
	c := h.Clone()
	c.Add(name, value)
	return c
}

// TestVerifySlackKey: an Events API event is keyed by its event_id, the
// same on every retry Slack signs anew; a url_verification by its
// challenge; everything else by the signature. Each key names its kind,
// so that keys of two kinds never collide.
func TestVerifySlackKey(t *testing.T) {
	ts := now.Unix()
	sig := func(ts int64, body string) string {
		return slackHeaders(slackSecret2, ts, body).Get("X-Slack-Signature")
	}
	const event = `{"token":"z26uFbvR1xHJEdHE1OQiO6t8","team_id":"T061EG9RZ","api_app_id":"A0FFV41KK",` +
		`"event":{"type":"reaction_added","user":"U061F1EUR","reaction":"slightly_smiling_face","event_ts":"1465244570.336841"},` +
		`"type":"event_callback","event_id":"Ev9UQ52YNA","event_time":1234567890}`
	const challenge = `{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}`
	long := `{"event_id":"` + strings.Repeat("E", webhook.MaxIDLength) + `"}`
	tests := []struct {
		name string
		ts   int64
		body string
		want string
	}{
		{"an Events API event: its event_id", ts, event, "event_id=Ev9UQ52YNA"},
		{"its retry, signed anew a minute later: the same key", ts + 60, event, "event_id=Ev9UQ52YNA"},
		{"white space before the object", ts, " \n" + event, "event_id=Ev9UQ52YNA"},
		{"url_verification: its challenge", ts, challenge, "challenge=3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"},
		{"an event_id that spells a signature key stays an event_id key", ts, `{"event_id":"` + sig(ts, "x") + `"}`, "event_id=" + sig(ts, "x")},
		{"a slash command (form-encoded): the signature", ts, "command=%2Fweather&text=94070", sig(ts, "command=%2Fweather&text=94070")},
		{"interactivity (payload=JSON, form-encoded): the signature", ts, `payload=%7B%22type%22%3A%22block_actions%22%7D`, sig(ts, `payload=%7B%22type%22%3A%22block_actions%22%7D`)},
		{"a JSON object without event_id (app_rate_limited): the signature", ts, `{"type":"app_rate_limited","team_id":"T1"}`, sig(ts, `{"type":"app_rate_limited","team_id":"T1"}`)},
		{"a challenge outside url_verification: the signature", ts, `{"type":"event_callback","challenge":"c"}`, sig(ts, `{"type":"event_callback","challenge":"c"}`)},
		{"an event_id that is not a string: the signature", ts, `{"event_id":7}`, sig(ts, `{"event_id":7}`)},
		{"an empty event_id: the signature", ts, `{"event_id":""}`, sig(ts, `{"event_id":""}`)},
		{"event_id spelled EVENT_ID: the signature", ts, `{"EVENT_ID":"Ev1"}`, sig(ts, `{"EVENT_ID":"Ev1"}`)},
		{"an event_id with a line break: the signature", ts, `{"event_id":"Ev1\nX-Evil: 1"}`, sig(ts, `{"event_id":"Ev1\nX-Evil: 1"}`)},
		{"an event_id too long with its prefix: the signature", ts, long, sig(ts, long)},
		{"a broken JSON object: the signature", ts, `{"event_id":"Ev1"`, sig(ts, `{"event_id":"Ev1"`)},
		{"a JSON array: the signature", ts, `[{"event_id":"Ev1"}]`, sig(ts, `[{"event_id":"Ev1"}]`)},
		{"an empty body: the signature", ts, "", sig(ts, "")},
	}
	v, err := webhook.New(webhook.Slack, []string{slackSecret2}, webhook.WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := v.Verify(slackHeaders(slackSecret2, tc.ts, tc.body), []byte(tc.body))
			if err != nil || d.ID != tc.want {
				t.Fatalf("Verify = %+v, %v; want ID %q", d, err, tc.want)
			}
		})
	}
}
