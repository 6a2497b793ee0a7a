package replay

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/store/storetest"
)

// Environment variables naming the real servers the tests run against.
const (
	envURL     = "REPLAYGUARD_TEST_REDIS_URL"           // redis://host:port/db
	envCluster = "REPLAYGUARD_TEST_REDIS_CLUSTER_ADDRS" // host:port,host:port,...
)

// testNow is the fixed server time of the tests that set a clock.
var testNow = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// testKey is a client key with, for ed25519, its private half.
type testKey struct {
	Key
	priv ed25519.PrivateKey
}

// The test clients: two hmac-sha256 keys and one ed25519 key.
var (
	keyPartner1 = testKey{Key: Key{ID: "partner-1", Alg: AlgHMACSHA256, Secret: []byte("partner-1 secret, 32+ bytes long!"), Label: "Partner One"}}
	keyPartner2 = testKey{Key: Key{ID: "partner-2", Alg: AlgHMACSHA256, Secret: []byte("partner-2 secret, 32+ bytes long!")}}
	keyMobile   = func() testKey {
		priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
		return testKey{Key: Key{ID: "mobile", Alg: AlgEd25519, PublicKey: priv.Public().(ed25519.PublicKey)}, priv: priv}
	}()
	signingKeys = []testKey{keyPartner1, keyMobile}
)

// testKeys is the KeySource holding the test clients.
var testKeys = &Keys{m: map[string]Key{
	keyPartner1.ID: keyPartner1.Key,
	keyPartner2.ID: keyPartner2.Key,
	keyMobile.ID:   keyMobile.Key,
}}

// defaultComponents are the components the test signer covers.
var defaultComponents = []string{"@method", "@authority", "@path", "@query", "content-digest"}

