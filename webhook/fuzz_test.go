package webhook_test

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/webhook"
)

// FuzzVerify feeds arbitrary signature, ID and timestamp headers and
// bodies to every scheme's Verify. It must never panic, and must answer
// with a Delivery or exactly one of the sentinels; a delivery it accepts
// must carry an ID fit to key a record. Run it with
//
//	go test -fuzz=FuzzVerify ./webhook/
//
// The seeds run in the normal suite.
func FuzzVerify(f *testing.F) {
	ts := strconv.FormatInt(now.Unix(), 10)
	std := stdHeaders(stdSecret, "msg_1", now.Unix(), `{"a":1}`)
	f.Add(std.Get("webhook-signature"), "msg_1", ts, []byte(`{"a":1}`))
	f.Add(stripeHeader(stripeSecret, now.Unix(), stripeBody), "", ts, []byte(stripeBody))
	f.Add(githubHeaders(githubSecret, "d", "x").Get("X-Hub-Signature-256"), "d", "", []byte("x"))
	f.Add(slackHeaders(slackSecret2, now.Unix(), "x").Get("X-Slack-Signature"), "", ts, []byte("x"))
	for _, seed := range [][3]string{
		{"", "", ""},
		{"v1,", "msg", "1"},
		{"v1a,AAAA v1,AAAA= v1a," + string(make([]byte, 100)), "m.s.g", "99999999999999999999"},
		{"t=,v1=,t=1", "", "-1"},
		{"t=1750000000,v1=zz", "\x00", "0x10"},
		{"sha256=", "\xff", "1e9"},
		{"v0=" + string(make([]byte, 64)), " ", "０"},
	} {
		f.Add(seed[0], seed[1], seed[2], []byte(`{"id":"evt_1"}`))
	}
	verifiers := map[webhook.Scheme]*webhook.Verifier{}
	for scheme, secrets := range map[webhook.Scheme][]string{
		webhook.Standard: {stdSecret, otherPublic},
		webhook.Stripe:   {stripeSecret},
		webhook.GitHub:   {githubSecret},
		webhook.Slack:    {slackSecret2},
	} {
		v, err := webhook.New(scheme, secrets, webhook.WithClock(func() time.Time { return now }))
		if err != nil {
			f.Fatal(err)
		}
		verifiers[scheme] = v
	}
	sentinels := []error{webhook.ErrMissing, webhook.ErrInvalid, webhook.ErrExpired, webhook.ErrNoID}
	f.Fuzz(func(t *testing.T, signature, id, timestamp string, body []byte) {
		for scheme, v := range verifiers {
			h := hdr("webhook-signature", signature, "webhook-id", id, "webhook-timestamp", timestamp,
				"Stripe-Signature", signature, "X-Hub-Signature-256", signature, "X-GitHub-Delivery", id,
				"X-Slack-Signature", signature, "X-Slack-Request-Timestamp", timestamp)
			d, err := v.Verify(h, body)
			if err == nil {
				if d.ID == "" || len(d.ID) > webhook.MaxIDLength || d.Scheme != scheme {
					t.Fatalf("%s accepted a delivery with ID %q", scheme, d.ID)
				}
				continue
			}
			n := 0
			for _, s := range sentinels {
				if errors.Is(err, s) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%s: %v wraps %d sentinels, want 1", scheme, err, n)
			}
		}
	})
}

// FuzzSlackKey signs arbitrary bodies as Slack would and checks the key
// Verify derives from them: one of the three kinds, fit to key a record,
// and the signature itself unless the body is a JSON object. Run it with
//
//	go test -fuzz=FuzzSlackKey ./webhook/
func FuzzSlackKey(f *testing.F) {
	for _, body := range []string{
		`{"type":"event_callback","event_id":"Ev1"}`,
		`{"type":"url_verification","challenge":"c"}`,
		`{"event_id":"\u0000"}`, `{"event_id":{"event_id":"x"}}`, `{"event_id":"Ev1","event_id":"Ev2"}`,
		`{`, `[]`, `null`, "payload=%7B%7D", "",
	} {
		f.Add([]byte(body))
	}
	v, err := webhook.New(webhook.Slack, []string{slackSecret2}, webhook.WithClock(func() time.Time { return now }))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		h := slackHeaders(slackSecret2, now.Unix(), string(body))
		d, err := v.Verify(h, body)
		if err != nil {
			t.Fatalf("a signed body is refused: %v", err)
		}
		kind, _, _ := strings.Cut(d.ID, "=")
		switch {
		case len(d.ID) > webhook.MaxIDLength || strings.ContainsFunc(d.ID, func(r rune) bool { return r <= ' ' || r >= 0x7f }):
			t.Fatalf("ID %q cannot key a record", d.ID)
		case kind == "v0" && d.ID != h.Get("X-Slack-Signature"):
			t.Fatalf("ID %q, want the signature %q", d.ID, h.Get("X-Slack-Signature"))
		case kind != "v0" && kind != "event_id" && kind != "challenge":
			t.Fatalf("ID %q is of no known kind", d.ID)
		case kind != "v0" && !json.Valid(body):
			t.Fatalf("ID %q from a body that is not JSON", d.ID)
		}
	})
}
