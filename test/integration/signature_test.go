package integration

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// vectorDir holds the RFC 9421 appendix B test vectors.
const vectorDir = "../../replay/testdata/rfc9421"

// clientKey is a client's signing key and keyid.
type clientKey struct {
	id     string
	alg    string
	secret []byte
	priv   ed25519.PrivateKey
}

func newHMACKey(t testing.TB, id string) clientKey {
	t.Helper()
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	return clientKey{id: id, alg: replay.AlgHMACSHA256, secret: secret}
}

func newEd25519Key(t testing.TB, id string) clientKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return clientKey{id: id, alg: replay.AlgEd25519, priv: priv}
}

// keySource is the server's view of keys.
func keySource(t testing.TB, keys ...clientKey) *replay.Keys {
	t.Helper()
	var rks []replay.Key
	for _, k := range keys {
		rk := replay.Key{ID: k.id, Alg: k.alg, Secret: k.secret}
		if k.priv != nil {
			rk.PublicKey = k.priv.Public().(ed25519.PublicKey)
		}
		rks = append(rks, rk)
	}
	ks, err := replay.NewKeys(rks...)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// sigSpec says how to sign; zero values mean the required components
// (plus content-digest with a body), created now and a random nonce.
type sigSpec struct {
	components []string
	created    time.Time
	nonce      string
}

// signHeaders signs the request method target (an absolute URI) with
// header and body as a client does, and returns header with
// Content-Digest (for a body), Signature-Input and Signature added.
func signHeaders(t testing.TB, k clientKey, method, target string, header http.Header, body []byte, s sigSpec) http.Header {
	t.Helper()
	req, err := http.NewRequest(method, target, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := header.Clone()
	if h == nil {
		h = http.Header{}
	}
	comps := s.components
	if comps == nil {
		comps = append([]string(nil), replay.DefaultRequired...)
		if len(body) > 0 {
			comps = append(comps, "content-digest")
		}
	}
	if len(body) > 0 && h.Get("Content-Digest") == "" {
		h.Set("Content-Digest", replay.ContentDigest(body))
	}
	if s.created.IsZero() {
		s.created = time.Now()
	}
	if s.nonce == "" {
		s.nonce = randomHex(t, 16)
	}
	il := httpsfv.InnerList{Params: httpsfv.NewParams()}
	for _, c := range comps {
		il.Items = append(il.Items, httpsfv.NewItem(c))
	}
	il.Params.Add("created", s.created.Unix())
	il.Params.Add("nonce", s.nonce)
	il.Params.Add("keyid", k.id)
	base, err := replay.SignatureBase(replay.Message{Method: method, URL: req.URL, Header: h, Body: body}, "sig1", il)
	if err != nil {
		t.Fatal(err)
	}
	var sig []byte
	if k.alg == replay.AlgEd25519 {
		sig = ed25519.Sign(k.priv, []byte(base))
	} else {
		mac := hmac.New(sha256.New, k.secret)
		mac.Write([]byte(base))
		sig = mac.Sum(nil)
	}
	d := httpsfv.NewDictionary()
	d.Add("sig1", il)
	in, err := httpsfv.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	h.Set("Signature-Input", in)
	h.Set("Signature", "sig1=:"+base64.StdEncoding.EncodeToString(sig)+":")
	return h
}

// verifyBody is the body of POST /v1/signatures/verify.
type verifyBody struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body,omitempty"`
}

// verified is the body of 200 OK from POST /v1/signatures/verify.
type verified struct {
	Status  string `json:"status"`
	KeyID   string `json:"keyid"`
	Created int64  `json:"created"`
	Nonce   string `json:"nonce"`
}

// describe is the verify request for a request with header and body,
// with header names lowercased as a Node or Python server hands them on.
func describe(method, target string, header http.Header, body []byte) verifyBody {
	vb := verifyBody{Method: method, URL: target, Headers: map[string]string{}}
	for name, vals := range header {
		vb.Headers[strings.ToLower(name)] = strings.Join(vals, ", ")
	}
	if len(body) > 0 {
		vb.Body = base64.StdEncoding.EncodeToString(body)
	}
	return vb
}

// signedBody is the JSON verify request for a request signed with k.
func signedBody(t testing.TB, k clientKey, method, target string, body []byte, s sigSpec) string {
	t.Helper()
	h := http.Header{}
	if len(body) > 0 {
		h.Set("Content-Type", "application/json")
	}
	return jsonOf(t, describe(method, target, signHeaders(t, k, method, target, h, body, s), body))
}

func jsonOf(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// vectorBody is the verify request for the RFC 9421 B.2 test-request
// signed as the vector file headers (e.g. "b25.headers") says.
func vectorBody(t testing.TB, headers string) string {
	t.Helper()
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(vectorDir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(read("test-request.http"))))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		t.Fatal(err)
	}
	extra, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(read(headers), '\n')))).ReadMIMEHeader()
	if err != nil {
		t.Fatal(err)
	}
	h := req.Header.Clone()
	for k, v := range extra {
		h[k] = v
	}
	return jsonOf(t, describe(req.Method, "https://"+req.Host+req.URL.RequestURI(), h, body))
}

