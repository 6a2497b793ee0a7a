package webhook_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/webhook"
)

// BenchmarkVerify is the cost of checking one delivery of each scheme
// with a 1 KiB body and one secret (two for standard, the second unused:
// rotation), no store: the CPU a webhook route spends before it records.
func BenchmarkVerify(b *testing.B) {
	body := `{"id":"evt_bench","pad":"` + strings.Repeat("x", 1000) + `"}`
	ts := now.Unix()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		b.Fatal(err)
	}
	v1a := "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, []byte("msg_1."+strconv.FormatInt(ts, 10)+"."+body)))
	for _, bc := range []struct {
		name    string
		scheme  webhook.Scheme
		secrets []string
		header  http.Header
	}{
		{"standard-v1", webhook.Standard, []string{stdSecret2, stdSecret}, stdHeaders(stdSecret, "msg_1", ts, body)},
		{"standard-v1a", webhook.Standard, []string{"whpk_" + base64.StdEncoding.EncodeToString(pub)},
			hdr("webhook-id", "msg_1", "webhook-timestamp", strconv.FormatInt(ts, 10), "webhook-signature", v1a)},
		{"stripe", webhook.Stripe, []string{stripeSecret}, hdr("Stripe-Signature", stripeHeader(stripeSecret, ts, body))},
		{"github", webhook.GitHub, []string{githubSecret}, githubHeaders(githubSecret, "d1", body)},
		{"slack", webhook.Slack, []string{slackSecret2}, slackHeaders(slackSecret2, ts, body)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			v, err := webhook.New(bc.scheme, bc.secrets, webhook.WithClock(func() time.Time { return now }))
			if err != nil {
				b.Fatal(err)
			}
			raw := []byte(body)
			if _, err := v.Verify(bc.header, raw); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(bc.header, raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
