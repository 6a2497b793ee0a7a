package replay

import (
	"bytes"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

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
	for _, seed := range signatureSeeds(f) {
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

// signatureSeeds are Signature-Input, Signature and Content-Digest
// fields for the fuzz tests: genuine ones (signed at testNow over
// newMessage(`{"item": 1}`)), the same respelled in every way the fast
// readers of sfv.go leave to httpsfv, and malformed ones.
func signatureSeeds(f *testing.F) [][3]string {
	good := signed(f, keyPartner1, testNow, `{"item": 1}`, nil)
	goodEd := signed(f, keyMobile, testNow, `{"item": 1}`, func(s *spec) {
		s.components = []string{"@method", "@target-uri", "@authority", "@path", "@scheme", "@request-target", "content-digest", "content-type"}
	})
	digest := good.Header.Get("Content-Digest")
	var seeds [][3]string
	for _, m := range []Message{good, goodEd} {
		seeds = append(seeds, [3]string{m.Header.Get("Signature-Input"), m.Header.Get("Signature"), digest})
	}
	for _, h := range []string{"b25.headers", "b26.headers"} {
		m := vectorMessage(f, h)
		seeds = append(seeds, [3]string{m.Header.Get("Signature-Input"), m.Header.Get("Signature"), m.Header.Get("Content-Digest")})
	}
	in, sig := good.Header.Get("Signature-Input"), good.Header.Get("Signature")
	sum512 := sha512.Sum512([]byte(`{"item": 1}`))
	digest512 := "sha-512=:" + base64.StdEncoding.EncodeToString(sum512[:]) + ":"
	respell := func(old, new string) string { return strings.Replace(in, old, new, 1) }
	for _, seed := range [][3]string{
		// Respelled, still valid: not canonical, or not the usual shape.
		{respell("(", "( "), sig, digest},
		{respell(`" "`, `"  "`), sig, digest},
		{respell(";created", "; created"), sig, digest},
		{respell("created=", "created=00"), sig, digest},
		{respell(";keyid", ";x;keyid"), sig, digest},
		{respell(";keyid", ";x=?0;keyid"), sig, digest},
		{respell(";keyid", ";x=tok;keyid"), sig, digest},
		{respell(";keyid", ";x=1.5;keyid"), sig, digest},
		{respell(";keyid", ";x=-0;keyid"), sig, digest},
		{respell(";keyid", ";x=:AAAA:;keyid"), sig, digest},
		{respell(";keyid", `;x="a\"b\\";keyid`), sig, digest},
		{respell(";keyid", ";created=1;keyid"), sig, digest},
		{respell(`"@method"`, `"@method";x`), sig, digest},
		{`sig0=("@method");keyid="partner-2", ` + in, `sig0=:AAAA:, ` + sig, digest},
		{`sig0=("@method");keyid="partner-2"`, sig, digest},
		{in + ", sig1=()", sig, digest},
		{in + " ,\tx=1", sig, digest},
		{in + ",", sig, digest},
		{"  " + in + " \t", "  " + sig + " ", " " + digest + " "},
		{"\t" + in, sig, digest},
		{in, sig + ";x=1", digest},
		{in, sig + ", sig2=:AAAA:", digest},
		{in, "sig1=:" + strings.Repeat("A", 43) + ":", digest},
		{in, strings.TrimSuffix(sig, "=:") + ":", digest},
		{in, sig, digest + ", " + digest512},
		{in, sig, digest512 + ", md5=:AAAA:"},
		{in, sig, "md5=?1, " + digest},
		{in, sig, digest + ", " + digest},
		{in, sig, "sha-256=:AAAA:, " + digest},
		{in, sig, strings.TrimSuffix(digest, "=:") + ":"},
		{in, sig, "sha-384=:" + strings.Repeat("A", 200) + ":, " + digest},
		// Malformed.
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
		seeds = append(seeds, seed)
	}
	return seeds
}

// FuzzVerifyMatchesReference holds Verify to referenceVerify, Verify as
// it was before its fast paths: for any Signature-Input, Signature and
// Content-Digest (a newline in a fuzzed value splits it into field
// lines), with and without the policy, both must give the same Result or
// the same error, word for word. Run it with
//
//	go test -fuzz=FuzzVerifyMatchesReference ./replay/
//
// The seeds run in the normal suite.
func FuzzVerifyMatchesReference(f *testing.F) {
	for _, seed := range signatureSeeds(f) {
		f.Add(seed[0], seed[1], seed[2], true)
		f.Add(seed[0], seed[1], seed[2], false)
	}
	verifiers := []*Verifier{
		NewVerifier(testKeys, freshStore{}, WithClock(fixedClock(testNow)), WithRequired("content-type")),
		NewVerifier(testKeys, freshStore{}, WithClock(fixedClock(testNow))),
		NewVerifier(testKeys, freshStore{}, UnsafeSkipPolicyForTests()),
	}
	f.Fuzz(func(t *testing.T, input, signature, contentDigest string, body bool) {
		m := newMessage(`{"item": 1}`)
		if !body {
			m.Body = nil
		}
		m.Header["Signature-Input"] = strings.Split(input, "\n")
		m.Header["Signature"] = strings.Split(signature, "\n")
		m.Header["Content-Digest"] = strings.Split(contentDigest, "\n")
		for i, v := range verifiers {
			got, gotErr := v.Verify(context.Background(), clone(m))
			want, wantErr := v.referenceVerify(context.Background(), clone(m))
			if got != want || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("verifier %d: Verify = %+v, %v\nreference = %+v, %v", i, got, gotErr, want, wantErr)
			}
			for _, s := range sentinels {
				if errors.Is(gotErr, s) != errors.Is(wantErr, s) {
					t.Fatalf("verifier %d: Verify = %v, reference = %v: they differ on %v", i, gotErr, wantErr, s)
				}
			}
		}
	})
}

// FuzzFastFieldsMatchHTTPSFV holds the fast readers of sfv.go to
// httpsfv: whatever field one accepts, httpsfv must parse to the same
// members, and a Signature-Input member's received text must be its
// canonical serialisation. Every inner list httpsfv reads must also give
// SignatureBase the signature base it gave before. Run it with
//
//	go test -fuzz=FuzzFastFieldsMatchHTTPSFV ./replay/
//
// The seeds run in the normal suite.
func FuzzFastFieldsMatchHTTPSFV(f *testing.F) {
	for _, seed := range signatureSeeds(f) {
		for _, field := range seed {
			f.Add(field)
		}
	}
	m := newMessage(`{"item": 1}`)
	m.Header.Set("X-Empty", "")
	f.Fuzz(func(t *testing.T, field string) {
		d, err := httpsfv.UnmarshalDictionary([]string{field})

		// Signature-Input.
		if got, ok := parseInputFast(field, nil, nil, nil); ok {
			if err != nil {
				t.Fatalf("parseInputFast read %q, which httpsfv refuses: %v", field, err)
			}
			want := inputsOf(d)
			if len(got) != len(want) {
				t.Fatalf("parseInputFast read %d members, httpsfv %d", len(got), len(want))
			}
			for i := range got {
				g, w := got[i], want[i]
				if g.label != w.label || g.isList != w.isList || !slices.Equal(g.comps, w.comps) || !slices.Equal(g.params, w.params) {
					t.Fatalf("member %d: parseInputFast read %+v, httpsfv %+v", i, g, w)
				}
				if ser, err := serializeParams(w.list); err != nil || ser != g.raw {
					t.Fatalf("member %d: received %q, canonical %q (%v)", i, g.raw, ser, err)
				}
			}
		}

		// Signature.
		if label, sig, ok := parseSignatureFast(field, &b64Decoder{}, nil); ok {
			if err != nil {
				t.Fatalf("parseSignatureFast read %q, which httpsfv refuses: %v", field, err)
			}
			if names := d.Names(); len(names) != 1 || names[0] != label {
				t.Fatalf("parseSignatureFast read member %q, httpsfv %q", label, names)
			}
			mem, _ := d.Get(label)
			it, ok := mem.(httpsfv.Item)
			if b, isBytes := it.Value.([]byte); !ok || !isBytes || !bytes.Equal(b, sig) || len(it.Params.Names()) > 0 {
				t.Fatalf("parseSignatureFast read %x, httpsfv %#v", sig, mem)
			}
		}

		// Content-Digest.
		// parseDigestFast leaves decoding to digestsMatch: a field whose
		// base64 does not decode is one httpsfv refuses.
		if got, ok := parseDigestFast(field, nil); ok {
			decoded := make([][]byte, len(got))
			for i, g := range got {
				if decoded[i], ok = (&b64Decoder{}).decode(g.b64, nil); !ok {
					break
				}
			}
			switch {
			case !ok && err == nil:
				t.Fatalf("parseDigestFast read %q, whose base64 does not decode, but httpsfv does", field)
			case ok && err != nil:
				t.Fatalf("parseDigestFast read %q, which httpsfv refuses: %v", field, err)
			case ok:
				names := d.Names()
				if len(names) != len(got) {
					t.Fatalf("parseDigestFast read %d members, httpsfv %d", len(got), len(names))
				}
				for i, g := range got {
					mem, _ := d.Get(names[i])
					it, isItem := mem.(httpsfv.Item)
					b, isBytes := it.Value.([]byte)
					if g.alg != names[i] || !isItem || !isBytes || len(it.Params.Names()) > 0 || !bytes.Equal(decoded[i], b) {
						t.Fatalf("member %d: parseDigestFast read %+v, httpsfv %q %#v", i, g, names[i], mem)
					}
				}
			}
		}
		for _, body := range []string{`{"item": 1}`, ""} {
			if digestsMatch(field, []byte(body), new(scratch)) {
				if err := refCheckContentDigest([]string{field}, []byte(body)); err != nil {
					t.Fatalf("digestsMatch accepted %q for %q, the reference refuses it: %v", field, body, err)
				}
			}
		}

		// SignatureBase, for every inner list.
		if err != nil {
			return
		}
		for _, name := range d.Names() {
			mem, _ := d.Get(name)
			il, ok := mem.(httpsfv.InnerList)
			if !ok {
				continue
			}
			got, gotErr := SignatureBase(m, name, il)
			want, wantErr := refSignatureBase(m, name, il)
			if got != want || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
				t.Fatalf("SignatureBase = %q, %v\nreference = %q, %v", got, gotErr, want, wantErr)
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
