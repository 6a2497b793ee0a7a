package webhook_test

// Interoperability with the providers' own code, their npm libraries run
// under Node (webhook/interop, installed by npm ci from its lockfile):
// deliveries that standardwebhooks, stripe and @octokit/webhooks-methods
// sign verify with our Verifier, and every tampered variant is refused;
// deliveries our Signer signs verify with standardwebhooks. Without node
// or webhook/interop/node_modules the tests skip, unless
// REPLAYGUARD_TEST_REQUIRE=1 or CI=true, when they fail.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/webhook"
)

// interopDir holds the Node side, from this package's directory.
const interopDir = "interop"

// interopPackages are the npm packages the Node side needs.
var interopPackages = []string{"standardwebhooks", "stripe", "@octokit/webhooks-methods"}

// nodeForInterop returns the node binary, or skips the test (fails under
// REPLAYGUARD_TEST_REQUIRE=1 or CI=true) when node or a package is missing.
func nodeForInterop(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	for _, p := range interopPackages {
		if err == nil {
			_, err = os.Stat(filepath.Join(interopDir, "node_modules", p, "package.json"))
		}
	}
	if err != nil {
		testenv.Missing(t, "webhook interop needs node and webhook/interop/node_modules (run npm ci in webhook/interop): "+err.Error())
	}
	return node
}