// signatureEnv is a set of servers with signature verification on the
// memory store.
type signatureEnv struct {
	partner, mobile, stranger clientKey
	// open verifies without API keys; keyed needs one; broken cannot
	// record nonces; vectors knows the RFC 9421 keys; none has no
	// verifier.
	open, keyed, broken, vectors, none *server
}

func newSignatureEnv(t *testing.T) *signatureEnv {
	e := &signatureEnv{partner: newHMACKey(t, "partner-1"), mobile: newEd25519Key(t, "mobile"), stranger: newHMACKey(t, "stranger")}
	keys := keySource(t, e.partner, e.mobile)
	withVerifier := func(st store.Store, keys replay.KeySource, more ...handlers.Option) serverConfig {
		return serverConfig{apiOpts: append([]handlers.Option{handlers.WithVerifier(replay.NewVerifier(keys, st))}, more...)}
	}
	st := memory.New()
	e.open = startServer(t, st, withVerifier(st, keys))
	st = memory.New()
	e.keyed = startServer(t, st, withVerifier(st, keys, handlers.WithAPIKeys(apiKey)))
	e.broken = startServer(t, brokenStore{}, withVerifier(brokenStore{}, keys))
	rfcKeys, err := replay.LoadKeys(filepath.Join(vectorDir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	st = memory.New()
	e.vectors = startServer(t, st, withVerifier(st, rfcKeys))
	e.none = startServer(t, memory.New(), serverConfig{})
	return e
}

// TestSignatureVerifyContract checks every answer of POST
// /v1/signatures/verify over real HTTP.
func TestSignatureVerifyContract(t *testing.T) {
	e := newSignatureEnv(t)
	const target = "https://api.example.com/v1/orders?id=7"
	order := []byte(`{"item":"book","qty":1}`)
	const path = "/v1/signatures/verify"

	tests := []struct {
		name   string
		server func(*signatureEnv) *server
		body   func(t *testing.T, e *signatureEnv) string
		header []string
		status int
		code   string
	}{
		{"a signed POST with a body is verified", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "POST", target, order, sigSpec{})
		}, nil, 200, ""},
		{"a signed GET with ed25519 is verified", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.mobile, "GET", "https://api.example.com/v1/orders", nil, sigSpec{})
		}, nil, 200, ""},
		{"header names are case-insensitive", nil, func(t *testing.T, e *signatureEnv) string {
			vb := describe("POST", target, signHeaders(t, e.partner, "POST", target, nil, order, sigSpec{}), order)
			h := map[string]string{}
			for name, v := range vb.Headers {
				h[strings.ToUpper(name)] = v
			}
			vb.Headers = h
			return jsonOf(t, vb)
		}, nil, 200, ""},
		{"@target-uri in place of @query is verified", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "DELETE", target, nil, sigSpec{components: []string{"@method", "@authority", "@path", "@target-uri"}})
		}, nil, 200, ""},
		{"the same request twice is replayed_request", nil, func(t *testing.T, e *signatureEnv) string {
			b := signedBody(t, e.partner, "POST", target, order, sigSpec{})
			if r := e.open.do(t, http.MethodPost, path, b); r.Status != 200 {
				t.Fatalf("first: %d %s", r.Status, r.Body)
			}
			return b
		}, nil, 401, "replayed_request"},
		{"the same nonce with another key is verified (nonces are scoped per key ID)", nil, func(t *testing.T, e *signatureEnv) string {
			if r := e.open.do(t, http.MethodPost, path, signedBody(t, e.partner, "GET", target, nil, sigSpec{nonce: "shared-nonce"})); r.Status != 200 {
				t.Fatalf("first: %d %s", r.Status, r.Body)
			}
			return signedBody(t, e.mobile, "GET", target, nil, sigSpec{nonce: "shared-nonce"})
		}, nil, 200, ""},
		{"no signature is signature_missing", nil, func(t *testing.T, e *signatureEnv) string {
			return jsonOf(t, verifyBody{Method: "GET", URL: target, Headers: map[string]string{"accept": "application/json"}})
		}, nil, 401, "signature_missing"},
		{"no headers at all is signature_missing", nil, func(t *testing.T, e *signatureEnv) string {
			return `{"method":"GET","url":"https://api.example.com/"}`
		}, nil, 401, "signature_missing"},
		{"a changed body is signature_invalid", nil, func(t *testing.T, e *signatureEnv) string {
			vb := describe("POST", target, signHeaders(t, e.partner, "POST", target, nil, order, sigSpec{}), order)
			vb.Body = base64.StdEncoding.EncodeToString([]byte(`{"item":"book","qty":9}`))
			return jsonOf(t, vb)
		}, nil, 401, "signature_invalid"},
		{"a changed URL is signature_invalid", nil, func(t *testing.T, e *signatureEnv) string {
			vb := describe("POST", target, signHeaders(t, e.partner, "POST", target, nil, order, sigSpec{}), order)
			vb.URL = "https://api.example.com/v1/orders?id=8"
			return jsonOf(t, vb)
		}, nil, 401, "signature_invalid"},
		{"a changed method is signature_invalid", nil, func(t *testing.T, e *signatureEnv) string {
			vb := describe("POST", target, signHeaders(t, e.partner, "POST", target, nil, order, sigSpec{}), order)
			vb.Method = "PUT"
			return jsonOf(t, vb)
		}, nil, 401, "signature_invalid"},
		{"a covered header that is absent is signature_invalid", nil, func(t *testing.T, e *signatureEnv) string {
			h := http.Header{"Authorization": {"Bearer x"}}
			vb := describe("GET", target, signHeaders(t, e.partner, "GET", target, h, nil, sigSpec{components: []string{"@method", "@authority", "@path", "@query", "authorization"}}), nil)
			delete(vb.Headers, "authorization")
			return jsonOf(t, vb)
		}, nil, 401, "signature_invalid"},
		{"an unknown key is signature_invalid", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.stranger, "GET", target, nil, sigSpec{})
		}, nil, 401, "signature_invalid"},
		{"a signature not covering @authority is signature_invalid", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{components: []string{"@method", "@path", "@query"}})
		}, nil, 401, "signature_invalid"},
		{"a body not covered by content-digest is signature_invalid", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "POST", target, order, sigSpec{components: replay.DefaultRequired})
		}, nil, 401, "signature_invalid"},
		{"a nonce of 129 bytes is signature_invalid", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{nonce: strings.Repeat("n", replay.MaxNonceLen+1)})
		}, nil, 401, "signature_invalid"},
		{"a nonce of 128 bytes is verified", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{nonce: strings.Repeat("n", replay.MaxNonceLen)})
		}, nil, 200, ""},
		{"RFC 9421 B.2.5 (hmac-sha256, no nonce, 2021) is signature_invalid", func(e *signatureEnv) *server { return e.vectors }, func(t *testing.T, e *signatureEnv) string {
			return vectorBody(t, "b25.headers")
		}, nil, 401, "signature_invalid"},
		{"RFC 9421 B.2.6 (ed25519, no nonce, 2021) is signature_invalid", func(e *signatureEnv) *server { return e.vectors }, func(t *testing.T, e *signatureEnv) string {
			return vectorBody(t, "b26.headers")
		}, nil, 401, "signature_invalid"},
		{"created beyond the window is signature_expired", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{created: time.Now().Add(-replay.DefaultWindow - time.Minute)})
		}, nil, 401, "signature_expired"},
		{"created in the future beyond the window is signature_expired", nil, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{created: time.Now().Add(replay.DefaultWindow + time.Minute)})
		}, nil, 401, "signature_expired"},
		{"a store that cannot record the nonce is 503 store_unavailable", func(e *signatureEnv) *server { return e.broken }, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{})
		}, nil, 503, "store_unavailable"},
		{"without an API key on a keyed server is 401 unauthorized", func(e *signatureEnv) *server { return e.keyed }, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{})
		}, nil, 401, "unauthorized"},
		{"with a wrong API key is 401 unauthorized", func(e *signatureEnv) *server { return e.keyed }, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{})
		}, []string{"Authorization", "Bearer wrong"}, 401, "unauthorized"},
		{"with the API key is verified", func(e *signatureEnv) *server { return e.keyed }, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{})
		}, bearer, 200, ""},
		{"without a verifier the route is 404 not_found", func(e *signatureEnv) *server { return e.none }, func(t *testing.T, e *signatureEnv) string {
			return signedBody(t, e.partner, "GET", target, nil, sigSpec{})
		}, nil, 404, "not_found"},
		{"malformed JSON is invalid_request", nil, func(*testing.T, *signatureEnv) string { return `{"method":` }, nil, 400, "invalid_request"},
		{"an empty body is invalid_request (method is required)", nil, func(*testing.T, *signatureEnv) string { return "" }, nil, 400, "invalid_request"},
		{"an unknown member is invalid_request", nil, func(*testing.T, *signatureEnv) string {
			return `{"method":"GET","url":"https://api.example.com/","headers":{},"extra":1}`
		}, nil, 400, "invalid_request"},
		{"a relative URL is invalid_request", nil, func(*testing.T, *signatureEnv) string {
			return `{"method":"GET","url":"/v1/orders","headers":{"signature":"x"}}`
		}, nil, 400, "invalid_request"},
		{"an ftp URL is invalid_request", nil, func(*testing.T, *signatureEnv) string {
			return `{"method":"GET","url":"ftp://api.example.com/x","headers":{}}`
		}, nil, 400, "invalid_request"},
		{"a header value that is not a string is invalid_request", nil, func(*testing.T, *signatureEnv) string {
			return `{"method":"GET","url":"https://api.example.com/","headers":{"signature":["a","b"]}}`
		}, nil, 400, "invalid_request"},
		{"a header given twice in different case is invalid_request", nil, func(*testing.T, *signatureEnv) string {
			return `{"method":"GET","url":"https://api.example.com/","headers":{"Signature":"a","signature":"b"}}`
		}, nil, 400, "invalid_request"},
		{"a header value with a line break is invalid_request", nil, func(*testing.T, *signatureEnv) string {
			return `{"method":"GET","url":"https://api.example.com/","headers":{"x-a":"1\r\nx-b: 2"}}`
		}, nil, 400, "invalid_request"},
		{"a body that is not base64 is invalid_request", nil, func(*testing.T, *signatureEnv) string {
			return `{"method":"POST","url":"https://api.example.com/","headers":{},"body":"not base64!"}`
		}, nil, 400, "invalid_request"},
		{"a request over 64 KiB is payload_too_large", nil, func(*testing.T, *signatureEnv) string {
			return `{"method":"POST","url":"https://api.example.com/","headers":{},"body":"` + strings.Repeat("A", handlers.MaxBodyBytes) + `"}`
		}, nil, 413, "payload_too_large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := e.open
			if tc.server != nil {
				s = tc.server(e)
			}
			body := tc.body(t, e)
			r := s.do(t, http.MethodPost, path, body, tc.header...)
			if tc.code != "" {
				wantProblem(t, r, tc.status, tc.code)
				if r.Status == 401 && tc.code != "unauthorized" && !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Signature") {
					t.Errorf("WWW-Authenticate = %q, want Signature", r.Header.Get("WWW-Authenticate"))
				}
				if tc.code == "store_unavailable" && strings.Contains(string(r.Body), "10.9.8.7") {
					t.Errorf("the problem leaks the store error: %s", r.Body)
				}
				if tc.code == "signature_expired" {
					wantServerTime(t, r)
				}
				return
			}
			wantVerified(t, r, body)
		})
	}

	t.Run("GET is 405 method_not_allowed", func(t *testing.T) {
		wantProblem(t, e.open.do(t, http.MethodGet, path, ""), http.StatusMethodNotAllowed, "method_not_allowed")
	})
}

