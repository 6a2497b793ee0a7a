package webhook_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/webhook"
)

// The providers' own published examples. Each must verify as published,
// and every tampered variant must be refused; the published signatures
// come from the providers, so a base string assembled in another way than
// theirs (another separator, order or encoding) fails here even where our
// own signer would agree with our own verifier.

// Standard Webhooks' test vectors (standard-webhooks/standard-webhooks,
// libraries/go webhook_test.go TestWebhookSign and
// webhook_asymmetric_test.go TestAsymmetricWebhookSign): one message
// signed with a whsec_ secret (v1) and with a whsk_ seed (v1a).
const (
	swID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	swTimestamp = 1614265330
	swBody      = `{"test": 2432232314}`
	swSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swV1        = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	swSeed      = "whsk_VEVTVFNJR05JTkdLRVlET05PVFVTRVRISVNGT1JBTlk="
	swV1a       = "v1a,tQ9V2XOqn7jL/DQenEFpqIugdBVtiMmER5mhSkXBNwM0mkATuDe6KYYUuxqtaiHeYGb7KaaBRdM5WqyeFiL8Ag=="
)

// GitHub's example (docs.github.com, "Validating webhook deliveries",
// "Testing the webhook payload validation").
const (
	ghSecret    = "It's a Secret to Everybody"
	ghBody      = "Hello, World!"
	ghSignature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	ghDelivery  = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
)

// Slack's example (api.slack.com, "Verifying requests from Slack"): a
// slash command's form body.
const (
	slackSecret    = "8f742231b10e8888abcd99yyyzzz85a5"
	slackTimestamp = 1531420618
	slackBody      = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
	slackSignature = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
)

// swPublic is the whpk_ public key of swSeed (the vector publishes the
// seed only).
func swPublic(t *testing.T) string {
	t.Helper()
	seed, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(swSeed, "whsk_"))
	if err != nil {
		t.Fatal(err)
	}
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	return "whpk_" + base64.StdEncoding.EncodeToString(pub)
}

// otherPublic is the whpk_ key of another seed.
var otherPublic = "whpk_" + base64.StdEncoding.EncodeToString(
	ed25519.NewKeyFromSeed([]byte("another seed, not the vector's..")).Public().(ed25519.PublicKey))

// tamper is a change to a published delivery.
type tamper struct {
	name    string
	header  http.Header
	body    string
	secrets []string // nil: the vector's
	// ok: the change is one the scheme does not sign, and the delivery
	// still verifies (with wantID).
	ok     bool
	wantID string
}

// clockAt is a clock reading ts.
func clockAt(ts int64) webhook.Option {
	return webhook.WithClock(func() time.Time { return time.Unix(ts, 0) })
}

// vector is one published delivery and how to tamper with it.
type vector struct {
	name    string
	scheme  webhook.Scheme
	secrets func(t *testing.T) []string
	now     int64
	header  http.Header
	body    string
	wantID  string
	// other is a well-formed secret of the scheme that signed none of
	// the vectors.
	other string
}

func vectors() []vector {
	return []vector{
		{"Standard Webhooks v1 (HMAC-SHA256)", webhook.Standard, func(*testing.T) []string { return []string{swSecret} }, swTimestamp,
			hdr("webhook-id", swID, "webhook-timestamp", "1614265330", "webhook-signature", swV1), swBody, swID,
			"whsec_b3RoZXIgc2VjcmV0IG9mIDI0IGJ5dGVzIQ=="},
		{"Standard Webhooks v1a (ed25519)", webhook.Standard, func(t *testing.T) []string { return []string{swPublic(t)} }, swTimestamp,
			hdr("webhook-id", swID, "webhook-timestamp", "1614265330", "webhook-signature", swV1a), swBody, swID,
			otherPublic},
		{"GitHub's docs example", webhook.GitHub, func(*testing.T) []string { return []string{ghSecret} }, time.Now().Unix(),
			hdr("X-Hub-Signature-256", ghSignature, "X-GitHub-Delivery", ghDelivery), ghBody, ghDelivery,
			"It's a Secret to Everybody!"},
		{"Slack's docs example", webhook.Slack, func(*testing.T) []string { return []string{slackSecret} }, slackTimestamp,
			hdr("X-Slack-Signature", slackSignature, "X-Slack-Request-Timestamp", "1531420618"), slackBody, slackSignature,
			"8f742231b10e8888abcd99yyyzzz85a6"},
	}
}

