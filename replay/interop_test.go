package replay_test

// Interoperability with an independent RFC 9421 implementation, the npm
// package http-message-signatures (a devDependency of web/sdk), run under
// Node: requests it signs verify with our Verifier, and requests our Go
// Signer signs verify with it. The Node side is web/sdk/interop/*.mjs.
// Without node or web/sdk/node_modules (npm ci) the tests skip, unless
// REPLAYGUARD_TEST_REQUIRE=1 or CI=true, when they fail.

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store/memory"
)

// sdkDir is web/sdk, from this package's directory.
var sdkDir = filepath.Join("..", "web", "sdk")

// nodeForInterop returns the node binary, or skips the test (fails under
// REPLAYGUARD_TEST_REQUIRE=1 or CI=true) when node or the package is missing.
func nodeForInterop(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(sdkDir, "node_modules", "http-message-signatures", "package.json"))
	}
	if err != nil {
		msg := "interop needs node and web/sdk/node_modules/http-message-signatures (run npm ci in web/sdk): " + err.Error()
		testenv.Missing(t, msg)
	}
	return node
}

// runNode runs web/sdk/interop/script with in as JSON on stdin and
// returns its stdout; err includes its stderr.
func runNode(t *testing.T, node, script string, in any) ([]byte, error) {
	t.Helper()
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join("interop", script))
	cmd.Dir = sdkDir
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("node %s: %w: %s", script, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// nodeSignRequest is the input of interop/sign.mjs.
type nodeSignRequest struct {
	Impl    string            `json:"impl"`
	Alg     string            `json:"alg"`
	KeyID   string            `json:"keyid"`
	Secret  []byte            `json:"secret,omitempty"` // base64 in JSON
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    []byte            `json:"body"` // base64 in JSON; null for none
	Created int64             `json:"created"`
	Nonce   string            `json:"nonce"`
	Expires int64             `json:"expires,omitempty"`
	Digest  string            `json:"digest,omitempty"`
	// PrivateKey is a PKCS #8 PEM for ed25519; by default Node generates a key pair.
	PrivateKey string `json:"private_key,omitempty"`
	// Send has Node send the signed request with fetch.
	Send bool `json:"send,omitempty"`
}

// nodeSigned is the output of interop/sign.mjs.
type nodeSigned struct {
	Method    string            `json:"method"`
	URL       string            `json:"url"`
	Headers   map[string]string `json:"headers"`
	PublicKey string            `json:"public_key"`
	Status    int               `json:"status"`   // with Send
	Response  string            `json:"response"` // with Send
}

func randomNonceForTest(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

const (
	implHMS  = "http-message-signatures"
	implOurs = "replayguard" // web/sdk/signer.mjs
)

func TestNodeSignedRequestsVerify(t *testing.T) {
	node := nodeForInterop(t)
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, impl, alg, method, url, body, digest string
		expires                                    bool
	}{
		{"http-message-signatures, hmac-sha256, POST with a body", implHMS, replay.AlgHMACSHA256, http.MethodPost,
			"https://api.example.com/v1/orders?id=7&q=a%20b", `{"hello": "world"}`, "sha-256", false},
		{"http-message-signatures, ed25519, POST with expires and a sha-512 digest", implHMS, replay.AlgEd25519, http.MethodPost,
			"https://API.Example.com:443/v1/orders?id=7", `{"hello": "world"}`, "sha-512", true},
		{"http-message-signatures, ed25519, GET without a query on a port", implHMS, replay.AlgEd25519, http.MethodGet,
			"http://127.0.0.1:8080/v1/orders/7", "", "", false},
		{"http-message-signatures, hmac-sha256, DELETE with a percent-encoded path", implHMS, replay.AlgHMACSHA256, http.MethodDelete,
			"https://api.example.com/v1/orders/%C3%A9t%C3%A9/a%2Fb?x=%2F&y=", "", "", false},
		{"our signer.mjs, hmac-sha256, PUT with a body", implOurs, replay.AlgHMACSHA256, http.MethodPut,
			"https://api.example.com/v1/orders/7?dry_run=1", "payload\n", "", false},
		{"our signer.mjs, ed25519, GET with expires", implOurs, replay.AlgEd25519, http.MethodGet,
			"https://api.example.com/v1/orders", "", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now().Unix()
			in := nodeSignRequest{
				Impl: tc.impl, Alg: tc.alg, KeyID: "client-" + tc.alg, Method: tc.method, URL: tc.url,
				Headers: map[string]string{}, Created: now, Nonce: randomNonceForTest(t), Digest: tc.digest,
			}
			if tc.alg == replay.AlgHMACSHA256 {
				in.Secret = secret
			}
			if tc.body != "" {
				in.Body = []byte(tc.body)
				in.Headers["Content-Type"] = "application/json"
			}
			if tc.expires {
				in.Expires = now + 300
			}
			out, err := runNode(t, node, "sign.mjs", in)
			if err != nil {
				t.Fatal(err)
			}
			var signed nodeSigned
			if err := json.Unmarshal(out, &signed); err != nil {
				t.Fatalf("sign.mjs printed %s: %v", out, err)
			}
			entry := map[string]string{"id": in.KeyID, "alg": tc.alg}
			if tc.alg == replay.AlgHMACSHA256 {
				entry["secret"] = base64.StdEncoding.EncodeToString(secret)
			} else {
				entry["public_key"] = signed.PublicKey // SPKI PEM from Node
			}
			file, _ := json.Marshal(map[string]any{"keys": []any{entry}})
			keys, err := replay.ParseKeys(file)
			if err != nil {
				t.Fatalf("ParseKeys(%s): %v", file, err)
			}
			u, err := url.Parse(signed.URL)
			if err != nil {
				t.Fatal(err)
			}
			h := http.Header{}
			for k, v := range signed.Headers {
				h.Set(k, v)
			}
			m := replay.Message{Method: signed.Method, URL: u, Header: h, Body: in.Body}
			st := memory.New()
			defer st.Close()
			v := replay.NewVerifier(keys, st)
			res, err := v.Verify(context.Background(), m)
			if err != nil {
				t.Fatalf("Verify: %v\nSignature-Input: %s", err, h.Get("Signature-Input"))
			}
			if res.KeyID != in.KeyID || res.Nonce != in.Nonce || res.Created.Unix() != now {
				t.Errorf("Result = %+v", res)
			}
			if _, err := v.Verify(context.Background(), m); !errors.Is(err, replay.ErrReplayed) {
				t.Errorf("the same request again: %v, want ErrReplayed", err)
			}
		})
	}
}