// wantVerified requires r to be 200 verified for the request described
// by the JSON body sent: keyid, created (a JSON integer) and nonce from
// its Signature-Input.
func wantVerified(t *testing.T, r reply, sent string) {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", r.Status, r.Body)
	}
	wantMediaType(t, r, "application/json")
	if got := r.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", got)
	}
	var raw map[string]json.RawMessage
	decode(t, r, &raw)
	if len(raw) != 4 {
		t.Errorf("members %s, want exactly status, keyid, created, nonce", r.Body)
	}
	if !regexp.MustCompile(`^[0-9]+$`).Match(raw["created"]) {
		t.Errorf("created = %s, want a JSON integer", raw["created"])
	}
	var got verified
	decode(t, r, &got)
	var vb verifyBody
	if err := json.Unmarshal([]byte(sent), &vb); err != nil {
		t.Fatal(err)
	}
	var input string
	for name, v := range vb.Headers {
		if strings.EqualFold(name, "signature-input") {
			input = v
		}
	}
	d, err := httpsfv.UnmarshalDictionary([]string{input})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := d.Get("sig1")
	params := m.(httpsfv.InnerList).Params
	created, _ := params.Get("created")
	nonce, _ := params.Get("nonce")
	keyid, _ := params.Get("keyid")
	want := verified{Status: "verified", KeyID: keyid.(string), Created: created.(int64), Nonce: nonce.(string)}
	if got != want {
		t.Errorf("body = %+v, want %+v", got, want)
	}
}