func TestPublishedVectorsVerify(t *testing.T) {
	for _, vec := range vectors() {
		t.Run(vec.name, func(t *testing.T) {
			v, err := webhook.New(vec.scheme, vec.secrets(t), clockAt(vec.now))
			if err != nil {
				t.Fatal(err)
			}
			d, err := v.Verify(vec.header, []byte(vec.body))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if d.ID != vec.wantID || d.Scheme != vec.scheme {
				t.Errorf("Delivery = %+v, want ID %q", d, vec.wantID)
			}
		})
	}
}

func TestPublishedVectorsTampered(t *testing.T) {
	for _, vec := range vectors() {
		flipped := []byte(vec.body)
		flipped[len(flipped)/2] ^= 1
		tests := []tamper{
			{name: "one body byte changed", header: vec.header, body: string(flipped)},
			{name: "a byte appended to the body", header: vec.header, body: vec.body + "\n"},
			{name: "another secret", header: vec.header, body: vec.body, secrets: []string{vec.other}},
		}
		switch vec.scheme {
		case webhook.Standard:
			tests = append(tests,
				tamper{name: "the timestamp one second later", header: with(vec.header, "webhook-timestamp", "1614265331"), body: vec.body},
				tamper{name: "another webhook-id", header: with(vec.header, "webhook-id", swID+"x"), body: vec.body})
		case webhook.Slack:
			tests = append(tests, tamper{name: "the timestamp one second later", header: with(vec.header, "X-Slack-Request-Timestamp", "1531420619"), body: vec.body})
		case webhook.GitHub:
			// GitHub signs the body only: a delivery replayed under
			// another X-GitHub-Delivery verifies, and runs again (see the
			// README's design notes).
			tests = append(tests, tamper{name: "another X-GitHub-Delivery verifies: GitHub does not sign it", header: with(vec.header, "X-GitHub-Delivery", "another"), body: vec.body, ok: true, wantID: "another"})
		}
		for _, tc := range tests {
			t.Run(vec.name+": "+tc.name, func(t *testing.T) {
				secrets := tc.secrets
				if secrets == nil {
					secrets = vec.secrets(t)
				}
				v, err := webhook.New(vec.scheme, secrets, clockAt(vec.now))
				if err != nil {
					t.Fatal(err)
				}
				d, err := v.Verify(tc.header, []byte(tc.body))
				switch {
				case tc.ok && (err != nil || d.ID != tc.wantID):
					t.Fatalf("Verify = %+v, %v; want ID %q", d, err, tc.wantID)
				case !tc.ok && !errors.Is(err, webhook.ErrInvalid):
					t.Fatalf("Verify = %+v, %v; want ErrInvalid", d, err)
				}
			})
		}
	}
}

// TestSignerReproducesPublishedVectors: our Standard Webhooks signer
// writes the published signatures byte for byte.
func TestSignerReproducesPublishedVectors(t *testing.T) {
	for _, tc := range []struct {
		name, secret, want string
	}{
		{"v1 with a whsec_ secret", swSecret, swV1},
		{"v1 with the secret without its prefix", swSecret[len("whsec_"):], swV1},
		{"v1a with a whsk_ seed", swSeed, swV1a},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := webhook.NewSigner([]string{tc.secret})
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Sign(swID, time.Unix(swTimestamp, 0), []byte(swBody))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("Sign = %s, want %s", got, tc.want)
			}
		})
	}
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// with returns a copy of h with name set to value.
func with(h http.Header, name, value string) http.Header {
	c := h.Clone()
	c.Set(name, value)
	return c
}
