package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/replayguard/replayguard/webhook"
)

// webhookSecret is the fixed Standard Webhooks secret of the webhook
// modes: "load webhook-secret" prints it for the gateway's secret_env
// (webhook.sh). A benchmark secret, never a real one.
var webhookSecret = func() string {
	s := sha256.Sum256([]byte("replayguard-load-test-webhook-secret"))
	return "whsec_" + base64.StdEncoding.EncodeToString(s[:])
}()

// webhookSigner signs the webhook modes' deliveries.
var webhookSigner = func() *webhook.Signer {
	s, err := webhook.NewSigner([]string{webhookSecret})
	if err != nil {
		panic(err) // a constant secret
	}
	return s
}()

// webhookSecretCmd is "load webhook-secret": it prints webhookSecret.
func webhookSecretCmd(_ []string, w io.Writer) error {
	_, err := fmt.Fprintln(w, webhookSecret)
	return err
}

// orderHeaders are the headers of a gateway mode's request for the order
// body with key: Idempotency-Key in the keyed modes; in the webhook modes
// a Standard Webhooks delivery with the ID key, signed now, as a provider
// signs every attempt (a redelivery keeps its ID and gets a new
// timestamp and signature).
func orderHeaders(m gatewayMode, body []byte, key string) (http.Header, error) {
	h := http.Header{}
	switch {
	case m.webhook:
		now := time.Now()
		sig, err := webhookSigner.Sign(key, now, body)
		if err != nil {
			return nil, err
		}
		h.Set("webhook-id", key)
		h.Set("webhook-timestamp", fmt.Sprint(now.Unix()))
		h.Set("webhook-signature", sig)
	case key != "":
		h.Set(keyHeader(key), key)
	}
	return h, nil
}

// sendOrder sends a gateway mode's request for the order body with key.
func (r *runner) sendOrder(ctx context.Context, t *tally, body []byte, key string) (int, http.Header, []byte, bool) {
	h, err := orderHeaders(gatewayModes[r.cfg.mode], body, key)
	if err != nil {
		t.fail("signing: %v", err)
		return 0, nil, nil, false
	}
	return r.sendHeader(ctx, t, r.cfg.path, h, body)
}