// newNonce returns a fresh random nonce.
func newNonce(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// newMessage returns an unsigned POST to
// https://api.example.com/v1/orders?id=7 with body (and its sha-256
// Content-Digest when body is not empty) and an Authorization header.
func newMessage(body string) Message {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Authorization", "Bearer abc")
	if body != "" {
		h.Set("Content-Digest", ContentDigest([]byte(body)))
	}
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	return Message{
		Method: "POST",
		URL:    &url.URL{Scheme: "https", Host: "api.example.com", Path: "/v1/orders", RawQuery: "id=7"},
		Header: h,
		Body:   b,
	}
}

// clone returns a deep copy of m, to tamper with.
func clone(m Message) Message {
	u := *m.URL
	m.URL = &u
	m.Header = m.Header.Clone()
	m.Body = bytes.Clone(m.Body)
	return m
}

// spec describes one signature for sign.
type spec struct {
	label      string
	components []string
	params     *httpsfv.Params
}

// newSpec returns the spec of a signature that satisfies the default
// policy: defaultComponents, created, keyid and a fresh nonce.
func newSpec(t testing.TB, k testKey, created time.Time) spec {
	p := httpsfv.NewParams()
	p.Add("created", created.Unix())
	p.Add("keyid", k.ID)
	p.Add("nonce", newNonce(t))
	return spec{label: "sig1", components: append([]string(nil), defaultComponents...), params: p}
}

// sign signs m as s says with k, using SignatureBase directly, and adds
// the signature to m's Signature-Input and Signature fields.
func sign(t testing.TB, m *Message, k testKey, s spec) {
	t.Helper()
	il := httpsfv.InnerList{Params: s.params}
	for _, c := range s.components {
		il.Items = append(il.Items, httpsfv.NewItem(c))
	}
	base, err := SignatureBase(*m, s.label, il)
	if err != nil {
		t.Fatalf("SignatureBase: %v", err)
	}
	var sig []byte
	switch k.Alg {
	case AlgHMACSHA256:
		mac := hmac.New(sha256.New, k.Secret)
		mac.Write([]byte(base))
		sig = mac.Sum(nil)
	case AlgEd25519:
		sig = ed25519.Sign(k.priv, []byte(base))
	}
	in, err := httpsfv.Marshal(il)
	if err != nil {
		t.Fatal(err)
	}
	m.Header.Add("Signature-Input", s.label+"="+in)
	m.Header.Add("Signature", s.label+"=:"+base64.StdEncoding.EncodeToString(sig)+":")
}

// signed returns a POST with body signed by k at created under the
// default policy; edit, when not nil, changes the spec first.
func signed(t testing.TB, k testKey, created time.Time, body string, edit func(*spec)) Message {
	t.Helper()
	m := newMessage(body)
	s := newSpec(t, k, created)
	if edit != nil {
		edit(&s)
	}
	sign(t, &m, k, s)
	return m
}

// editInput rewrites the parameters of every member of m's
// Signature-Input, leaving Signature alone.
func editInput(t testing.TB, m *Message, edit func(*httpsfv.Params)) {
	t.Helper()
	d, err := httpsfv.UnmarshalDictionary(m.Header.Values("Signature-Input"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range d.Names() {
		mem, _ := d.Get(name)
		il := mem.(httpsfv.InnerList)
		edit(il.Params)
		d.Add(name, il)
	}
	s, err := httpsfv.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	m.Header.Set("Signature-Input", s)
}

// newMemory returns a memory store reading clock, closed with the test.
func newMemory(t testing.TB, clock func() time.Time) store.Store {
	s := memory.New(memory.WithClock(clock))
	t.Cleanup(func() { s.Close() })
	return s
}

// fixedClock returns a clock that always reads at.
func fixedClock(at time.Time) func() time.Time { return func() time.Time { return at } }

// newTestVerifier returns a Verifier over testKeys and a fresh memory
// store, with the clock at testNow.
func newTestVerifier(t testing.TB, opts ...Option) *Verifier {
	return NewVerifier(testKeys, newMemory(t, fixedClock(testNow)), append([]Option{WithClock(fixedClock(testNow))}, opts...)...)
}

func TestVerifyAcceptsGoodSignatures(t *testing.T) {
	for _, k := range signingKeys {
		for _, body := range []string{`{"item": 1}`, ""} {
			t.Run(k.Alg+"/body="+body, func(t *testing.T) {
				m := newMessage(body)
				s := newSpec(t, k, testNow)
				if body == "" {
					s.components = []string{"@method", "@authority", "@path", "@query"}
				}
				sign(t, &m, k, s)
				res, err := newTestVerifier(t).Verify(context.Background(), m)
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				nonce, _ := s.params.Get("nonce")
				want := Result{KeyID: k.ID, Label: k.Label, Created: testNow, Nonce: nonce.(string), Name: "sig1"}
				if res != want || res.Created.Location() != time.UTC {
					t.Errorf("Result = %+v, want %+v", res, want)
				}
			})
		}
	}
}

func TestChangingAnythingSignedIsInvalid(t *testing.T) {
	const body = `{"item": 1}`
	cases := []struct {
		name   string
		tamper func(t *testing.T, m *Message)
	}{
		{"method", func(t *testing.T, m *Message) { m.Method = "PUT" }},
		{"authority", func(t *testing.T, m *Message) { m.URL.Host = "evil.example.com" }},
		{"authority's port", func(t *testing.T, m *Message) { m.URL.Host = "api.example.com:8443" }},
		{"scheme changes the default port", func(t *testing.T, m *Message) { m.URL.Scheme = "http"; m.URL.Host = "api.example.com:443" }},
		{"path", func(t *testing.T, m *Message) { m.URL.Path = "/v1/orders/2" }},
		{"query", func(t *testing.T, m *Message) { m.URL.RawQuery = "id=8" }},
		{"query removed", func(t *testing.T, m *Message) { m.URL.RawQuery = "" }},
		{"query extended", func(t *testing.T, m *Message) { m.URL.RawQuery = "id=7&admin=1" }},
		{"content-digest header, to another body's", func(t *testing.T, m *Message) {
			m.Header.Set("Content-Digest", ContentDigest([]byte(`{"item": 2}`)))
		}},
		{"content-digest header, to another digest of the same body", func(t *testing.T, m *Message) {
			s := sha512.Sum512(m.Body)
			m.Header.Set("Content-Digest", "sha-512=:"+base64.StdEncoding.EncodeToString(s[:])+":")
		}},
		{"body", func(t *testing.T, m *Message) { m.Body = []byte(`{"item": 2}`) }},
		{"body removed", func(t *testing.T, m *Message) { m.Body = nil }},
		{"required header (authorization)", func(t *testing.T, m *Message) { m.Header.Set("Authorization", "Bearer xyz") }},
		{"nonce", func(t *testing.T, m *Message) {
			editInput(t, m, func(p *httpsfv.Params) { p.Add("nonce", "another-nonce") })
		}},
		{"created", func(t *testing.T, m *Message) {
			editInput(t, m, func(p *httpsfv.Params) { p.Add("created", testNow.Unix()-1) })
		}},
		{"keyid, to another known key", func(t *testing.T, m *Message) {
			editInput(t, m, func(p *httpsfv.Params) { p.Add("keyid", keyPartner2.ID) })
		}},
		{"a parameter added", func(t *testing.T, m *Message) {
			editInput(t, m, func(p *httpsfv.Params) { p.Add("tag", "app") })
		}},
		{"signature bytes", func(t *testing.T, m *Message) {
			v := m.Header.Get("Signature")
			i := len("sig1=:")
			c := byte('A')
			if v[i] == 'A' {
				c = 'B'
			}
			m.Header.Set("Signature", v[:i]+string(c)+v[i+1:])
		}},
	}
	for _, k := range signingKeys {
		m := signed(t, k, testNow, body, func(s *spec) { s.components = append(s.components, "authorization") })
		t.Run(k.Alg+"/nothing changed is accepted", func(t *testing.T) {
			if _, err := newTestVerifier(t, WithRequired("authorization")).Verify(context.Background(), clone(m)); err != nil {
				t.Fatalf("Verify: %v", err)
			}
		})
		for _, tc := range cases {
			t.Run(k.Alg+"/"+tc.name, func(t *testing.T) {
				c := clone(m)
				tc.tamper(t, &c)
				_, err := newTestVerifier(t, WithRequired("authorization")).Verify(context.Background(), c)
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("Verify = %v, want ErrInvalid", err)
				}
			})
		}
	}
}

func TestVerifyRefusesBadRequests(t *testing.T) {
	const body = `{"item": 1}`
	nonce128 := strings.Repeat("n", 128)
	cases := []struct {
		name string
		// build returns the request; it is signed by partner-1 at testNow
		// unless it sets its own fields.
		build func(t *testing.T) Message
		opts  []Option
		want  error // nil: accepted
	}{
		{"no Signature-Input or Signature", func(t *testing.T) Message { return newMessage(body) }, nil, ErrMissing},
		{"no Signature-Input", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Del("Signature-Input")
			return m
		}, nil, ErrMissing},
		{"no Signature", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Del("Signature")
			return m
		}, nil, ErrMissing},
		{"blank Signature", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature", "  ")
			return m
		}, nil, ErrMissing},
		{"Signature-Input not a dictionary", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature-Input", `sig1=("@method"`)
			return m
		}, nil, ErrInvalid},
		{"Signature not a dictionary", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature", `sig1=:not base64`)
			return m
		}, nil, ErrInvalid},
		{"Signature-Input over 8 KiB", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Add("Signature-Input", "pad="+`"`+strings.Repeat("x", 8<<10)+`"`)
			return m
		}, nil, ErrInvalid},
		{"Signature member missing for the label", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature", strings.Replace(m.Header.Get("Signature"), "sig1=", "sig2=", 1))
			return m
		}, nil, ErrInvalid},
		{"Signature member is not a byte sequence", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature", `sig1="abc"`)
			return m
		}, nil, ErrInvalid},
		{"Signature-Input member is not an inner list", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature-Input", `sig1="@method";keyid="partner-1"`)
			return m
		}, nil, ErrInvalid},
		{"unknown keyid", func(t *testing.T) Message {
			return signed(t, testKey{Key: Key{ID: "stranger", Alg: AlgHMACSHA256, Secret: keyPartner1.Secret}}, testNow, body, nil)
		}, nil, ErrInvalid},
		{"no keyid", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Del("keyid") })
		}, nil, ErrInvalid},
		{"keyid is a token, not a string", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("keyid", httpsfv.Token("partner-1")) })
		}, nil, ErrInvalid},
		{"alg equal to the key's algorithm", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("alg", AlgHMACSHA256) })
		}, nil, nil},
		{"alg other than the key's algorithm", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("alg", AlgEd25519) })
		}, nil, ErrInvalid},
		{"ed25519 key with alg hmac-sha256", func(t *testing.T) Message {
			return signed(t, keyMobile, testNow, body, func(s *spec) { s.params.Add("alg", AlgHMACSHA256) })
		}, nil, ErrInvalid},
		{"hmac-sha256 signature presented for an ed25519 key ID", func(t *testing.T) Message {
			forger := testKey{Key: Key{ID: keyMobile.ID, Alg: AlgHMACSHA256, Secret: []byte(keyMobile.PublicKey)}}
			return signed(t, forger, testNow, body, nil)
		}, nil, ErrInvalid},
		{"no created", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Del("created") })
		}, nil, ErrInvalid},
		{"created is a string", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("created", "1700000000") })
		}, nil, ErrInvalid},
		{"expires is a decimal", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("expires", 1.5) })
		}, nil, ErrInvalid},
		{"no nonce", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Del("nonce") })
		}, nil, ErrInvalid},
		{"empty nonce", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("nonce", "") })
		}, nil, ErrInvalid},
		{"nonce is a byte sequence", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("nonce", []byte("abc")) })
		}, nil, ErrInvalid},
		{"nonce of 128 bytes", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("nonce", nonce128) })
		}, nil, nil},
		{"nonce of 129 bytes", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("nonce", nonce128+"n") })
		}, nil, ErrInvalid},
		{"unknown parameters are allowed and signed", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.params.Add("tag", "app"); s.params.Add("x-extra", int64(3)) })
		}, nil, nil},
		{"@method not covered", func(t *testing.T) Message { return signedWithout(t, "@method") }, nil, ErrInvalid},
		{"@authority not covered", func(t *testing.T) Message { return signedWithout(t, "@authority") }, nil, ErrInvalid},
		{"@path not covered", func(t *testing.T) Message { return signedWithout(t, "@path") }, nil, ErrInvalid},
		{"@query not covered", func(t *testing.T) Message { return signedWithout(t, "@query") }, nil, ErrInvalid},
		{"@target-uri instead of @query", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) {
				s.components = []string{"@method", "@authority", "@path", "@target-uri", "content-digest"}
			})
		}, nil, nil},
		{"@target-uri alone does not stand for @authority and @path", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) {
				s.components = []string{"@method", "@target-uri", "content-digest"}
			})
		}, nil, ErrInvalid},
		{"empty query covered as ?", func(t *testing.T) Message {
			m := newMessage(body)
			m.URL.RawQuery = ""
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, nil},
		{"components in another order, with extra fields", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) {
				s.components = []string{"content-type", "@query", "content-digest", "@path", "@scheme", "@request-target", "@authority", "@method"}
			})
		}, nil, nil},
		{"body without content-digest covered", func(t *testing.T) Message {
			return signedWithout(t, "content-digest")
		}, nil, ErrInvalid},
		{"body without a Content-Digest header", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Del("Content-Digest")
			return m
		}, nil, ErrInvalid},
		{"content digest that does not match the body", func(t *testing.T) Message {
			m := newMessage(body)
			m.Header.Set("Content-Digest", ContentDigest([]byte("something else")))
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, ErrInvalid},
		{"sha-512 content digest", func(t *testing.T) Message {
			m := newMessage(body)
			s := sha512.Sum512([]byte(body))
			m.Header.Set("Content-Digest", "sha-512=:"+base64.StdEncoding.EncodeToString(s[:])+":")
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, nil},
		{"sha-256 and sha-512 digests, one wrong", func(t *testing.T) Message {
			m := newMessage(body)
			s := sha512.Sum512([]byte("other"))
			m.Header.Set("Content-Digest", ContentDigest([]byte(body))+", sha-512=:"+base64.StdEncoding.EncodeToString(s[:])+":")
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, ErrInvalid},
		{"unknown digest algorithm alone", func(t *testing.T) Message {
			m := newMessage(body)
			m.Header.Set("Content-Digest", "md5=:AAAAAAAAAAAAAAAAAAAAAA==:")
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, ErrInvalid},
		{"unknown digest algorithm beside sha-256", func(t *testing.T) Message {
			m := newMessage(body)
			m.Header.Set("Content-Digest", "md5=:AAAAAAAAAAAAAAAAAAAAAA==:, "+ContentDigest([]byte(body)))
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, nil},
		{"content-digest covered on an empty body must match it", func(t *testing.T) Message {
			m := newMessage("")
			m.Header.Set("Content-Digest", ContentDigest([]byte("gone")))
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, ErrInvalid},
		{"required extra component not covered", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, nil)
		}, []Option{WithRequired("Authorization")}, ErrInvalid},
		{"required extra component covered", func(t *testing.T) Message {
			return signed(t, keyPartner1, testNow, body, func(s *spec) { s.components = append(s.components, "authorization") })
		}, []Option{WithRequired("Authorization")}, nil},
		{"covered field absent from the request", func(t *testing.T) Message {
			m := newMessage(body)
			m.Header.Set("X-Gone", "1")
			s := newSpec(t, keyPartner1, testNow)
			s.components = append(s.components, "x-gone")
			sign(t, &m, keyPartner1, s)
			m.Header.Del("X-Gone")
			return m
		}, nil, ErrInvalid},
		{"component with a parameter", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature-Input", strings.Replace(m.Header.Get("Signature-Input"), `"content-digest"`, `"content-digest";sf`, 1))
			return m
		}, nil, ErrInvalid},
		{"component listed twice", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature-Input", strings.Replace(m.Header.Get("Signature-Input"), `"@method"`, `"@method" "@method"`, 1))
			return m
		}, nil, ErrInvalid},
		{"uppercase field name", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature-Input", strings.Replace(m.Header.Get("Signature-Input"), `"content-digest"`, `"Content-Digest"`, 1))
			return m
		}, nil, ErrInvalid},
		{"@signature-params covered", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature-Input", strings.Replace(m.Header.Get("Signature-Input"), `"@method"`, `"@method" "@signature-params"`, 1))
			return m
		}, nil, ErrInvalid},
		{"unsupported derived component", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.Header.Set("Signature-Input", strings.Replace(m.Header.Get("Signature-Input"), `"@method"`, `"@method" "@status"`, 1))
			return m
		}, nil, ErrInvalid},
		{"header value with a line break", func(t *testing.T) Message {
			m := newMessage(body)
			m.Header.Set("X-Evil", "a\n\"@method\": GET")
			s := newSpec(t, keyPartner1, testNow)
			s.components = append(s.components, "x-evil")
			m2 := clone(m)
			m2.Header.Set("X-Evil", "a")
			sign(t, &m2, keyPartner1, s)
			m.Header["Signature-Input"] = m2.Header["Signature-Input"]
			m.Header["Signature"] = m2.Header["Signature"]
			return m
		}, nil, ErrInvalid},
		{"URL without a host", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.URL.Host = ""
			return m
		}, nil, ErrInvalid},
		{"no URL", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.URL = nil
			return m
		}, nil, ErrInvalid},
		{"header names in lowercase, as the verify endpoint may build them", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			h := http.Header{}
			for k, v := range m.Header {
				h[strings.ToLower(k)] = v
			}
			m.Header = h
			return m
		}, nil, nil},
		{"authority in uppercase with the default port", func(t *testing.T) Message {
			m := signed(t, keyPartner1, testNow, body, nil)
			m.URL.Host = "API.Example.com:443"
			return m
		}, nil, nil},
		{"several signatures: the first with an unknown keyid is skipped", func(t *testing.T) Message {
			m := newMessage(body)
			stranger := testKey{Key: Key{ID: "proxy", Alg: AlgHMACSHA256, Secret: keyPartner1.Secret}}
			s := newSpec(t, stranger, testNow)
			s.label = "proxy"
			sign(t, &m, stranger, s)
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, nil},
		{"several signatures: only the first with a known keyid is checked", func(t *testing.T) Message {
			m := newMessage(body)
			bad := newSpec(t, keyPartner2, testNow)
			bad.label = "first"
			sign(t, &m, keyPartner1, bad) // keyid partner-2, signed with partner-1's secret
			sign(t, &m, keyPartner1, newSpec(t, keyPartner1, testNow))
			return m
		}, nil, ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newTestVerifier(t, tc.opts...).Verify(context.Background(), tc.build(t))
			if tc.want == nil && err != nil {
				t.Fatalf("Verify = %v, want success", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
}

// signedWithout returns a request with a body signed by partner-1 at
// testNow, covering defaultComponents except comp.
func signedWithout(t *testing.T, comp string) Message {
	return signed(t, keyPartner1, testNow, `{"item": 1}`, func(s *spec) {
		var cs []string
		for _, c := range s.components {
			if c != comp {
				cs = append(cs, c)
			}
		}
		s.components = cs
	})
}

func TestWindow(t *testing.T) {
	const window = 90 * time.Second
	startedAt := testNow.Add(-time.Hour + 500*time.Millisecond) // WithNotBefore truncates it to the second
	cases := []struct {
		name    string
		now     time.Time // the server's clock; testNow when zero
		created time.Time
		expires time.Time // none when zero
		opts    []Option
		want    error
	}{
		{"created now", time.Time{}, testNow, time.Time{}, nil, nil},
		{"created exactly window ago", time.Time{}, testNow.Add(-window), time.Time{}, nil, nil},
		{"created window+1s ago", time.Time{}, testNow.Add(-window - time.Second), time.Time{}, nil, ErrExpired},
		{"created exactly window ahead", time.Time{}, testNow.Add(window), time.Time{}, nil, nil},
		{"created window+1s ahead", time.Time{}, testNow.Add(window + time.Second), time.Time{}, nil, ErrExpired},
		{"server clock mid-second: now is truncated", testNow.Add(900 * time.Millisecond), testNow.Add(-window), time.Time{}, nil, nil},
		{"created long ago", time.Time{}, time.Unix(0, 0), time.Time{}, nil, ErrExpired},
		{"created far in the future", time.Time{}, time.Unix(999_999_999_999_999, 0), time.Time{}, nil, ErrExpired},
		{"expires in the future", time.Time{}, testNow, testNow.Add(time.Second), nil, nil},
		{"expires now", time.Time{}, testNow, testNow, nil, ErrExpired},
		{"expires in the past", time.Time{}, testNow.Add(-10 * time.Second), testNow.Add(-time.Second), nil, ErrExpired},
		{"created before WithNotBefore", time.Time{}, startedAt.Truncate(time.Second).Add(-time.Second), time.Time{}, []Option{WithWindow(2 * time.Hour), WithNotBefore(startedAt)}, ErrExpired},
		{"created in the second WithNotBefore falls in", time.Time{}, startedAt.Truncate(time.Second), time.Time{}, []Option{WithWindow(2 * time.Hour), WithNotBefore(startedAt)}, nil},
		{"WithWindow(0) keeps the default 5m: created 5m ago", time.Time{}, testNow.Add(-DefaultWindow), time.Time{}, []Option{WithWindow(0)}, nil},
		{"WithWindow(0) keeps the default 5m: created 5m1s ago", time.Time{}, testNow.Add(-DefaultWindow - time.Second), time.Time{}, []Option{WithWindow(0)}, ErrExpired},
	}
	for _, k := range signingKeys {
		for _, tc := range cases {
			t.Run(k.Alg+"/"+tc.name, func(t *testing.T) {
				now := tc.now
				if now.IsZero() {
					now = testNow
				}
				m := signed(t, k, tc.created, "", func(s *spec) {
					s.components = []string{"@method", "@authority", "@path", "@query"}
					if !tc.expires.IsZero() {
						s.params.Add("expires", tc.expires.Unix())
					}
				})
				opts := append([]Option{WithClock(fixedClock(now))}, tc.opts...)
				if len(tc.opts) == 0 {
					opts = append(opts, WithWindow(window))
				}
				_, err := NewVerifier(testKeys, newMemory(t, fixedClock(now)), opts...).Verify(context.Background(), m)
				if tc.want == nil {
					if err != nil {
						t.Fatalf("Verify = %v, want success", err)
					}
					return
				}
				if !errors.Is(err, tc.want) {
					t.Fatalf("Verify = %v, want %v", err, tc.want)
				}
				var ee *ExpiredError
				if !errors.As(err, &ee) {
					t.Fatalf("Verify = %v, want an *ExpiredError", err)
				}
				if !ee.ServerTime.Equal(now) || ee.ServerTime.Location() != time.UTC {
					t.Errorf("ServerTime = %v, want %v in UTC", ee.ServerTime, now)
				}
			})
		}
	}
}

func TestWindowIsCheckedAfterTheSignature(t *testing.T) {
	m := signed(t, keyPartner1, testNow.Add(-time.Hour), "", func(s *spec) { s.components = []string{"@method", "@authority", "@path", "@query"} })
	m.Method = "DELETE"
	if _, err := newTestVerifier(t).Verify(context.Background(), m); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Verify(expired forgery) = %v, want ErrInvalid", err)
	}
}

// recordingStore is a store.Store that records Put calls and answers
// them with fresh and err.
type recordingStore struct {
	store.Store
	mu    sync.Mutex
	calls []nonceCall
	fresh bool
	err   error
}

type nonceCall struct {
	key string
	ttl time.Duration
}

func (s *recordingStore) Put(_ context.Context, key string, _ store.Token, ttl time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, nonceCall{key, ttl})
	return s.fresh, s.err
}

func TestNonceIsKeptForTheWholeWindow(t *testing.T) {
	for _, created := range []time.Time{testNow, testNow.Add(-DefaultWindow), testNow.Add(DefaultWindow)} {
		st := &recordingStore{fresh: true}
		m := signed(t, keyMobile, created, "", func(s *spec) { s.components = []string{"@method", "@authority", "@path", "@query"} })
		res, err := NewVerifier(testKeys, st, WithClock(fixedClock(testNow))).Verify(context.Background(), m)
		if err != nil {
			t.Fatal(err)
		}
		// Kept for as long as the window could accept it again, as a
		// duration the store counts on its own clock.
		want := nonceCall{key: store.NonceKey(keyMobile.ID, res.Nonce), ttl: created.Add(DefaultWindow + time.Second).Sub(testNow)}
		if len(st.calls) != 1 || st.calls[0] != want {
			t.Errorf("created %v: Put calls = %+v, want [%+v]", created.Sub(testNow), st.calls, want)
		}
	}
}

func TestStoreFailureIsUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fresh bool
		err   error
	}{
		{"store error", false, store.Unavailable("test", errors.New("connection refused"))},
		{"store error claiming fresh", true, store.Unavailable("test", errors.New("timeout"))},
		{"store full", false, store.ErrFull},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &recordingStore{fresh: tc.fresh, err: tc.err}
			m := signed(t, keyPartner1, testNow, "", func(s *spec) { s.components = []string{"@method", "@authority", "@path", "@query"} })
			res, err := NewVerifier(testKeys, st, WithClock(fixedClock(testNow))).Verify(context.Background(), m)
			if !errors.Is(err, tc.err) {
				t.Fatalf("Verify = %v, want the store's error %v", err, tc.err)
			}
			if res != (Result{}) {
				t.Errorf("Result = %+v, want the zero Result", res)
			}
		})
	}
	t.Run("no store", func(t *testing.T) {
		m := signed(t, keyPartner1, testNow, "", func(s *spec) { s.components = []string{"@method", "@authority", "@path", "@query"} })
		if _, err := NewVerifier(testKeys, nil, WithClock(fixedClock(testNow))).Verify(context.Background(), m); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Verify = %v, want store.ErrUnavailable", err)
		}
	})
}