// nodeVerifyRequest is the input of interop/verify.mjs.
type nodeVerifyRequest struct {
	Method  string              `json:"method"`
	URL     string              `json:"url"`
	Headers map[string]string   `json:"headers"`
	Body    []byte              `json:"body"`
	Keys    []map[string]string `json:"keys"`
}

func TestGoSignedRequestsVerifyWithHTTPMessageSignatures(t *testing.T) {
	node := nodeForInterop(t)
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	keys := []map[string]string{
		{"id": "partner-1", "alg": replay.AlgHMACSHA256, "secret": base64.StdEncoding.EncodeToString(secret)},
		{"id": "mobile", "alg": replay.AlgEd25519, "public_key": string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))},
	}
	hmacSigner, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, secret)
	if err != nil {
		t.Fatal(err)
	}
	edSigner, err := replay.NewSigner("mobile", replay.AlgEd25519, priv, replay.WithExpiry(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		signer *replay.Signer
		method string
		url    string
		body   string
		change func(*nodeVerifyRequest) // after signing; nil: must verify
	}{
		{"hmac-sha256, POST with a body", hmacSigner, http.MethodPost, "https://api.example.com/v1/orders?id=7", `{"hello": "world"}`, nil},
		{"ed25519 with expires, POST with a body", edSigner, http.MethodPost, "https://api.example.com/v1/orders?id=7", `{"hello": "world"}`, nil},
		{"ed25519, GET without a query on a port", edSigner, http.MethodGet, "http://127.0.0.1:8080/v1/orders/7", "", nil},
		{"hmac-sha256, DELETE with a percent-encoded path and query", hmacSigner, http.MethodDelete,
			"https://api.example.com/v1/orders/%C3%A9t%C3%A9/a%2Fb?q=a%20b&x=%2F&y=", "", nil},
		{"the body changed: refused", hmacSigner, http.MethodPost, "https://api.example.com/v1/orders", `{"amount": 1}`,
			func(r *nodeVerifyRequest) { r.Body = []byte(`{"amount": 9}`) }},
		{"the path changed: refused", edSigner, http.MethodGet, "https://api.example.com/v1/orders/7", "",
			func(r *nodeVerifyRequest) { r.URL = "https://api.example.com/v1/orders/8" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body *strings.Reader
			req, err := http.NewRequest(tc.method, tc.url, nil)
			if tc.body != "" {
				body = strings.NewReader(tc.body)
				req, err = http.NewRequest(tc.method, tc.url, body)
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.signer.Sign(req); err != nil {
				t.Fatal(err)
			}
			in := nodeVerifyRequest{Method: req.Method, URL: req.URL.String(), Headers: map[string]string{}, Keys: keys}
			for k, v := range req.Header {
				in.Headers[k] = strings.Join(v, ", ")
			}
			if tc.body != "" {
				in.Body = []byte(tc.body)
			}
			if tc.change != nil {
				tc.change(&in)
			}
			out, err := runNode(t, node, "verify.mjs", in)
			switch {
			case tc.change == nil && err != nil:
				t.Errorf("http-message-signatures refused our signature: %v\nSignature-Input: %s", err, req.Header.Get("Signature-Input"))
			case tc.change != nil && err == nil:
				t.Errorf("http-message-signatures accepted a changed request: %s", out)
			}
		})
	}
}

func TestNodeSentRequestsVerifyOverHTTP(t *testing.T) {
	node := nodeForInterop(t)
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	privPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	keys, err := replay.ParseKeys([]byte(fmt.Sprintf(`{"keys": [
		{"id": "partner-1", "alg": "hmac-sha256", "secret": %q},
		{"id": "mobile", "alg": "ed25519", "public_key": %q}]}`,
		base64.StdEncoding.EncodeToString(secret), base64.StdEncoding.EncodeToString(pub))))
	if err != nil {
		t.Fatal(err)
	}
	st := memory.New()
	t.Cleanup(func() { st.Close() })
	srv := newVerifyingServer(t, replay.NewVerifier(keys, st))
	for _, tc := range []struct {
		name, impl, alg, method, path, body string
	}{
		{"http-message-signatures, hmac-sha256, POST", implHMS, replay.AlgHMACSHA256, http.MethodPost, "/v1/orders?id=7&q=a%20b", `{"hello": "world"}`},
		{"http-message-signatures, ed25519, GET", implHMS, replay.AlgEd25519, http.MethodGet, "/v1/orders/7", ""},
		{"our signer.mjs, hmac-sha256, PUT", implOurs, replay.AlgHMACSHA256, http.MethodPut, "/v1/orders/7?dry_run", "payload"},
		{"our signer.mjs, ed25519, DELETE with an encoded path", implOurs, replay.AlgEd25519, http.MethodDelete, "/v1/orders/%C3%A9t%C3%A9?x=%2F", ""},
		// WHATWG URLs (fetch, browsers, Deno) leave | and ^ unescaped in
		// paths; the server must sign the path as received.
		{"http-message-signatures, hmac-sha256, a path with | and ^", implHMS, replay.AlgHMACSHA256, http.MethodGet, "/v1/items/a|b^c", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := nodeSignRequest{
				Impl: tc.impl, Alg: tc.alg, KeyID: map[string]string{replay.AlgHMACSHA256: "partner-1", replay.AlgEd25519: "mobile"}[tc.alg],
				Method: tc.method, URL: srv.URL + tc.path, Headers: map[string]string{}, Created: time.Now().Unix(),
				Nonce: randomNonceForTest(t), Send: true,
			}
			if tc.alg == replay.AlgHMACSHA256 {
				in.Secret = secret
			} else {
				in.PrivateKey = privPEM
			}
			if tc.body != "" {
				in.Body = []byte(tc.body)
				in.Headers["Content-Type"] = "application/json"
			}
			out, err := runNode(t, node, "sign.mjs", in)
			if err != nil {
				t.Fatal(err)
			}
			var got nodeSigned
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("sign.mjs printed %s: %v", out, err)
			}
			if want := "verified " + in.KeyID + " " + tc.body; got.Status != http.StatusOK || got.Response != want {
				t.Errorf("%s %s: %d %s\nSignature-Input: %s", tc.method, got.URL, got.Status, got.Response, got.Headers["Signature-Input"])
			}
		})
	}
}
