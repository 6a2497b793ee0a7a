package replay

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"github.com/replayguard/replayguard/internal/fileread"
)

// ErrBadKeys: the client keys file is malformed.
var ErrBadKeys = errors.New("replay: bad client keys")

// Limits on the client keys file.
const (
	// MaxKeysFileBytes bounds the size of a client keys file.
	MaxKeysFileBytes = 1 << 20
	// MinSecretBytes is the shortest hmac-sha256 secret accepted, in bytes
	// (RFC 9421 §3.3.3 leaves it to us; 32 is the SHA-256 output size).
	MinSecretBytes = 32
	// maxKeyIDLen bounds a key ID, in bytes.
	maxKeyIDLen = 256
)

// Keys is an immutable set of client keys. A nil *Keys holds none.
type Keys struct {
	m map[string]Key
}

// keysFile is the client keys file, exactly.
type keysFile struct {
	Keys *[]json.RawMessage `json:"keys"`
}

// keyEntry is one entry of the client keys file. Pointers tell an absent
// member from an empty one.
type keyEntry struct {
	ID        *string `json:"id"`
	Alg       *string `json:"alg"`
	Secret    *string `json:"secret"`
	PublicKey *string `json:"public_key"`
	Label     *string `json:"label"`
}

// ParseKeys parses a client keys file, exactly
// {"keys": [{"id", "alg", "secret" | "public_key", "label"?}, ...]}:
// secret is standard base64 (hmac-sha256, at least MinSecretBytes bytes),
// public_key the base64 of the raw 32 bytes or a PEM "PUBLIC KEY" block
// (PKIX, ed25519). Everything else is an error wrapping ErrBadKeys:
// unknown members, an unknown alg, a member that does not belong to the
// alg, a missing or duplicate id, an id that is not printable ASCII (it
// could never appear in Signature-Input), an empty list, trailing data.
// Errors name the entry by index and id and never contain key material.
func ParseKeys(data []byte) (*Keys, error) {
	if len(data) > MaxKeysFileBytes {
		return nil, fmt.Errorf("%w: the file is over %d bytes", ErrBadKeys, MaxKeysFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f keysFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadKeys, describeJSONError(err, "the file"))
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrBadKeys)
	}
	if f.Keys == nil {
		return nil, fmt.Errorf(`%w: no "keys" member`, ErrBadKeys)
	}
	if len(*f.Keys) == 0 {
		return nil, fmt.Errorf(`%w: "keys" is empty`, ErrBadKeys)
	}
	k := &Keys{m: make(map[string]Key, len(*f.Keys))}
	for i, raw := range *f.Keys {
		var e keyEntry
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("%w: keys[%d]: %s", ErrBadKeys, i, describeJSONError(err, "the entry"))
		}
		key, err := e.parse()
		if err != nil {
			who := fmt.Sprintf("keys[%d]", i)
			if e.ID != nil && printableID(*e.ID) {
				who += fmt.Sprintf(" (id %q)", *e.ID)
			}
			return nil, fmt.Errorf("%w: %s: %s", ErrBadKeys, who, err)
		}
		if _, dup := k.m[key.ID]; dup {
			return nil, fmt.Errorf("%w: keys[%d]: duplicate id %q", ErrBadKeys, i, key.ID)
		}
		k.m[key.ID] = key
	}
	return k, nil
}

// describeJSONError says what is wrong with a keys file without quoting
// it: encoding/json's messages can include a character of a secret.
// whole names the value decoded.
func describeJSONError(err error, whole string) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("not valid JSON (at byte %d)", syn.Offset)
	case errors.As(err, &typ):
		what := whole
		if typ.Field != "" {
			what = fmt.Sprintf("%q", typ.Field)
		}
		want := "another type"
		if typ.Type != nil {
			want = jsonKind(typ.Type.Kind().String())
		}
		return fmt.Sprintf("%s must be %s, not a JSON %s", what, want, typ.Value)
	case errors.Is(err, io.EOF):
		return "the file is empty"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends early"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// The field name is the file's, never a value.
		return "unknown member " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	}
	return "not a valid keys file"
}