func TestRefusedRequestsNeverTouchTheStore(t *testing.T) {
	st := &recordingStore{fresh: true}
	v := NewVerifier(testKeys, st, WithClock(fixedClock(testNow)))
	forged := signed(t, keyPartner1, testNow, `{"a": 1}`, nil)
	forged.Body = []byte(`{"a": 2}`)
	forged.Header.Set("Content-Digest", ContentDigest(forged.Body))
	expired := signed(t, keyPartner1, testNow.Add(-time.Hour), "", func(s *spec) { s.components = []string{"@method", "@authority", "@path", "@query"} })
	for _, m := range []Message{forged, expired, newMessage("")} {
		if _, err := v.Verify(context.Background(), m); err == nil {
			t.Fatal("Verify succeeded")
		}
	}
	if len(st.calls) != 0 {
		t.Errorf("Put was called %d times", len(st.calls))
	}
}

func TestUnsafeSkipPolicyForTests(t *testing.T) {
	st := &recordingStore{err: errors.New("must not be called")}
	v := NewVerifier(testKeys, st, UnsafeSkipPolicyForTests(), WithClock(fixedClock(testNow)))
	bare := func(t *testing.T, edit func(*spec)) Message {
		return signed(t, keyPartner1, testNow.Add(-24*time.Hour), `{"a": 1}`, func(s *spec) {
			s.components = []string{"@authority"}
			s.params.Del("nonce")
			if edit != nil {
				edit(s)
			}
		})
	}
	for _, tc := range []struct {
		name  string
		build func(t *testing.T) Message
		want  error
	}{
		{"no nonce, old created, few components: accepted", func(t *testing.T) Message { return bare(t, nil) }, nil},
		{"no created: accepted", func(t *testing.T) Message { return bare(t, func(s *spec) { s.params.Del("created") }) }, nil},
		{"still needs a keyid", func(t *testing.T) Message { return bare(t, func(s *spec) { s.params.Del("keyid") }) }, ErrInvalid},
		{"still needs a valid signature", func(t *testing.T) Message {
			m := bare(t, nil)
			m.URL.Host = "other.example.com"
			return m
		}, ErrInvalid},
		{"still checks alg", func(t *testing.T) Message { return bare(t, func(s *spec) { s.params.Add("alg", AlgEd25519) }) }, ErrInvalid},
		{"still checks a covered content digest", func(t *testing.T) Message {
			m := bare(t, func(s *spec) { s.components = append(s.components, "content-digest") })
			m.Body = []byte(`{"a": 2}`)
			return m
		}, ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(context.Background(), tc.build(t))
			if tc.want == nil && err != nil {
				t.Fatalf("Verify = %v, want success", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %v, want %v", err, tc.want)
			}
		})
	}
	if len(st.calls) != 0 {
		t.Errorf("Put was called %d times", len(st.calls))
	}
}

