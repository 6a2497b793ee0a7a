package replay

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store"
)

// freshStore is a store.Store whose every nonce is fresh, so fuzzing
// keeps no state.
type freshStore struct{ store.Store }

func (freshStore) Put(context.Context, string, store.Token, time.Duration) (bool, error) {
	return true, nil
}

// sentinels are the errors Verify wraps; every error wraps exactly one.
var sentinels = []error{ErrMissing, ErrInvalid, ErrExpired, ErrReplayed, store.ErrUnavailable}

// FuzzVerifySignatureInput feeds arbitrary Signature-Input, Signature and
// Content-Digest fields to Verify, with and without the policy. Verify
// must never panic and must always answer with one sentinel (a forgery
// cannot succeed). Run it with
//
//	go test -fuzz=FuzzVerifySignatureInput ./replay/
//
// The seeds run in the normal suite.
func FuzzVerifySignatureInput(f *testing.F) {
	good := signed(f, keyPartner1, testNow, `{"item": 1}`, nil)
	goodEd := signed(f, keyMobile, testNow, `{"item": 1}`, func(s *spec) {
		s.components = []string{"@method", "@target-uri", "@authority", "@path", "@scheme", "@request-target", "content-digest", "content-type"}
	})
	digest := good.Header.Get("Content-Digest")
	for _, m := range []Message{good, goodEd} {
		f.Add(m.Header.Get("Signature-Input"), m.Header.Get("Signature"), digest)
	}
	for _, h := range []string{"b25.headers", "b26.headers"} {
		m := vectorMessage(f, h)
		f.Add(m.Header.Get("Signature-Input"), m.Header.Get("Signature"), m.Header.Get("Content-Digest"))
	}
	for _, seed := range [][3]string{
		{"", "", ""},
		{`sig1=()`, `sig1=::`, `sha-256=::`},
		{`sig1=();keyid="partner-1"`, `sig1=:AAAA:`, `sha-512=:AAAA:, md5=?1`},
		{`sig1=("@method" "@method");keyid="partner-1";created=1;nonce="n"`, `sig1=:AAAA:`, digest},
		{`sig1=("@query-param";name="id");keyid="partner-1"`, `sig1=:AAAA:`, digest},
		{`sig1=("content-digest";sf "content-digest";key="sha-256");keyid="partner-1"`, `sig1=:AAAA:`, digest},
		{`sig1=("@signature-params");keyid="mobile";alg="ed25519"`, `sig1=:` + strings.Repeat("A", 88) + `:`, digest},
		{`a=1, b=(1 2 3);x, sig1=("@path");keyid=?1`, `sig1=?0`, `sha-256`},
		{`sig1=("@authority");created=-999999999999999;expires=999999999999999;keyid="partner-1";nonce="x"`, `sig1=:AAAA:`, digest},
		{`sig1=("@authority");created=1.5;keyid="partner-1"`, `sig1=:AAAA:`, digest},
		{`sig1=("\"");keyid="partner-1"`, `sig1=:AAAA:`, digest},
		{`sig1=("x-a\\b" "@");keyid="partner-1"`, `sig1=:AAAA:`, digest},
		{"sig1=(\"@method\");keyid=\"partner-1\"\x00", "sig1=:AAAA:\x7f", "\xff"},
		{strings.Repeat("(", 5000), strings.Repeat(":", 5000), strings.Repeat("a=1,", 3000)},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}

	withPolicy := NewVerifier(testKeys, freshStore{}, WithClock(fixedClock(testNow)), WithRequired("content-type"))
	withoutPolicy := NewVerifier(testKeys, freshStore{}, UnsafeSkipPolicyForTests())
	f.Fuzz(func(t *testing.T, input, signature, contentDigest string) {
		m := newMessage(`{"item": 1}`)
		m.Header["Signature-Input"] = []string{input}
		m.Header["Signature"] = []string{signature}
		m.Header["Content-Digest"] = []string{contentDigest}
		for _, v := range []*Verifier{withPolicy, withoutPolicy} {
			_, err := v.Verify(context.Background(), m)
			if err == nil {
				continue // a seed that is a genuine signature
			}
			n := 0
			for _, s := range sentinels {
				if errors.Is(err, s) {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("Verify = %v, which wraps %d sentinels", err, n)
			}
		}
	})
}

// FuzzParseKeys checks that ParseKeys never panics and fails only with
// ErrBadKeys.
func FuzzParseKeys(f *testing.F) {
	f.Add([]byte(readVector(f, "keys.json")))
	f.Add([]byte(`{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "` + secret32 + `"}]}`))
	f.Add([]byte(`{"keys": [{"id": "m", "alg": "ed25519", "public_key": ` + jsonString(edPubPEM) + `}]}`))
	f.Add([]byte(`{"keys": [null, 1, "x", {}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseKeys(data)
		if err != nil && !errors.Is(err, ErrBadKeys) {
			t.Fatalf("ParseKeys = %v, not ErrBadKeys", err)
		}
		if err == nil && k.Len() == 0 {
			t.Fatal("ParseKeys accepted a file with no keys")
		}
	})
}
