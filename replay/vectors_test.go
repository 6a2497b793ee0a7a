package replay

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
)

// vectorDir holds the RFC 9421 appendix B vectors; see its README.md.
const vectorDir = "testdata/rfc9421"

// readVector returns a file of vectorDir.
func readVector(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// vectorMessage returns the RFC 9421 B.2 test-request as a Message, with
// the Signature-Input and Signature fields of the vector file headers
// (e.g. "b25.headers") added.
func vectorMessage(t testing.TB, headers string) Message {
	t.Helper()
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(readVector(t, "test-request.http"))))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		t.Fatal(err)
	}
	h := req.Header.Clone()
	if headers != "" {
		tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(readVector(t, headers), '\n'))))
		extra, err := tp.ReadMIMEHeader()
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range extra {
			h[k] = v
		}
	}
	// The server's view: https, as the RFC's examples assume.
	u := &url.URL{Scheme: "https", Host: req.Host, Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	return Message{Method: req.Method, URL: u, Header: h, Body: body}
}

// vectorInput returns the inner list labelled label in m's Signature-Input.
func vectorInput(t testing.TB, m Message, label string) httpsfv.InnerList {
	t.Helper()
	d, err := httpsfv.UnmarshalDictionary(m.Header.Values("Signature-Input"))
	if err != nil {
		t.Fatal(err)
	}
	mem, ok := d.Get(label)
	if !ok {
		t.Fatalf("no %s in Signature-Input", label)
	}
	il, ok := mem.(httpsfv.InnerList)
	if !ok {
		t.Fatalf("%s is not an inner list", label)
	}
	return il
}