// server returns the value of the environment variable name. When it is
// unset the test is skipped, or fails when REPLAYGUARD_TEST_REQUIRE=1 or
// CI=true: CI must run against real servers.
func server(t testing.TB, name string) string {
	t.Helper()
	return testenv.Var(t, name)
}

// uniquePrefix returns a Redis key prefix no other test run uses.
func uniquePrefix(t testing.TB) string {
	return "rgtest:replay:" + newNonce(t)[:16] + ":"
}

// nonceStores are the stores the replay tests run on. Each opens a store
// reading the real clock (a real Redis expires keys by its own), closed
// with the test.
var nonceStores = []struct {
	name string
	open func(t testing.TB) store.Store
}{
	{"memory", func(t testing.TB) store.Store { return newMemory(t, time.Now) }},
	{"redis", func(t testing.TB) store.Store {
		opt, err := goredis.ParseURL(server(t, envURL))
		if err != nil {
			t.Fatalf("%s: %v", envURL, err)
		}
		opt.ContextTimeoutEnabled = true
		opt.ReadTimeout, opt.WriteTimeout = -1, -1 // the store's timeout alone bounds a call, not go-redis's 3s
		s := redisstore.New(goredis.NewClient(opt), redisstore.WithPrefix(uniquePrefix(t)), redisstore.WithTimeout(5*time.Second))
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"cluster", func(t testing.TB) store.Store {
		addrs := strings.Split(server(t, envCluster), ",")
		c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, ReadTimeout: -1, WriteTimeout: -1})
		s := redisstore.New(c, redisstore.WithPrefix(uniquePrefix(t)), redisstore.WithTimeout(5*time.Second))
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

func TestReplayIsRefused(t *testing.T) {
	const body = `{"item": 1}`
	for _, sc := range nonceStores {
		t.Run(sc.name, func(t *testing.T) {
			st := sc.open(t)
			v := NewVerifier(testKeys, st)
			ctx := context.Background()
			for _, k := range signingKeys {
				t.Run(k.Alg+"/the same request twice", func(t *testing.T) {
					m := signed(t, k, time.Now(), body, nil)
					if _, err := v.Verify(ctx, m); err != nil {
						t.Fatalf("first Verify = %v", err)
					}
					if _, err := v.Verify(ctx, clone(m)); !errors.Is(err, ErrReplayed) {
						t.Fatalf("second Verify = %v, want ErrReplayed", err)
					}
				})
			}
			t.Run("a nonce is scoped per key ID", func(t *testing.T) {
				nonce := newNonce(t)
				for _, k := range []testKey{keyPartner1, keyPartner2, keyMobile} {
					m := signed(t, k, time.Now(), body, func(s *spec) { s.params.Add("nonce", nonce) })
					if _, err := v.Verify(ctx, m); err != nil {
						t.Errorf("%s: Verify = %v, want success", k.ID, err)
					}
				}
			})
			t.Run("a forgery does not burn the nonce", func(t *testing.T) {
				m := signed(t, keyPartner1, time.Now(), body, nil)
				forged := clone(m)
				forged.URL.Path = "/v1/admin"
				if _, err := v.Verify(ctx, forged); !errors.Is(err, ErrInvalid) {
					t.Fatalf("Verify(forgery) = %v, want ErrInvalid", err)
				}
				if _, err := v.Verify(ctx, m); err != nil {
					t.Fatalf("Verify(original) = %v, want success", err)
				}
			})
			for _, k := range signingKeys {
				t.Run(k.Alg+"/50 concurrent copies: exactly one accepted", func(t *testing.T) {
					const n = 50
					m := signed(t, k, time.Now(), body, nil)
					errs := make([]error, n)
					start := make(chan struct{})
					var wg sync.WaitGroup
					for i := range n {
						wg.Add(1)
						go func() {
							defer wg.Done()
							<-start
							_, errs[i] = v.Verify(ctx, m)
						}()
					}
					close(start)
					wg.Wait()
					ok, replayed := 0, 0
					for _, err := range errs {
						switch {
						case err == nil:
							ok++
						case errors.Is(err, ErrReplayed):
							replayed++
						default:
							t.Errorf("Verify = %v", err)
						}
					}
					if ok != 1 || replayed != n-1 {
						t.Errorf("%d accepted and %d replayed, want 1 and %d", ok, replayed, n-1)
					}
				})
			}
		})
	}
}

// BenchmarkVerify prices one verification, nonce recorded, per algorithm
// and store: memory always, Redis and Redis Cluster when their variables
// are set (b.RunParallel; 16 goroutines per CPU on the network stores,
// as test/load's baseline does, so that round trips overlap). Every
// request is distinct and accepted: they are all signed before the timer
// starts.
func BenchmarkVerify(b *testing.B) {
	const body = `{"item": 1}`
	for _, k := range signingKeys {
		for _, sc := range nonceStores {
			b.Run(k.Alg+"/"+sc.name, func(b *testing.B) {
				var st store.Store
				if sc.name == "memory" {
					m := memory.New(memory.WithMaxEntries(b.N + 1024))
					defer m.Close()
					st = m
				} else {
					st = sc.open(b)
					b.SetParallelism(16)
				}
				v := NewVerifier(testKeys, st)
				reqs := presign(b, k, body, b.N)
				var next, failed atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						m := reqs.message(int(next.Add(1) - 1))
						if _, err := v.Verify(context.Background(), m); err != nil {
							if failed.Add(1) == 1 {
								b.Errorf("Verify = %v", err)
							}
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifications/s")
			})
		}
	}
}

// presigned holds n signed requests compactly: they differ only in the
// nonce (and so the signature), so each keeps just those.
type presigned struct {
	base      Message
	inputHead string // Signature-Input up to the nonce's value
	nonces    []string
	sigs      []string // Signature field values
}

// presign signs n distinct requests with k, created now.
func presign(b *testing.B, k testKey, body string, n int) *presigned {
	b.Helper()
	p := &presigned{base: newMessage(body), nonces: make([]string, n), sigs: make([]string, n)}
	created := time.Now()
	var wg sync.WaitGroup
	workers := 4
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				m := clone(p.base)
				s := newSpec(b, k, created)
				s.params.Add("nonce", fmt.Sprintf("%016x-%d", i, created.UnixNano()))
				sign(b, &m, k, s)
				nonce, _ := s.params.Get("nonce")
				p.nonces[i] = nonce.(string)
				p.sigs[i] = m.Header.Get("Signature")
				if i == 0 {
					in := m.Header.Get("Signature-Input")
					p.inputHead = in[:strings.LastIndex(in, p.nonces[i])]
				}
			}
		}()
	}
	wg.Wait()
	return p
}

