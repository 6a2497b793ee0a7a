package replay_test

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store/memory"
)

// rfcDir holds the RFC 9421 appendix B vectors (see its README.md).
const rfcDir = "testdata/rfc9421"

// rfcCreated is the created parameter of the RFC 9421 B.2 examples.
var rfcCreated = time.Unix(1618884473, 0)

func readRFC(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rfcDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rfcRequest returns the RFC 9421 B.2 test-request as a client request to
// https://example.com, as a client would build it before signing.
func rfcRequest(t testing.TB) *http.Request {
	t.Helper()
	in, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(readRFC(t, "test-request.http"))))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(in.Body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(in.Method, "https://"+in.Host+in.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range in.Header {
		if k != "Content-Length" { // net/http sends req.ContentLength instead
			req.Header[k] = v
		}
	}
	return req
}

// rfcFields returns the Signature-Input and Signature of a vector file
// such as "b25.headers".
func rfcFields(t testing.TB, name string) (input, signature string) {
	t.Helper()
	h, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(readRFC(t, name), '\n', '\n')))).ReadMIMEHeader()
	if err != nil {
		t.Fatal(err)
	}
	return h.Get("Signature-Input"), h.Get("Signature")
}

// rfcSecret and rfcPrivateKey are the RFC's test keys (B.1.5, B.1.4).
func rfcSecret(t testing.TB) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(readRFC(t, "test-shared-secret.b64"))))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rfcPrivateKey(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	blk, _ := pem.Decode(readRFC(t, "test-key-ed25519.pem"))
	if blk == nil {
		t.Fatal("test-key-ed25519.pem holds no PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k.(ed25519.PrivateKey)
}

func TestSignerReproducesTheRFC9421Vectors(t *testing.T) {
	fixed := func() time.Time { return rfcCreated }
	for _, tc := range []struct {
		name, headers, label, alg string
		key                       func(testing.TB) any
		components                []string
	}{
		{"B.2.5 hmac-sha256", "b25.headers", "sig-b25", replay.AlgHMACSHA256,
			func(t testing.TB) any { return rfcSecret(t) }, []string{"date", "@authority", "content-type"}},
		{"B.2.6 ed25519", "b26.headers", "sig-b26", replay.AlgEd25519,
			func(t testing.TB) any { return rfcPrivateKey(t) },
			[]string{"date", "@method", "@path", "@authority", "content-type", "content-length"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := replay.NewSigner("test-"+map[string]string{replay.AlgHMACSHA256: "shared-secret", replay.AlgEd25519: "key-ed25519"}[tc.alg],
				tc.alg, tc.key(t), replay.WithComponents(tc.components...), replay.WithParams("created", "keyid"),
				replay.WithClock(fixed), replay.WithLabel(tc.label))
			if err != nil {
				t.Fatal(err)
			}
			req := rfcRequest(t)
			digest := req.Header.Get("Content-Digest")
			if err := s.Sign(req); err != nil {
				t.Fatal(err)
			}
			wantInput, wantSig := rfcFields(t, tc.headers)
			if got := req.Header.Get("Signature-Input"); got != wantInput {
				t.Errorf("Signature-Input = %s\nwant %s", got, wantInput)
			}
			if got := req.Header.Get("Signature"); got != wantSig {
				t.Errorf("Signature = %s\nwant %s", got, wantSig)
			}
			if got := req.Header.Get("Content-Digest"); got != digest {
				t.Errorf("Content-Digest changed to %s though content-digest is not covered", got)
			}
			if body, _ := io.ReadAll(req.Body); string(body) != `{"hello": "world"}` {
				t.Errorf("body after signing = %q", body)
			}
		})
	}
}

var signatureInputRE = regexp.MustCompile(`^sig1=\(("[^"]+"(?: "[^"]+")*)?\);created=(\d+);nonce="([A-Za-z0-9_-]{22})";keyid="([^"]+)";alg="([^"]+)"$`)

func TestSignerDefaults(t *testing.T) {
	s, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().Unix()
	for _, tc := range []struct {
		name, method, body, components string
	}{
		{"a body is covered by content-digest", http.MethodPost, `{"hello": "world"}`, `"@method" "@authority" "@path" "@query" "content-digest"`},
		{"no body, no content-digest", http.MethodGet, "", `"@method" "@authority" "@path" "@query"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, err := http.NewRequest(tc.method, "https://api.example.com/v1/orders?id=7", body)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Sign(req); err != nil {
				t.Fatal(err)
			}
			m := signatureInputRE.FindStringSubmatch(req.Header.Get("Signature-Input"))
			if m == nil {
				t.Fatalf("Signature-Input = %s", req.Header.Get("Signature-Input"))
			}
			if m[1] != tc.components || m[4] != "partner-1" || m[5] != "hmac-sha256" {
				t.Errorf("Signature-Input = %s", m[0])
			}
			if c := mustAtoi(t, m[2]); c < before || c > time.Now().Unix() {
				t.Errorf("created = %d, not now", c)
			}
			if !regexp.MustCompile(`^sig1=:[A-Za-z0-9+/]{43}=:$`).MatchString(req.Header.Get("Signature")) {
				t.Errorf("Signature = %s", req.Header.Get("Signature"))
			}
			wantDigest := ""
			if tc.body != "" {
				wantDigest = "sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:" // RFC 9530 Appendix B
			}
			if got := req.Header.Get("Content-Digest"); got != wantDigest {
				t.Errorf("Content-Digest = %q, want %q", got, wantDigest)
			}
		})
	}
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSignerGivesEveryRequestItsOwnNonce(t *testing.T) {
	s, err := replay.NewSigner("k", replay.AlgHMACSHA256, []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		req := httptest.NewRequest(http.MethodGet, "https://a.example/", nil)
		req.RequestURI = ""
		if err := s.Sign(req); err != nil {
			t.Fatal(err)
		}
		n := signatureInputRE.FindStringSubmatch(req.Header.Get("Signature-Input"))[3]
		if seen[n] {
			t.Fatalf("nonce %s used twice", n)
		}
		seen[n] = true
	}
}

func TestSignerBodies(t *testing.T) {
	s, err := replay.NewSigner("k", replay.AlgEd25519, ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	const payload = "a body\n"
	t.Run("GetBody is used and Body is left unread", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPut, "https://a.example/x", strings.NewReader(payload))
		orig := req.Body
		if err := s.Sign(req); err != nil {
			t.Fatal(err)
		}
		if req.Body != orig {
			t.Error("Body was replaced though GetBody was available")
		}
		if b, _ := io.ReadAll(req.Body); string(b) != payload {
			t.Errorf("Body = %q", b)
		}
	})
	t.Run("a body without GetBody is read and put back, resendable", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPut, "https://a.example/x", io.MultiReader(strings.NewReader(payload)))
		if req.GetBody != nil {
			t.Fatal("fixture: a MultiReader must not get a GetBody")
		}
		if err := s.Sign(req); err != nil {
			t.Fatal(err)
		}
		if req.ContentLength != int64(len(payload)) || req.GetBody == nil {
			t.Errorf("ContentLength = %d, GetBody set %v", req.ContentLength, req.GetBody != nil)
		}
		for i := 0; i < 2; i++ {
			rc, _ := req.GetBody()
			if b, _ := io.ReadAll(rc); string(b) != payload {
				t.Errorf("GetBody #%d = %q", i, b)
			}
		}
		if b, _ := io.ReadAll(req.Body); string(b) != payload {
			t.Errorf("Body = %q", b)
		}
		if req.Header.Get("Content-Digest") != replay.ContentDigest([]byte(payload)) {
			t.Errorf("Content-Digest = %s", req.Header.Get("Content-Digest"))
		}
	})
	t.Run("an unreadable body is an error", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPut, "https://a.example/x", io.MultiReader(&failingReader{}))
		if err := s.Sign(req); !errors.Is(err, replay.ErrSigner) {
			t.Errorf("Sign = %v, want ErrSigner", err)
		}
	})
}

type failingReader struct{}

func (*failingReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestNewSignerRefusesBadConfiguration(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32))
	for _, tc := range []struct {
		name   string
		keyID  string
		alg    string
		key    any
		opts   []replay.Option
		errMsg string
	}{
		{"unknown algorithm", "k", "rsa-pss-sha512", secret, nil, "algorithm"},
		{"hmac with a string secret", "k", replay.AlgHMACSHA256, string(secret), nil, "[]byte"},
		{"hmac with an empty secret", "k", replay.AlgHMACSHA256, []byte{}, nil, "[]byte"},
		{"ed25519 with a public key", "k", replay.AlgEd25519, priv.Public(), nil, "PrivateKey"},
		{"ed25519 with a secret", "k", replay.AlgEd25519, secret, nil, "PrivateKey"},
		{"empty key ID", "", replay.AlgHMACSHA256, secret, nil, "key ID"},
		{"non-ASCII key ID", "clé", replay.AlgHMACSHA256, secret, nil, "key ID"},
		{"label that is not a key", "k", replay.AlgHMACSHA256, secret, []replay.Option{replay.WithLabel("Sig 1")}, "label"},
		{"unknown parameter", "k", replay.AlgHMACSHA256, secret, []replay.Option{replay.WithParams("created", "tag")}, "parameter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := replay.NewSigner(tc.keyID, tc.alg, tc.key, tc.opts...)
			if !errors.Is(err, replay.ErrSigner) || !strings.Contains(err.Error(), tc.errMsg) {
				t.Errorf("NewSigner = %v, want ErrSigner mentioning %q", err, tc.errMsg)
			}
		})
	}
}

func TestSignFailures(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	noRandom := replay.WithNonceFunc(func() (string, error) { return "", errors.New("entropy exhausted") })
	for _, tc := range []struct {
		name string
		url  string
		opts []replay.Option
	}{
		{"the nonce source fails", "", []replay.Option{noRandom}},
		{"the nonce is too long", "", []replay.Option{replay.WithNonceFunc(func() (string, error) { return strings.Repeat("n", replay.MaxNonceLen+1), nil })}},
		{"a covered header is missing", "", []replay.Option{replay.WithComponents("@method", "authorization")}},
		{"an unsupported derived component", "", []replay.Option{replay.WithComponents("@status")}},
		{"a non-ASCII host (net/http sends punycode)", "https://bücher.example/", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := replay.NewSigner("k", replay.AlgHMACSHA256, secret, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if tc.url == "" {
				tc.url = "https://a.example/"
			}
			req, _ := http.NewRequest(http.MethodGet, tc.url, nil)
			if err := s.Sign(req); !errors.Is(err, replay.ErrSigner) {
				t.Errorf("Sign = %v, want ErrSigner", err)
			}
			if req.Header.Get("Signature") != "" {
				t.Error("a failed Sign left a Signature behind")
			}
		})
	}
}

// ---------------------------------------------------------------- round trips

// clientKeys are the keys of the round-trip tests, as Signers and as the
// server's keys file.
type clientKeys struct {
	hmac, ed *replay.Signer
	keys     *replay.Keys
}

func newClientKeys(t testing.TB, opts ...replay.Option) clientKeys {
	t.Helper()
	secret := bytes.Repeat([]byte("s3cr3t!"), 6)
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := replay.ParseKeys([]byte(fmt.Sprintf(`{"keys": [
		{"id": "partner-1", "alg": "hmac-sha256", "secret": %q},
		{"id": "mobile", "alg": "ed25519", "public_key": %q}]}`,
		base64.StdEncoding.EncodeToString(secret), base64.StdEncoding.EncodeToString(pub))))
	if err != nil {
		t.Fatal(err)
	}
	h, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, secret, opts...)
	if err != nil {
		t.Fatal(err)
	}
	e, err := replay.NewSigner("mobile", replay.AlgEd25519, priv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return clientKeys{h, e, keys}
}

// serverMessage is a server's view of r: scheme and authority filled in.
func serverMessage(r *http.Request, scheme string, body []byte) replay.Message {
	u := &url.URL{Scheme: scheme, Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	return replay.Message{Method: r.Method, URL: u, Header: r.Header, Body: body}
}

// verifyingServer verifies every request with v; 200 with the key ID, or
// 401 with the error. It records the requests' headers.
type verifyingServer struct {
	*httptest.Server
	mu   sync.Mutex
	seen []http.Header
}

func newVerifyingServer(t testing.TB, v *replay.Verifier) *verifyingServer {
	s := &verifyingServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.seen = append(s.seen, r.Header.Clone())
		s.mu.Unlock()
		res, err := v.Verify(r.Context(), serverMessage(r, "http", body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "verified %s %s", res.KeyID, body)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestTransportRoundTripsThroughTheVerifier(t *testing.T) {
	ck := newClientKeys(t)
	st := memory.New()
	t.Cleanup(func() { st.Close() })
	srv := newVerifyingServer(t, replay.NewVerifier(ck.keys, st))
	for _, tc := range []struct {
		name   string
		signer *replay.Signer
	}{{"hmac-sha256", ck.hmac}, {"ed25519", ck.ed}} {
		t.Run(tc.name, func(t *testing.T) {
			client := &http.Client{Transport: &replay.Transport{Signer: tc.signer}}
			for _, r := range []struct{ method, path, body string }{
				{http.MethodPost, "/v1/orders?id=7&q=a%20b", `{"hello": "world"}`},
				{http.MethodGet, "/v1/orders/7", ""},
				{http.MethodDelete, "/v1/orders/%C3%A9t%C3%A9?x=%2F", ""},
				{http.MethodGet, "/v1/items/a|b^c?q='x'", ""},
				{http.MethodPost, "/v1/orders", `{"retry": "same body, new signature"}`},
				{http.MethodPost, "/v1/orders", `{"retry": "same body, new signature"}`},
			} {
				var body io.Reader
				if r.body != "" {
					body = strings.NewReader(r.body)
				}
				req, _ := http.NewRequest(r.method, srv.URL+r.path, body)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if want := "verified " + map[bool]string{true: "partner-1", false: "mobile"}[tc.signer == ck.hmac] + " " + r.body; resp.StatusCode != 200 || string(got) != want {
					t.Errorf("%s %s: %d %s", r.method, r.path, resp.StatusCode, got)
				}
				if req.Header.Get("Signature") != "" {
					t.Error("Transport changed the caller's request")
				}
			}
		})
	}
	t.Run("the same signed request sent again is a replay", func(t *testing.T) {
		srv.mu.Lock()
		h := srv.seen[0].Clone()
		srv.mu.Unlock()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders?id=7&q=a%20b", strings.NewReader(`{"hello": "world"}`))
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(got), replay.ErrReplayed.Error()) {
			t.Errorf("replay: %d %s", resp.StatusCode, got)
		}
	})
}

func TestTransportSignsConcurrentRequests(t *testing.T) {
	ck := newClientKeys(t)
	st := memory.New()
	t.Cleanup(func() { st.Close() })
	srv := newVerifyingServer(t, replay.NewVerifier(ck.keys, st))
	client := &http.Client{Transport: &replay.Transport{Signer: ck.ed}}
	const n = 20
	statuses := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			resp, err := client.Post(srv.URL+"/v1/orders", "application/json", strings.NewReader(fmt.Sprintf(`{"n": %d}`, i)))
			if err != nil {
				errs[i] = err
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		}(i)
	}
	wg.Wait()
	for i := range statuses {
		if errs[i] != nil || statuses[i] != http.StatusOK {
			t.Errorf("request %d: %d %v", i, statuses[i], errs[i])
		}
	}
}

// closeTracker is a body that records whether it was closed.
type closeTracker struct {
	io.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestTransportLeavesTheCallersRequestAlone(t *testing.T) {
	ck := newClientKeys(t)
	var sent *http.Request
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r
		return &http.Response{StatusCode: 204, Body: http.NoBody, Request: r}, nil
	})
	req, _ := http.NewRequest(http.MethodPost, "https://api.example.com/v1/orders", nil)
	req.Body = &closeTracker{Reader: strings.NewReader("payload")}
	req.Header.Set("X-Trace", "1")
	before := req.Header.Clone()
	resp, err := (&replay.Transport{Signer: ck.hmac, Base: base}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if fmt.Sprint(req.Header) != fmt.Sprint(before) {
		t.Errorf("caller's headers changed: %v", req.Header)
	}
	if sent == req || sent.Header.Get("Signature") == "" || sent.Header.Get("X-Trace") != "1" {
		t.Errorf("the sent request is not a signed clone: %v", sent.Header)
	}
	if b, _ := io.ReadAll(sent.Body); string(b) != "payload" {
		t.Errorf("sent body = %q", b)
	}

	t.Run("a zero Signer is an error, not a panic", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
		if _, err := (&replay.Transport{Signer: &replay.Signer{}, Base: base}).RoundTrip(req); !errors.Is(err, replay.ErrSigner) {
			t.Errorf("RoundTrip = %v, want ErrSigner", err)
		}
		if _, err := (&replay.Transport{Base: base}).RoundTrip(req); !errors.Is(err, replay.ErrSigner) {
			t.Errorf("RoundTrip without a Signer = %v, want ErrSigner", err)
		}
	})
	t.Run("a signing failure closes the body and sends nothing", func(t *testing.T) {
		s, err := replay.NewSigner("k", replay.AlgHMACSHA256, []byte("x"), replay.WithNonceFunc(func() (string, error) { return "", errors.New("no entropy") }))
		if err != nil {
			t.Fatal(err)
		}
		body := &closeTracker{Reader: strings.NewReader("payload")}
		req, _ := http.NewRequest(http.MethodPost, "https://api.example.com/v1/orders", nil)
		req.Body = body
		sent = nil
		if _, err := (&replay.Transport{Signer: s, Base: base}).RoundTrip(req); !errors.Is(err, replay.ErrSigner) {
			t.Errorf("RoundTrip = %v, want ErrSigner", err)
		}
		if !body.closed || sent != nil {
			t.Errorf("body closed %v, request sent %v", body.closed, sent != nil)
		}
	})
}

// ExampleSigner_Sign reproduces RFC 9421 B.2.5: the options fix what a
// Signer otherwise chooses itself (created, nonce, components, label).
func ExampleSigner_Sign() {
	secret, _ := base64.StdEncoding.DecodeString("uzvJfB4u3N0Jy4T7NZ75MDVcr8zSTInedJtkgcu46YW4XByzNJjxBdtjUkdJPBtbmHhIDi6pcl8jsasjlTMtDQ==")
	s, err := replay.NewSigner("test-shared-secret", replay.AlgHMACSHA256, secret,
		replay.WithComponents("date", "@authority", "content-type"),
		replay.WithParams("created", "keyid"),
		replay.WithClock(func() time.Time { return time.Unix(1618884473, 0) }),
		replay.WithLabel("sig-b25"))
	if err != nil {
		panic(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "https://example.com/foo?param=Value&Pet=dog", strings.NewReader(`{"hello": "world"}`))
	req.Header.Set("Date", "Tue, 20 Apr 2021 02:07:55 GMT")
	req.Header.Set("Content-Type", "application/json")
	if err := s.Sign(req); err != nil {
		panic(err)
	}
	fmt.Println("Signature-Input:", req.Header.Get("Signature-Input"))
	fmt.Println("Signature:", req.Header.Get("Signature"))
	// Output:
	// Signature-Input: sig-b25=("date" "@authority" "content-type");created=1618884473;keyid="test-shared-secret"
	// Signature: sig-b25=:pxcQw6G3AjtMBQjwo8XzkZf/bws5LelbaMk5rGIGtE8=:
}

// ExampleTransport signs a client's requests; the server verifies them
// and refuses the same request sent twice.
func ExampleTransport() {
	secret := []byte("a shared secret of at least 32 bytes")
	keys, _ := replay.ParseKeys([]byte(`{"keys": [{"id": "partner-1", "alg": "hmac-sha256", "secret": "` +
		base64.StdEncoding.EncodeToString(secret) + `"}]}`))
	st := memory.New()
	defer st.Close()
	verifier := replay.NewVerifier(keys, st)
	var last http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		last = r.Header.Clone()
		u := &url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path, RawQuery: r.URL.RawQuery}
		res, err := verifier.Verify(r.Context(), replay.Message{Method: r.Method, URL: u, Header: r.Header, Body: body})
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "verified, key %s", res.KeyID)
	}))
	defer srv.Close()

	signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, secret)
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: &replay.Transport{Signer: signer}}
	send := func(c *http.Client, h http.Header) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/orders?id=7", strings.NewReader(`{"qty": 1}`))
		if h != nil {
			req.Header = h
		}
		resp, err := c.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, strings.TrimSpace(string(b)))
	}
	send(client, nil)              // signed
	send(client, nil)              // signed again: a new nonce
	send(http.DefaultClient, last) // the last request, replayed as is
	// Output:
	// 200 verified, key partner-1
	// 200 verified, key partner-1
	// 401 replay: replayed request
}