// wantServerTime requires the problem in r to carry server_time, RFC 3339
// in UTC, close to now.
func wantServerTime(t *testing.T, r reply) {
	t.Helper()
	var p struct {
		ServerTime string `json:"server_time"`
	}
	decode(t, r, &p)
	at, err := time.Parse(time.RFC3339, p.ServerTime)
	if err != nil || !strings.HasSuffix(p.ServerTime, "Z") {
		t.Fatalf("server_time = %q, want RFC 3339 UTC: %s", p.ServerTime, r.Body)
	}
	if d := time.Since(at); d < -2*time.Second || d > 10*time.Second {
		t.Errorf("server_time %s is %v from now", p.ServerTime, d)
	}
}

// TestSignatureVerifyMetrics checks the outcome counter.
func TestSignatureVerifyMetrics(t *testing.T) {
	e := newSignatureEnv(t)
	b := signedBody(t, e.partner, "GET", "https://api.example.com/", nil, sigSpec{})
	e.open.do(t, http.MethodPost, "/v1/signatures/verify", b)
	e.open.do(t, http.MethodPost, "/v1/signatures/verify", b)
	e.open.do(t, http.MethodPost, "/v1/signatures/verify", `{"method":"GET","url":"https://api.example.com/"}`)
	text := string(e.open.do(t, http.MethodGet, "/metrics", "").Body)
	for _, sample := range []string{
		`replayguard_signature_verifications_total{outcome="verified"} 1`,
		`replayguard_signature_verifications_total{outcome="replayed_request"} 1`,
		`replayguard_signature_verifications_total{outcome="signature_missing"} 1`,
	} {
		if !strings.Contains(text, "\n"+sample+"\n") {
			t.Errorf("/metrics lacks the sample %q", sample)
		}
	}
}