// runNode runs interop/script with in as JSON on stdin and returns its
// stdout; err includes its stderr.
func runNode(t *testing.T, node, script string, in any) ([]byte, error) {
	t.Helper()
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = interopDir
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("node %s: %w: %s", script, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// nodeDelivery is the input of interop/sign.mjs.
type nodeDelivery struct {
	Scheme    string `json:"scheme"`
	Secret    string `json:"secret"`
	ID        string `json:"id,omitempty"`
	Timestamp int64  `json:"timestamp"`
	Body      string `json:"body"`
}

// nodeSign signs d with the provider's library and returns its headers.
func nodeSign(t *testing.T, node string, d nodeDelivery) http.Header {
	t.Helper()
	out, err := runNode(t, node, "sign.mjs", d)
	if err != nil {
		t.Fatal(err)
	}
	var signed struct{ Headers map[string]string }
	if err := json.Unmarshal(out, &signed); err != nil {
		t.Fatalf("sign.mjs printed %s: %v", out, err)
	}
	h := http.Header{}
	for k, v := range signed.Headers {
		h.Set(k, v)
	}
	return h
}

func TestProviderLibrariesSignedDeliveriesVerify(t *testing.T) {
	node := nodeForInterop(t)
	secret, err := webhook.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{
		"standard": secret,
		"stripe":   "whsec_" + strings.TrimPrefix(secret, "whsec_")[:32],
		"github":   "a secret, with spaces & punctuation: it's GitHub's",
	}
	others := map[string]string{"standard": stdSecret2, "stripe": "whsec_another", "github": "another secret"}
	bodies := []struct{ name, body string }{
		{"compact JSON", `{"id":"evt_interop_1","type":"invoice.paid","data":{"amount":1299}}`},
		{"pretty JSON with non-ASCII text", "{\n  \"id\": \"evt_interop_2\",\n  \"text\": \"café ☕ — 日本\"\n}\n"},
	}
	for _, scheme := range []string{"standard", "stripe", "github"} {
		for i, b := range bodies {
			t.Run(scheme+", "+b.name, func(t *testing.T) {
				ts := time.Now().Unix()
				id := fmt.Sprintf("msg_interop_%d", i)
				if scheme == "github" {
					id = fmt.Sprintf("72d3162e-cc78-11e3-81ab-4c9367dc095%d", i)
				}
				h := nodeSign(t, node, nodeDelivery{Scheme: scheme, Secret: secrets[scheme], ID: id, Timestamp: ts, Body: b.body})
				wantID := id
				if scheme == "stripe" {
					wantID = fmt.Sprintf("evt_interop_%d", i+1)
				}
				v, err := webhook.New(webhook.Scheme(scheme), []string{others[scheme], secrets[scheme]})
				if err != nil {
					t.Fatal(err)
				}
				d, err := v.Verify(h, []byte(b.body))
				if err != nil || d.ID != wantID {
					t.Fatalf("Verify(%v) = %+v, %v; want ID %s", h, d, err, wantID)
				}

				flipped := []byte(b.body)
				flipped[len(flipped)/3] ^= 0x20
				tampered := []variant{
					{"one body byte", h, flipped, nil},
					{"the body re-encoded", h, reencode(t, b.body), nil},
					{"another secret", h, []byte(b.body), []string{others[scheme]}},
				}
				switch scheme {
				case "standard":
					tampered = append(tampered,
						variant{"the timestamp", with(h, "webhook-timestamp", strconv.FormatInt(ts-1, 10)), []byte(b.body), nil},
						variant{"the ID", with(h, "webhook-id", id+"x"), []byte(b.body), nil})
				case "stripe":
					// The ID is in the body: "one body byte" covers it.
					tampered = append(tampered, variant{"the timestamp", with(h, "Stripe-Signature", strings.Replace(h.Get("Stripe-Signature"), "t="+strconv.FormatInt(ts, 10), "t="+strconv.FormatInt(ts+1, 10), 1)), []byte(b.body), nil})
				}
				for _, tc := range tampered {
					with := tc.only
					if with == nil {
						with = []string{others[scheme], secrets[scheme]}
					}
					v, err := webhook.New(webhook.Scheme(scheme), with)
					if err != nil {
						t.Fatal(err)
					}
					if d, err := v.Verify(tc.header, tc.body); !errors.Is(err, webhook.ErrInvalid) {
						t.Errorf("%s changed: Verify = %+v, %v; want ErrInvalid", tc.name, d, err)
					}
				}
			})
		}
	}
}

// variant is a delivery changed after signing, checked with only (nil:
// the secrets that signed it, beside another one).
type variant struct {
	name   string
	header http.Header
	body   []byte
	only   []string
}

// reencode is body as JSON again with other white space: the same event,
// other bytes, which is what a receiver that parses before it verifies
// would check.
func reencode(t *testing.T, body string) []byte {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	out, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		t.Fatal(err)
	}
	if string(out) == body {
		t.Fatal("re-encoding did not change the bytes")
	}
	return out
}

func TestSignerVerifiesWithStandardWebhooksLibrary(t *testing.T) {
	node := nodeForInterop(t)
	secret, err := webhook.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	other, err := webhook.GenerateSecret()
	if err != nil {
		t.Fatal(err)
	}
	body := `{"type":"contact.created","data":{"name":"Zoë"}}`
	verify := func(secret string, h http.Header, body string) error {
		headers := map[string]string{}
		for k := range h {
			headers[strings.ToLower(k)] = h.Get(k)
		}
		_, err := runNode(t, node, "verify.mjs", map[string]any{"secret": secret, "headers": headers, "body": body})
		return err
	}
	for _, tc := range []struct {
		name    string
		signers []string // the Signer's secrets
		change  func(h http.Header) (secret, body string)
		ok      bool
	}{
		{"one secret", []string{secret}, func(http.Header) (string, string) { return secret, body }, true},
		{"the new and the old secret while rotating: the library finds its own", []string{other, secret}, func(http.Header) (string, string) { return secret, body }, true},
		{"the secret without its prefix", []string{strings.TrimPrefix(secret, "whsec_")}, func(http.Header) (string, string) { return secret, body }, true},
		{"the body changed: refused", []string{secret}, func(http.Header) (string, string) { return secret, body + " " }, false},
		{"the ID changed: refused", []string{secret}, func(h http.Header) (string, string) { h.Set("webhook-id", "msg_other"); return secret, body }, false},
		{"the timestamp changed: refused", []string{secret}, func(h http.Header) (string, string) {
			ts, _ := strconv.ParseInt(h.Get("webhook-timestamp"), 10, 64)
			h.Set("webhook-timestamp", strconv.FormatInt(ts+1, 10))
			return secret, body
		}, false},
		{"checked with another secret: refused", []string{secret}, func(http.Header) (string, string) { return other, body }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := webhook.NewSigner(tc.signers)
			if err != nil {
				t.Fatal(err)
			}
			req, err := http.NewRequest(http.MethodPost, "https://receiver.example/hooks", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.SignRequest(req, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"); err != nil {
				t.Fatal(err)
			}
			checkSecret, checkBody := tc.change(req.Header)
			err = verify(checkSecret, req.Header, checkBody)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("standardwebhooks refused our signature %q: %v", req.Header.Get("webhook-signature"), err)
			case !tc.ok && err == nil:
				t.Fatal("standardwebhooks accepted a changed delivery")
			}
		})
	}
}