// jsonKind names a Go kind the way the keys file's author thinks of it.
func jsonKind(k string) string {
	switch k {
	case "ptr", "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct":
		return "an object"
	}
	return k
}

// printableID reports whether id can be a keyid: 1 to 256 bytes of
// printable ASCII, the characters a structured-field string may hold.
func printableID(id string) bool {
	if id == "" || len(id) > maxKeyIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// parse checks one entry and returns its Key.
func (e keyEntry) parse() (Key, error) {
	if e.ID == nil || *e.ID == "" {
		return Key{}, errors.New(`"id" is missing`)
	}
	if !printableID(*e.ID) {
		return Key{}, fmt.Errorf(`"id" must be 1 to %d printable ASCII characters`, maxKeyIDLen)
	}
	key := Key{ID: *e.ID}
	if e.Label != nil {
		key.Label = *e.Label
	}
	if e.Alg == nil {
		return Key{}, errors.New(`"alg" is missing`)
	}
	key.Alg = *e.Alg
	switch key.Alg {
	case AlgHMACSHA256:
		if e.PublicKey != nil {
			return Key{}, errors.New(`"public_key" does not belong to an hmac-sha256 key`)
		}
		if e.Secret == nil || *e.Secret == "" {
			return Key{}, errors.New(`"secret" is missing`)
		}
		secret, err := base64.StdEncoding.DecodeString(*e.Secret)
		if err != nil {
			return Key{}, errors.New(`"secret" is not standard base64`)
		}
		if len(secret) < MinSecretBytes {
			return Key{}, fmt.Errorf(`"secret" is %d bytes; at least %d are required`, len(secret), MinSecretBytes)
		}
		key.Secret = secret
	case AlgEd25519:
		if e.Secret != nil {
			return Key{}, errors.New(`"secret" does not belong to an ed25519 key`)
		}
		if e.PublicKey == nil || *e.PublicKey == "" {
			return Key{}, errors.New(`"public_key" is missing`)
		}
		pub, err := parsePublicKey(*e.PublicKey)
		if err != nil {
			return Key{}, err
		}
		key.PublicKey = pub
	default:
		if printableID(key.Alg) && len(key.Alg) <= 32 {
			return Key{}, fmt.Errorf(`unknown "alg" %q (want %q or %q)`, key.Alg, AlgHMACSHA256, AlgEd25519)
		}
		return Key{}, fmt.Errorf(`unknown "alg" (want %q or %q)`, AlgHMACSHA256, AlgEd25519)
	}
	return key, nil
}

// parsePublicKey parses an Ed25519 public key: a PEM "PUBLIC KEY" block
// (PKIX) or the standard base64 of the raw 32 bytes.
func parsePublicKey(s string) (ed25519.PublicKey, error) {
	if s = strings.TrimSpace(s); strings.HasPrefix(s, "-----BEGIN") {
		block, rest := pem.Decode([]byte(s))
		if block == nil {
			return nil, errors.New(`"public_key" is not a valid PEM block`)
		}
		if len(bytes.TrimSpace(rest)) != 0 {
			return nil, errors.New(`"public_key" has data after its PEM block`)
		}
		if block.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf(`"public_key" is a PEM %q block; want "PUBLIC KEY"`, block.Type)
		}
		k, err := x509.ParsePKIXPublicKey(block.Bytes)
		if err != nil {
			return nil, errors.New(`"public_key" is not a valid PKIX public key`)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf(`"public_key" is a %T, not an Ed25519 key`, k)
		}
		return pub, nil
	}
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, errors.New(`"public_key" is neither PEM nor standard base64`)
	}
	if len(raw) != ed25519.PublicKeySize {
		return nil, fmt.Errorf(`"public_key" is %d bytes; an Ed25519 public key is %d`, len(raw), ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(raw), nil
}

// NewKeys returns a key set holding keys, for keys that come from
// somewhere other than a keys file (a secret manager, a test). It refuses,
// wrapping ErrBadKeys, what ParseKeys refuses: an id that is not 1 to 256
// printable ASCII characters, a duplicate id, an unknown alg, an HMAC
// secret under MinSecretBytes, an Ed25519 public key that is not 32 bytes.
func NewKeys(keys ...Key) (*Keys, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrBadKeys)
	}
	k := &Keys{m: make(map[string]Key, len(keys))}
	for i, key := range keys {
		if err := key.check(); err != nil {
			return nil, fmt.Errorf("%w: keys[%d]: %s", ErrBadKeys, i, err)
		}
		if _, dup := k.m[key.ID]; dup {
			return nil, fmt.Errorf("%w: keys[%d]: duplicate id %q", ErrBadKeys, i, key.ID)
		}
		k.m[key.ID] = key
	}
	return k, nil
}

