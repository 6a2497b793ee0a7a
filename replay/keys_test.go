package replay

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Key material for the keys file tests.
var (
	secret32 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xA5}, 32))
	secret31 = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xA5}, 31))
	edPub    = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, 32)).Public().(ed25519.PublicKey)
	edPubB64 = base64.StdEncoding.EncodeToString(edPub)
	edPubPEM = pemOf("PUBLIC KEY", mustPKIX(edPub))
	ecPubPEM = func() string {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), zeroReader{})
		return pemOf("PUBLIC KEY", mustPKIX(&k.PublicKey))
	}()
	secretRaw = bytes.Repeat([]byte{0xA5}, 32)
)

// zeroReader is a deterministic io.Reader of zero bytes.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func mustPKIX(k any) []byte {
	b, err := x509.MarshalPKIXPublicKey(k)
	if err != nil {
		panic(err)
	}
	return b
}

func pemOf(typ string, b []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}))
}

// jsonString quotes s as a JSON string.
func jsonString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

func TestParseKeysAcceptsGoodFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		want []Key
	}{
		{"the issue's example", `{"keys": [{"id": "partner-1", "alg": "hmac-sha256", "secret": "` + secret32 + `"},
			{"id": "mobile", "alg": "ed25519", "public_key": "` + edPubB64 + `"}]}`,
			[]Key{{ID: "partner-1", Alg: AlgHMACSHA256, Secret: secretRaw}, {ID: "mobile", Alg: AlgEd25519, PublicKey: edPub}}},
		{"ed25519 public key as PEM, with a label", `{"keys": [{"id": "mobile", "alg": "ed25519", "public_key": ` + jsonString(edPubPEM) + `, "label": "iOS app"}]}`,
			[]Key{{ID: "mobile", Alg: AlgEd25519, PublicKey: edPub, Label: "iOS app"}}},
		{"PEM with surrounding whitespace", `{"keys": [{"id": "m", "alg": "ed25519", "public_key": ` + jsonString("\n  "+edPubPEM+"\n\n") + `}]}`,
			[]Key{{ID: "m", Alg: AlgEd25519, PublicKey: edPub}}},
		{"long secret", `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "` + base64.StdEncoding.EncodeToString(make([]byte, 64)) + `"}]}`,
			[]Key{{ID: "p", Alg: AlgHMACSHA256, Secret: make([]byte, 64)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ParseKeys([]byte(tc.file))
			if err != nil {
				t.Fatalf("ParseKeys: %v", err)
			}
			if k.Len() != len(tc.want) {
				t.Errorf("Len = %d, want %d", k.Len(), len(tc.want))
			}
			for _, w := range tc.want {
				got, ok := k.Lookup(w.ID)
				if !ok {
					t.Fatalf("Lookup(%q) found nothing", w.ID)
				}
				if got.ID != w.ID || got.Alg != w.Alg || !bytes.Equal(got.Secret, w.Secret) || !bytes.Equal(got.PublicKey, w.PublicKey) || got.Label != w.Label {
					t.Errorf("Lookup(%q) = %#v, want %#v", w.ID, got, w)
				}
			}
			if _, ok := k.Lookup("nobody"); ok {
				t.Error("Lookup(nobody) found a key")
			}
		})
	}
}