// message returns the i-th request, with its own header map as a server
// would build.
func (p *presigned) message(i int) Message {
	m := p.base
	m.Header = http.Header{
		"Content-Type":    p.base.Header["Content-Type"],
		"Authorization":   p.base.Header["Authorization"],
		"Content-Digest":  p.base.Header["Content-Digest"],
		"Signature-Input": {p.inputHead + p.nonces[i] + `"`},
		"Signature":       {p.sigs[i]},
	}
	return m
}

// TestSkewNeverLetsAReplayThrough: an instance whose clock is behind the
// store's keeps accepting a signature until created + window by its own
// clock, which by the store's clock is later. The nonce must be kept that
// long: the store counts the retention from its own clock, so the replay
// is refused at the window's very end whatever the skew.
func TestSkewNeverLetsAReplayThrough(t *testing.T) {
	const window, skew = 2 * time.Second, 10 * time.Second
	ctx := context.Background()
	t.Run("memory store whose clock is ahead", func(t *testing.T) {
		storeClock := storetest.NewClock(time.Now())
		instance := func() time.Time { return storeClock.Now().Add(-skew) }
		v := NewVerifier(testKeys, newMemory(t, storeClock.Now), WithWindow(window), WithClock(instance))
		m := signed(t, keyPartner1, instance(), "", func(s *spec) { s.components = []string{"@method", "@authority", "@path", "@query"} })
		if _, err := v.Verify(ctx, m); err != nil {
			t.Fatalf("first Verify = %v", err)
		}
		// The instance's window reaches its end; the store's clock is past
		// created + window + 1s by its own reading.
		storeClock.Advance(window)
		if _, err := v.Verify(ctx, clone(m)); !errors.Is(err, ErrReplayed) {
			t.Fatalf("replay at the end of the instance's window = %v, want ErrReplayed", err)
		}
	})
	for _, sc := range nonceStores[1:] { // the real Redis servers run on the real clock
		t.Run(sc.name+" whose clock is ahead", func(t *testing.T) {
			instance := func() time.Time { return time.Now().Add(-skew) }
			v := NewVerifier(testKeys, sc.open(t), WithWindow(window), WithClock(instance))
			m := signed(t, keyPartner1, instance(), "", func(s *spec) { s.components = []string{"@method", "@authority", "@path", "@query"} })
			if _, err := v.Verify(ctx, m); err != nil {
				t.Fatalf("first Verify = %v", err)
			}
			// By Redis's clock created + window + 1s passed long ago: an
			// absolute expiry would have kept nothing.
			if _, err := v.Verify(ctx, clone(m)); !errors.Is(err, ErrReplayed) {
				t.Fatalf("replay = %v, want ErrReplayed", err)
			}
		})
	}
}