func TestSignatureBaseReproducesTheRFCVectors(t *testing.T) {
	for _, tc := range []struct{ name, headers, label, base string }{
		{"B.2.5 hmac-sha256", "b25.headers", "sig-b25", "b25.base"},
		{"B.2.6 ed25519", "b26.headers", "sig-b26", "b26.base"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := vectorMessage(t, tc.headers)
			got, err := SignatureBase(m, tc.label, vectorInput(t, m, tc.label))
			if err != nil {
				t.Fatal(err)
			}
			if want := string(readVector(t, tc.base)); got != want {
				t.Errorf("SignatureBase =\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// vectorKeys returns the RFC 9421 keys, parsed from testdata/keys.json
// (our keys file format, the ed25519 key as PEM).
func vectorKeys(t testing.TB) *Keys {
	t.Helper()
	k, err := LoadKeys(filepath.Join(vectorDir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestKeysFileHoldsTheRFCKeys(t *testing.T) {
	k := vectorKeys(t)
	hm, ok := k.Lookup("test-shared-secret")
	if !ok {
		t.Fatal("no test-shared-secret")
	}
	want, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(readVector(t, "test-shared-secret.b64"))))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(hm.Secret, want) {
		t.Error("keys.json's test-shared-secret differs from test-shared-secret.b64")
	}
	ed, ok := k.Lookup("test-key-ed25519")
	if !ok {
		t.Fatal("no test-key-ed25519")
	}
	pub, err := parsePublicKey(string(readVector(t, "test-key-ed25519.pub.pem")))
	if err != nil {
		t.Fatal(err)
	}
	if !ed.PublicKey.Equal(pub) {
		t.Error("keys.json's test-key-ed25519 differs from test-key-ed25519.pub.pem")
	}
	// The private key (for signers) is the public key's other half and
	// reproduces B.2.6's signature: Ed25519 is deterministic.
	block, _ := pem.Decode(readVector(t, "test-key-ed25519.pem"))
	priv, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	edPriv := priv.(ed25519.PrivateKey)
	if !edPriv.Public().(ed25519.PublicKey).Equal(pub) {
		t.Fatal("test-key-ed25519.pem is not the private half of test-key-ed25519.pub.pem")
	}
	m := vectorMessage(t, "b26.headers")
	if got, want := "sig-b26=:"+base64.StdEncoding.EncodeToString(ed25519.Sign(edPriv, readVector(t, "b26.base")))+":", m.Header.Get("Signature"); got != want {
		t.Errorf("signing b26.base gives %s, want %s", got, want)
	}
}

func TestRFCVectorsVerifyWithoutPolicy(t *testing.T) {
	for _, tc := range []struct{ name, headers, keyid, label string }{
		{"B.2.5 hmac-sha256", "b25.headers", "test-shared-secret", "sig-b25"},
		{"B.2.6 ed25519", "b26.headers", "test-key-ed25519", "sig-b26"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewVerifier(vectorKeys(t), nil, UnsafeSkipPolicyForTests())
			res, err := v.Verify(context.Background(), vectorMessage(t, tc.headers))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if res.KeyID != tc.keyid || res.Name != tc.label || res.Created.Unix() != 1618884473 || res.Nonce != "" {
				t.Errorf("Result = %+v", res)
			}
		})
	}
}

func TestRFCVectorsAreRefusedByThePolicy(t *testing.T) {
	for _, tc := range []struct{ name, headers string }{
		{"B.2.5 hmac-sha256", "b25.headers"},
		{"B.2.6 ed25519", "b26.headers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Even on the day they were made: no nonce is ErrInvalid
			// (signature_invalid), before the window is looked at.
			st := &recordingStore{fresh: true}
			v := NewVerifier(vectorKeys(t), st, WithClock(fixedClock(time.Unix(1618884473, 0))))
			_, err := v.Verify(context.Background(), vectorMessage(t, tc.headers))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Verify = %v, want ErrInvalid", err)
			}
			if len(st.calls) != 0 {
				t.Errorf("the store was called")
			}
		})
	}
}

func TestRFCVectorsFailWhenChanged(t *testing.T) {
	for _, headers := range []string{"b25.headers", "b26.headers"} {
		t.Run(headers, func(t *testing.T) {
			m := vectorMessage(t, headers)
			m.Header.Set("Date", "Tue, 20 Apr 2021 02:07:56 GMT")
			v := NewVerifier(vectorKeys(t), nil, UnsafeSkipPolicyForTests())
			if _, err := v.Verify(context.Background(), m); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Verify = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestDerivedComponents(t *testing.T) {
	// parse returns the URL a server sees for a request line's target
	// sent to host over scheme.
	parse := func(scheme, host, target string) *url.URL {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			t.Fatal(err)
		}
		u.Scheme, u.Host = scheme, host
		return u
	}
	for _, tc := range []struct {
		name, comp string
		url        *url.URL
		want       string
	}{
		{"@method", "@method", parse("https", "example.com", "/"), "POST"},
		{"@authority lowercase", "@authority", parse("https", "WWW.Example.COM", "/"), "www.example.com"},
		{"@authority without https's default port", "@authority", parse("https", "example.com:443", "/"), "example.com"},
		{"@authority without http's default port", "@authority", parse("http", "example.com:80", "/"), "example.com"},
		{"@authority keeps another port", "@authority", parse("https", "example.com:80", "/"), "example.com:80"},
		{"@authority with an IPv6 host", "@authority", parse("https", "[::1]:8443", "/"), "[::1]:8443"},
		{"@authority with an IPv6 host on the default port", "@authority", parse("https", "[::1]:443", "/"), "[::1]"},
		{"@scheme lowercase", "@scheme", parse("HTTPS", "example.com", "/"), "https"},
		{"@target-uri", "@target-uri", parse("https", "www.example.com", "/path?param=value"), "https://www.example.com/path?param=value"},
		{"@target-uri normalises the authority", "@target-uri", parse("https", "WWW.example.com:443", "/p"), "https://www.example.com/p"},
		{"@request-target", "@request-target", parse("https", "example.com", "/path?param=value"), "/path?param=value"},
		{"@request-target without a query", "@request-target", parse("https", "example.com", "/path"), "/path"},
		{"@path", "@path", parse("https", "example.com", "/path?param=value"), "/path"},
		{"@path empty is /", "@path", &url.URL{Scheme: "https", Host: "example.com"}, "/"},
		{"@path keeps percent-encoding as received", "@path", parse("https", "example.com", "/a%2Fb/%C3%A9"), "/a%2Fb/%C3%A9"},
		{"@path keeps | and ^ as received", "@path", parse("https", "example.com", "/a|b^c"), "/a|b^c"},
		{"@path keeps %7C as received", "@path", parse("https", "example.com", "/a%7Cb"), "/a%7Cb"},
		{"@path ignores a RawPath that does not match Path", "@path", &url.URL{Scheme: "https", Host: "example.com", Path: "/a b", RawPath: "/other"}, "/a%20b"},
		{"@query (RFC 9421 §2.2.7)", "@query", parse("https", "www.example.com", "/path?param=value&foo=bar&baz=bat%2Dman"), "?param=value&foo=bar&baz=bat%2Dman"},
		{"@query when there is none", "@query", parse("https", "example.com", "/path"), "?"},
		{"@query when it is empty", "@query", parse("https", "example.com", "/path?"), "?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := componentValue(Message{Method: "POST", URL: tc.url}, tc.comp)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("%s = %q, want %q", tc.comp, got, tc.want)
			}
		})
	}
}

func TestFieldComponents(t *testing.T) {
	h := http.Header{}
	h.Add("X-Multi", " a ")
	h.Add("X-Multi", "b,c\t")
	h.Set("X-Empty", "")
	h["x-lower"] = []string{"v"}
	m := Message{Method: "GET", URL: &url.URL{Scheme: "https", Host: "example.com"}, Header: h}
	for _, tc := range []struct{ name, want string }{
		{"x-multi", "a, b,c"},
		{"x-empty", ""},
		{"x-lower", "v"},
	} {
		if got, err := componentValue(m, tc.name); err != nil || got != tc.want {
			t.Errorf("%s = (%q, %v), want %q", tc.name, got, err, tc.want)
		}
	}
	base, err := SignatureBase(m, "sig1", httpsfv.InnerList{Items: []httpsfv.Item{httpsfv.NewItem("x-empty")}, Params: httpsfv.NewParams()})
	if want := "\"x-empty\": \n\"@signature-params\": (\"x-empty\")"; err != nil || base != want {
		t.Errorf("SignatureBase = (%q, %v), want %q", base, err, want)
	}
	if _, err := componentValue(m, "x-absent"); err == nil {
		t.Error("an absent field has a value")
	}
}