func TestParseKeysRefusesMalformedFiles(t *testing.T) {
	hm := func(extra string) string {
		return `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "` + secret32 + `"` + extra + `}]}`
	}
	ed := func(pub string) string {
		return `{"keys": [{"id": "m", "alg": "ed25519", "public_key": ` + jsonString(pub) + `}]}`
	}
	for _, tc := range []struct {
		name, file string
		mention    string // the error names the entry, or says what is wrong
	}{
		{"empty file", ``, "empty"},
		{"not JSON", `keys: []`, "not valid JSON"},
		{"truncated JSON", `{"keys": [{"id": "p"`, "ends early"},
		{"JSON array", `[]`, "array"},
		{"no keys member", `{}`, `no "keys"`},
		{"empty keys", `{"keys": []}`, "empty"},
		{"keys is null", `{"keys": null}`, `no "keys"`},
		{"unknown top-level member", `{"keys": [], "version": 2}`, `"version"`},
		{"unknown key member", hm(`, "kid": "x"`), `"kid"`},
		{"data after the object", hm(``) + ` {}`, "after"},
		{"missing id", `{"keys": [{"alg": "hmac-sha256", "secret": "` + secret32 + `"}]}`, "keys[0]"},
		{"empty id", `{"keys": [{"id": "", "alg": "hmac-sha256", "secret": "` + secret32 + `"}]}`, "keys[0]"},
		{"id with a control character", `{"keys": [{"id": "a\u0001", "alg": "hmac-sha256", "secret": "` + secret32 + `"}]}`, "printable"},
		{"id not a string", `{"keys": [{"id": 7, "alg": "hmac-sha256", "secret": "` + secret32 + `"}]}`, "id"},
		{"duplicate id", `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "` + secret32 + `"}, {"id": "p", "alg": "ed25519", "public_key": "` + edPubB64 + `"}]}`, `keys[1]: duplicate id "p"`},
		{"missing alg", `{"keys": [{"id": "p", "secret": "` + secret32 + `"}]}`, `keys[0] (id "p")`},
		{"unknown alg", `{"keys": [{"id": "p", "alg": "rsa-pss-sha512", "secret": "` + secret32 + `"}]}`, "rsa-pss-sha512"},
		{"alg in uppercase", `{"keys": [{"id": "p", "alg": "HMAC-SHA256", "secret": "` + secret32 + `"}]}`, "alg"},
		{"hmac without secret", `{"keys": [{"id": "p", "alg": "hmac-sha256"}]}`, `"secret" is missing`},
		{"hmac with empty secret", `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": ""}]}`, `"secret" is missing`},
		{"hmac secret not base64", `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "not base64!"}]}`, "base64"},
		{"hmac secret in URL-safe base64", `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "` + strings.NewReplacer("+", "-", "/", "_").Replace(base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, 33))) + `"}]}`, "base64"},
		{"hmac secret of 31 bytes", `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "` + secret31 + `"}]}`, "31 bytes"},
		{"hmac with a public key too", hm(`, "public_key": "` + edPubB64 + `"`), "public_key"},
		{"ed25519 without public key", `{"keys": [{"id": "m", "alg": "ed25519"}]}`, `"public_key" is missing`},
		{"ed25519 with a secret too", `{"keys": [{"id": "m", "alg": "ed25519", "public_key": "` + edPubB64 + `", "secret": "` + secret32 + `"}]}`, "secret"},
		{"ed25519 key of 31 bytes", ed(base64.StdEncoding.EncodeToString(edPub[:31])), "31 bytes"},
		{"ed25519 key of 33 bytes", ed(base64.StdEncoding.EncodeToString(append(bytes.Clone(edPub), 0))), "33 bytes"},
		{"ed25519 key not base64", ed("%%%"), "neither PEM nor"},
		{"PEM that does not parse", ed("-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n"), "PEM"},
		{"PEM of another type", ed(pemOf("PRIVATE KEY", []byte{1, 2, 3})), `"PRIVATE KEY"`},
		{"PEM holding garbage", ed(pemOf("PUBLIC KEY", []byte{1, 2, 3})), "PKIX"},
		{"PEM holding an ECDSA key", ed(ecPubPEM), "not an Ed25519 key"},
		{"two PEM blocks", ed(edPubPEM + edPubPEM), "after its PEM block"},
		{"label not a string", hm(`, "label": 3`), "label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ParseKeys([]byte(tc.file))
			if !errors.Is(err, ErrBadKeys) {
				t.Fatalf("ParseKeys = (%v, %v), want ErrBadKeys", k, err)
			}
			if !strings.Contains(err.Error(), tc.mention) {
				t.Errorf("error %q does not mention %q", err, tc.mention)
			}
			for _, secret := range []string{secret32, secret31, edPubB64, "not base64", "%%%"} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q contains key material", err)
				}
			}
		})
	}
}