// check reports what makes key unusable, naming no key material.
func (key Key) check() error {
	if !printableID(key.ID) {
		return fmt.Errorf("the id must be 1 to %d printable ASCII characters", maxKeyIDLen)
	}
	switch key.Alg {
	case AlgHMACSHA256:
		if len(key.Secret) < MinSecretBytes {
			return fmt.Errorf("the secret is %d bytes; at least %d are required", len(key.Secret), MinSecretBytes)
		}
	case AlgEd25519:
		if len(key.PublicKey) != ed25519.PublicKeySize {
			return fmt.Errorf("the public key is %d bytes, not %d", len(key.PublicKey), ed25519.PublicKeySize)
		}
	default:
		return fmt.Errorf("unknown alg (want %q or %q)", AlgHMACSHA256, AlgEd25519)
	}
	return nil
}

// LoadKeys reads and parses the client keys file at path (at most
// MaxKeysFileBytes; a larger file wraps ErrBadKeys, as ParseKeys's error
// does). Errors that are not about the file's contents (it cannot be
// opened, say) do not wrap ErrBadKeys.
func LoadKeys(path string) (*Keys, error) {
	data, err := fileread.AtMost(path, MaxKeysFileBytes)
	switch {
	case errors.Is(err, fileread.ErrTooLarge):
		return nil, fmt.Errorf("%w: %w", ErrBadKeys, err) // names the path and the limit
	case err != nil:
		return nil, fmt.Errorf("replay: client keys: %w", err)
	}
	k, err := ParseKeys(data)
	if err != nil {
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	return k, nil
}

// Lookup implements KeySource.
func (k *Keys) Lookup(id string) (Key, bool) {
	if k == nil {
		return Key{}, false
	}
	key, ok := k.m[id]
	return key, ok
}

// Len returns how many keys there are.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.m)
}

// KeyRing is a KeySource backed by a keys file that can be re-read while
// requests are verified (on SIGHUP, say): a reload swaps the whole set
// atomically, and a malformed file keeps the old keys. The zero KeyRing
// holds no keys.
type KeyRing struct {
	path string
	cur  atomic.Pointer[Keys]
}

// NewKeyRing loads the keys file at path; a malformed file is an error.
func NewKeyRing(path string) (*KeyRing, error) {
	r := &KeyRing{path: path}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload re-reads the keys file. On error the keys in force stay; the
// error says why (never with key material) for the caller to log.
func (r *KeyRing) Reload() error {
	k, err := LoadKeys(r.path)
	if err != nil {
		return err
	}
	r.cur.Store(k)
	return nil
}

// Lookup implements KeySource.
func (r *KeyRing) Lookup(id string) (Key, bool) { return r.cur.Load().Lookup(id) }

// Len returns how many keys are in force.
func (r *KeyRing) Len() int { return r.cur.Load().Len() }