// TestSignatureMiddlewareOverHTTP runs the Gin middleware behind a real
// listener, plain and TLS: a request signed for the URL the client calls
// is accepted once, with its body intact, and its replay refused.
func TestSignatureMiddlewareOverHTTP(t *testing.T) {
	partner := newHMACKey(t, "partner-1")
	for _, tc := range []struct {
		name  string
		start func(http.Handler) *httptest.Server
	}{
		{"http", httptest.NewServer},
		{"https", httptest.NewTLSServer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := memory.New()
			t.Cleanup(func() { _ = st.Close() })
			signed := guard.RequireSignature(replay.NewVerifier(keySource(t, partner), st))
			r := gin.New()
			r.POST("/v1/orders", guard.Gin(signed), func(c *gin.Context) {
				res, _ := guard.SignatureFrom(c.Request.Context())
				body, _ := io.ReadAll(c.Request.Body)
				c.String(http.StatusCreated, "%s %s", res.KeyID, body)
			})
			ts := tc.start(r)
			t.Cleanup(ts.Close)
			target := ts.URL + "/v1/orders?id=7"
			body := []byte(`{"item":"book"}`)
			// @target-uri covers the scheme, so http and https differ.
			h := signHeaders(t, partner, "POST", target, http.Header{"Content-Type": {"application/json"}}, body,
				sigSpec{components: []string{"@method", "@authority", "@path", "@target-uri", "content-digest"}})
			var got []reply
			for range 2 {
				req := mustRequest(t, http.MethodPost, target, body)
				req.Header = h.Clone()
				rep, err := send(ts.Client(), req)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, rep)
			}
			if got[0].Status != http.StatusCreated || string(got[0].Body) != `partner-1 {"item":"book"}` {
				t.Fatalf("first = %d %s", got[0].Status, got[0].Body)
			}
			wantProblem(t, got[1], http.StatusUnauthorized, "replayed_request")

			// replay.Transport signs each request anew: both are accepted.
			signer, err := replay.NewSigner(partner.id, partner.alg, partner.secret)
			if err != nil {
				t.Fatal(err)
			}
			client := &http.Client{Transport: &replay.Transport{Signer: signer, Base: ts.Client().Transport}}
			for i := range 2 {
				rep, err := send(client, mustRequest(t, http.MethodPost, target, body))
				if err != nil {
					t.Fatal(err)
				}
				if rep.Status != http.StatusCreated || string(rep.Body) != `partner-1 {"item":"book"}` {
					t.Fatalf("Transport request %d = %d %s", i, rep.Status, rep.Body)
				}
			}
		})
	}
}