func TestParseKeysNeverQuotesKeyMaterial(t *testing.T) {
	// encoding/json's own messages quote the offending character; a
	// control character inside a secret would leak part of it.
	for _, file := range []string{
		"{\"keys\": [{\"id\": \"p\", \"alg\": \"hmac-sha256\", \"secret\": \"SECRETSECRET\x01\"}]}",
		`{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": SECRETSECRET}]}`,
		`{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "SECRETSECRET"}]}`,
		`{"keys": [{"id": "p", "alg": "ed25519", "public_key": "SECRETSECRET"}]}`,
		`{"keys": [{"id": "p", "alg": "SECRETSECRET", "secret": "SECRETSECRET"}]}`[:60],
	} {
		_, err := ParseKeys([]byte(file))
		if !errors.Is(err, ErrBadKeys) {
			t.Fatalf("ParseKeys(%q) = %v, want ErrBadKeys", file, err)
		}
		if strings.Contains(err.Error(), "SECRET") || strings.Contains(err.Error(), "\x01") {
			t.Errorf("ParseKeys(%q) error %q quotes the file", file, err)
		}
	}
}

func TestLoadKeys(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	writeFile(t, good, `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "`+secret32+`"}]}`)
	if k, err := LoadKeys(good); err != nil || k.Len() != 1 {
		t.Fatalf("LoadKeys(good) = (%v, %v)", k, err)
	}
	big := filepath.Join(dir, "big.json")
	writeFile(t, big, `{"keys": [{"id": "p", "alg": "hmac-sha256", "secret": "`+secret32+`", "label": "`+strings.Repeat("x", MaxKeysFileBytes)+`"}]}`)
	if _, err := LoadKeys(big); !errors.Is(err, ErrBadKeys) || !strings.Contains(err.Error(), big+" is over 1048576 bytes") {
		t.Errorf("LoadKeys(over 1 MiB) = %v, want ErrBadKeys naming the file and the limit", err)
	}
	if _, err := LoadKeys(filepath.Join(dir, "missing.json")); err == nil || errors.Is(err, ErrBadKeys) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadKeys(missing) = %v, want os.ErrNotExist", err)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestZeroValuesHoldNoKeys(t *testing.T) {
	var k *Keys
	var r KeyRing
	if _, ok := k.Lookup("p"); ok || k.Len() != 0 {
		t.Error("nil *Keys holds keys")
	}
	if _, ok := r.Lookup("p"); ok || r.Len() != 0 {
		t.Error("zero KeyRing holds keys")
	}
}

func TestKeyRingReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	file := func(ids ...string) string {
		var es []string
		for _, id := range ids {
			es = append(es, fmt.Sprintf(`{"id": %q, "alg": "hmac-sha256", "secret": %q}`, id, secret32))
		}
		return `{"keys": [` + strings.Join(es, ", ") + `]}`
	}
	if _, err := NewKeyRing(path); err == nil {
		t.Fatal("NewKeyRing(missing file) succeeded")
	}
	writeFile(t, path, `{"keys": [}`)
	if _, err := NewKeyRing(path); !errors.Is(err, ErrBadKeys) {
		t.Fatalf("NewKeyRing(malformed) = %v, want ErrBadKeys", err)
	}
	writeFile(t, path, file("old"))
	r, err := NewKeyRing(path)
	if err != nil {
		t.Fatal(err)
	}

	// Lookups run throughout; each must see either the old set or the
	// new one, never a mixture or nothing.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, old := r.Lookup("old")
				_, n := r.Lookup("new")
				if !old && !n {
					bad.Add(1)
				}
			}
		}()
	}

	steps := []struct {
		name    string
		file    string
		wantErr bool
		want    []string // IDs in force after the step
		notWant []string
	}{
		{"malformed file keeps the old keys", `{"keys": [{"id": "new"}]}`, true, []string{"old"}, []string{"new"}},
		{"empty list keeps the old keys", `{"keys": []}`, true, []string{"old"}, []string{"new"}},
		{"good file swaps", file("old", "new"), false, []string{"old", "new"}, nil},
		{"removing a key takes effect", file("new"), false, []string{"new"}, []string{"old"}},
		{"unreadable file keeps the keys", "", true, []string{"new"}, []string{"old"}},
	}
	for _, s := range steps {
		if s.file == "" {
			os.Remove(path)
		} else {
			writeFile(t, path, s.file)
		}
		err := r.Reload()
		if (err != nil) != s.wantErr {
			t.Errorf("%s: Reload = %v", s.name, err)
		}
		for _, id := range s.want {
			if _, ok := r.Lookup(id); !ok {
				t.Errorf("%s: %q not in force", s.name, id)
			}
		}
		for _, id := range s.notWant {
			if _, ok := r.Lookup(id); ok {
				t.Errorf("%s: %q still in force", s.name, id)
			}
		}
		if r.Len() != len(s.want) {
			t.Errorf("%s: Len = %d, want %d", s.name, r.Len(), len(s.want))
		}
	}
	close(stop)
	wg.Wait()
	// The sets in force go {old}, {old, new}, {new}: once "old" is gone
	// "new" is always there, so no pair of lookups finds neither.
	if n := bad.Load(); n != 0 {
		t.Errorf("%d lookups found neither key", n)
	}
}

func TestKeyStringHidesTheSecret(t *testing.T) {
	k := Key{ID: "p", Alg: AlgHMACSHA256, Secret: []byte("SECRETSECRETSECRETSECRETSECRET!!")}
	for _, s := range []string{k.String(), fmt.Sprint(k), fmt.Sprintf("%v", k), fmt.Sprintf("%s", k)} {
		if strings.Contains(s, "SECRET") {
			t.Errorf("%q shows the secret", s)
		}
	}
}

func TestNewKeys(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	secret := bytes.Repeat([]byte("s"), MinSecretBytes)
	hmacKey := Key{ID: "partner-1", Alg: AlgHMACSHA256, Secret: secret}
	edKey := Key{ID: "mobile", Alg: AlgEd25519, PublicKey: pub}
	tests := []struct {
		name string
		keys []Key
		ok   bool
	}{
		{"an hmac and an ed25519 key", []Key{hmacKey, edKey}, true},
		{"no keys", nil, false},
		{"duplicate id", []Key{hmacKey, hmacKey}, false},
		{"short secret", []Key{{ID: "a", Alg: AlgHMACSHA256, Secret: secret[1:]}}, false},
		{"public key of the wrong size", []Key{{ID: "a", Alg: AlgEd25519, PublicKey: pub[1:]}}, false},
		{"unknown alg", []Key{{ID: "a", Alg: "rsa-v1_5-sha256", Secret: secret}}, false},
		{"id with a control character", []Key{{ID: "a\nb", Alg: AlgHMACSHA256, Secret: secret}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ks, err := NewKeys(tc.keys...)
			if tc.ok != (err == nil) {
				t.Fatalf("err = %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, ErrBadKeys) || strings.Contains(err.Error(), string(secret)) {
					t.Fatalf("err = %v: want ErrBadKeys and no key material", err)
				}
				return
			}
			if k, found := ks.Lookup("mobile"); !found || !k.PublicKey.Equal(pub) || ks.Len() != 2 {
				t.Fatalf("Lookup = %v, %v; Len = %d", k, found, ks.Len())
			}
		})
	}
}
