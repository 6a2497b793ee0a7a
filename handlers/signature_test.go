package handlers_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/replay"
)

const verifyKey = "verify-api-key"

// signedOrder is the request a backend received, signed by the partner's
// Signer, as POST /v1/signatures/verify takes it.
func signedOrder(t *testing.T, signer *replay.Signer, body string) map[string]any {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "https://api.example.com/v1/orders?id=7", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if err := signer.Sign(req); err != nil {
		t.Fatal(err)
	}
	headers := map[string]string{}
	for name := range req.Header {
		headers[name] = req.Header.Get(name)
	}
	return map[string]any{"method": req.Method, "url": req.URL.String(), "headers": headers, "body": base64.StdEncoding.EncodeToString([]byte(body))}
}

// TestVerifyEndpoint checks POST /v1/signatures/verify: a signed request
// verifies once per nonce, every refusal is its problem, and malformed
// bodies are 400 before anything is verified.
func TestVerifyEndpoint(t *testing.T) {
	secret := []byte(strings.Repeat("k", 32))
	keys, err := replay.NewKeys(replay.Key{ID: "partner-1", Alg: replay.AlgHMACSHA256, Secret: secret, Label: "partner"})
	if err != nil {
		t.Fatal(err)
	}
	signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, secret)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := replay.NewSigner("partner-2", replay.AlgHMACSHA256, secret)
	if err != nil {
		t.Fatal(err)
	}
	// A step posts body (with the API key unless noAuth); "again" resends
	// the body of the step before.
	type step struct {
		name       string
		body       func(prev map[string]any) map[string]any
		noAuth     bool
		wantStatus int
		wantCode   string // "" for 200 verified
	}
	fresh := func(s *replay.Signer, body string) func(map[string]any) map[string]any {
		return func(map[string]any) map[string]any { return signedOrder(t, s, body) }
	}
	again := func(prev map[string]any) map[string]any { return prev }
	edit := func(f func(m map[string]any)) func(map[string]any) map[string]any {
		return func(map[string]any) map[string]any {
			m := signedOrder(t, signer, `{"item":"book"}`)
			f(m)
			return m
		}
	}
	tests := []struct {
		name        string
		verifier    bool
		apiKeys     bool
		steps       []step
		wantMetrics map[string]float64
	}{
		{"a signed request verifies once per nonce", true, false, []step{
			{"signed", fresh(signer, `{"item":"book"}`), false, 200, ""},
			{"sent again", again, false, 401, "replayed_request"},
			{"signed anew", fresh(signer, `{"item":"book"}`), false, 200, ""},
			{"an unknown key", fresh(stranger, `{"item":"book"}`), false, 401, "signature_invalid"},
		}, map[string]float64{"verified": 2, "replayed_request": 1, "signature_invalid": 1}},
		{"a request that is not the signed one is refused", true, false, []step{
			{"another body", edit(func(m map[string]any) { m["body"] = base64.StdEncoding.EncodeToString([]byte(`{"item":"car"}`)) }), false, 401, "signature_invalid"},
			{"another URL", edit(func(m map[string]any) { m["url"] = "https://api.example.com/v1/orders?id=8" }), false, 401, "signature_invalid"},
			{"no signature", edit(func(m map[string]any) {
				h := m["headers"].(map[string]string)
				delete(h, "Signature")
				delete(h, "Signature-Input")
			}), false, 401, "signature_missing"},
		}, map[string]float64{"signature_invalid": 2, "signature_missing": 1}},
		{"a malformed body is 400", true, false, []step{
			{"no method", edit(func(m map[string]any) { delete(m, "method") }), false, 400, "invalid_request"},
			{"a method that is not a token", edit(func(m map[string]any) { m["method"] = "PO ST" }), false, 400, "invalid_request"},
			{"a relative URL", edit(func(m map[string]any) { m["url"] = "/v1/orders" }), false, 400, "invalid_request"},
			{"a URL with a fragment", edit(func(m map[string]any) { m["url"] = "https://api.example.com/v1/orders#x" }), false, 400, "invalid_request"},
			{"a header given twice", edit(func(m map[string]any) { m["headers"].(map[string]string)["content-type"] = "text/plain" }), false, 400, "invalid_request"},
			{"a header value with a line break", edit(func(m map[string]any) { m["headers"].(map[string]string)["X-A"] = "a\r\nb" }), false, 400, "invalid_request"},
			{"a body that is not base64", edit(func(m map[string]any) { m["body"] = "not base64!" }), false, 400, "invalid_request"},
			{"an unknown field", edit(func(m map[string]any) { m["trailers"] = map[string]string{} }), false, 400, "invalid_request"},
		}, map[string]float64{"invalid_request": 8}},
		{"with API keys the caller must present one", true, true, []step{
			{"none", fresh(signer, `{"item":"book"}`), true, 401, "unauthorized"},
			{"the right one", again, false, 200, ""},
		}, map[string]float64{"unauthorized": 1, "verified": 1}},
		{"without a verifier the route is 404 and counts nothing", false, false, []step{
			{"signed", fresh(signer, `{"item":"book"}`), false, 404, "not_found"},
		}, map[string]float64{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := newRecordStore(t)
			m := metrics.New()
			opts := []handlers.Option{handlers.WithMetrics(m), quietLogs}
			if tc.verifier {
				opts = append(opts, handlers.WithVerifier(replay.NewVerifier(keys, st)))
			}
			if tc.apiKeys {
				opts = append(opts, handlers.WithAPIKeys(verifyKey))
			}
			e, err := handlers.New(newTokenService(t, st), opts...).Engine()
			if err != nil {
				t.Fatal(err)
			}
			var prev map[string]any
			for _, s := range tc.steps {
				body := s.body(prev)
				prev = body
				data, err := json.Marshal(body)
				if err != nil {
					t.Fatal(err)
				}
				req := httptest.NewRequest(http.MethodPost, "/v1/signatures/verify", bytes.NewReader(data))
				req.Header.Set("Content-Type", "application/json")
				if !s.noAuth {
					req.Header.Set("Authorization", "Bearer "+verifyKey)
				}
				rec := httptest.NewRecorder()
				e.ServeHTTP(rec, req)
				if rec.Code != s.wantStatus {
					t.Fatalf("%s: %d %s, want %d %q", s.name, rec.Code, rec.Body, s.wantStatus, s.wantCode)
				}
				if s.wantCode != "" {
					if got := problemCode(t, rec); got != s.wantCode {
						t.Fatalf("%s: code %q, want %q", s.name, got, s.wantCode)
					}
					wantAuth := map[string]string{"unauthorized": "Bearer", "replayed_request": "Signature", "signature_invalid": "Signature", "signature_missing": "Signature"}[s.wantCode]
					if got := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(got, wantAuth) || (wantAuth == "") != (got == "") {
						t.Fatalf("%s: WWW-Authenticate = %q, want %s", s.name, got, wantAuth)
					}
					continue
				}
				var v struct {
					Status  string `json:"status"`
					KeyID   string `json:"keyid"`
					Created int64  `json:"created"`
					Nonce   string `json:"nonce"`
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil || v.Status != "verified" || v.KeyID != "partner-1" || v.Created == 0 || v.Nonce == "" {
					t.Fatalf("%s: body %s (%v)", s.name, rec.Body, err)
				}
				if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
					t.Fatalf("%s: Cache-Control = %q", s.name, cc)
				}
			}
			families, err := m.Registry.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]float64{}
			for _, f := range families {
				if f.GetName() != "replayguard_signature_verifications_total" {
					continue
				}
				for _, mt := range f.GetMetric() {
					got[mt.GetLabel()[0].GetValue()] = mt.GetCounter().GetValue()
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.wantMetrics) {
				t.Fatalf("verification outcomes = %v, want %v", got, tc.wantMetrics)
			}
		})
	}
}