func mustRequest(t *testing.T, method, target string, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, target, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestSignatureReplayRace sends one signed request 50 times at once
// through the verify endpoint, to two instances sharing the store where
// the store can be shared: exactly one is verified, on memory, Redis and
// Redis Cluster.
func TestSignatureReplayRace(t *testing.T) {
	const n = 50
	partner := newHMACKey(t, "partner-1")
	keys := keySource(t, partner)
	backends := []struct {
		name string
		open func(t *testing.T) []store.Store // one store handle per instance
	}{
		{"memory", func(t *testing.T) []store.Store { return []store.Store{memory.New()} }},
		{"redis", func(t *testing.T) []store.Store {
			url, prefix := requireEnv(t, envRedisURL), uniquePrefix(t)
			return []store.Store{openRedis(t, url, prefix), openRedis(t, url, prefix)}
		}},
		{"redis cluster", func(t *testing.T) []store.Store {
			addrs, prefix := requireEnv(t, envClusterAddrs), uniquePrefix(t)
			return []store.Store{openCluster(t, addrs, prefix), openCluster(t, addrs, prefix)}
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			var servers []*server
			for _, st := range b.open(t) {
				servers = append(servers, startServer(t, st, serverConfig{conns: n,
					apiOpts: []handlers.Option{handlers.WithVerifier(replay.NewVerifier(keys, st))}}))
			}
			body := signedBody(t, partner, "POST", "https://api.example.com/v1/orders", []byte(`{"id":7}`), sigSpec{})
			replies := make([]reply, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				s := servers[i%len(servers)]
				req := s.request(t, http.MethodPost, "/v1/signatures/verify", strings.NewReader(body))
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					replies[i], errs[i] = send(s.Client, req)
				}()
			}
			close(start)
			wg.Wait()
			counts := map[string]int{}
			for i, r := range replies {
				if errs[i] != nil {
					t.Fatalf("request %d: %v", i, errs[i])
				}
				outcome := fmt.Sprint(r.Status)
				if c := problemCode(r.Body); c != "" {
					outcome += " " + c
				}
				counts[outcome]++
			}
			if counts["200"] != 1 || counts["401 replayed_request"] != n-1 {
				t.Fatalf("outcomes %v, want exactly one 200 and %d replayed_request", counts, n-1)
			}
		})
	}
}
