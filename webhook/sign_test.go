package webhook_test

import (
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/webhook"
)

func TestSignerRoundTrip(t *testing.T) {
	secret, err := webhook.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	signing, public, err := webhook.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "whsec_") || !strings.HasPrefix(signing, "whsk_") || !strings.HasPrefix(public, "whpk_") {
		t.Fatalf("generated %q… %q… %q…", secret[:6], signing[:5], public[:5])
	}
	clock := webhook.WithClock(func() time.Time { return now })
	signer, err := webhook.NewSigner([]string{secret, signing}, clock)
	if err != nil {
		t.Fatal(err)
	}
	body := `{"type":"invoice.paid"}`
	req, err := http.NewRequest(http.MethodPost, "https://receiver.example/hooks", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	id, err := webhook.NewID()
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^msg_[A-Za-z0-9_-]{22}$`).MatchString(id) {
		t.Fatalf("NewID = %q", id)
	}
	if err := signer.SignRequest(req, id); err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get("webhook-timestamp"); got != "1750000000" {
		t.Errorf("webhook-timestamp = %q, want the Signer's clock", got)
	}
	sigs := strings.Fields(req.Header.Get("webhook-signature"))
	if len(sigs) != 2 || !strings.HasPrefix(sigs[0], "v1,") || !strings.HasPrefix(sigs[1], "v1a,") {
		t.Fatalf("webhook-signature = %q, want one v1 and one v1a", sigs)
	}
	sent, err := io.ReadAll(req.Body)
	if err != nil || string(sent) != body {
		t.Fatalf("the request body after signing = %q, %v", sent, err)
	}
	// Each receiver with either secret accepts it.
	for _, secrets := range [][]string{{secret}, {public}} {
		v, err := webhook.New(webhook.Standard, secrets, clock)
		if err != nil {
			t.Fatal(err)
		}
		d, err := v.Verify(req.Header, sent)
		if err != nil || d.ID != id || !d.Timestamp.Equal(now) {
			t.Errorf("Verify with %.5s…: %+v, %v", secrets[0], d, err)
		}
	}
}

func TestSignRequestReadsABodyWithoutGetBody(t *testing.T) {
	signer, err := webhook.NewSigner([]string{stdSecret})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, "https://receiver.example/hooks", io.NopCloser(strings.NewReader("streamed")))
	if err != nil {
		t.Fatal(err)
	}
	if err := signer.SignRequest(req, "msg_1"); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the body, and again through GetBody
		b, _ := io.ReadAll(req.Body)
		if string(b) != "streamed" {
			t.Fatalf("body = %q", b)
		}
		req.Body, _ = req.GetBody()
	}
	v, err := webhook.New(webhook.Standard, []string{stdSecret})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(req.Header, []byte("streamed")); err != nil {
		t.Fatal(err)
	}
}

func TestSignerRefuses(t *testing.T) {
	tests := []struct {
		name    string
		secrets []string
		id      string
		ts      time.Time
	}{
		{"no secret", nil, "msg_1", now},
		{"a whpk_ public key", []string{"whpk_AAAA"}, "msg_1", now},
		{"a secret that is not base64", []string{"whsec_!!"}, "msg_1", now},
		{"a whsk_ seed of the wrong length", []string{"whsk_AAAA"}, "msg_1", now},
		{"an empty id", []string{stdSecret}, "", now},
		{"an id with a dot", []string{stdSecret}, "msg.1", now},
		{"an id with a space", []string{stdSecret}, "msg 1", now},
		{"a time before 1970", []string{stdSecret}, "msg_1", time.Unix(-1, 0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := webhook.NewSigner(tc.secrets)
			if err == nil {
				_, err = s.Sign(tc.id, tc.ts, []byte("x"))
			}
			if !errors.Is(err, webhook.ErrSigner) {
				t.Fatalf("err = %v, want ErrSigner", err)
			}
		})
	}
}
