package replay

import (
	"errors"
	"sync/atomic"
)

// ErrBadKeys: the client keys file is malformed.
var ErrBadKeys = errors.New("replay: bad client keys")

// Keys is an immutable set of client keys.
type Keys struct {
	m map[string]Key
}

// ParseKeys parses a client keys file, exactly
// {"keys": [{"id", "alg", "secret" | "public_key", "label"?}, ...]}:
// secret is standard base64 (hmac-sha256, at least 32 bytes), public_key
// the base64 of the raw 32 bytes or a PEM block (ed25519). Errors never
// contain key material.
func ParseKeys(data []byte) (*Keys, error) {
	// TODO
	return nil, ErrBadKeys
}

// LoadKeys reads and parses the client keys file at path.
func LoadKeys(path string) (*Keys, error) {
	// TODO
	return nil, ErrBadKeys
}

// Lookup implements KeySource.
func (k *Keys) Lookup(id string) (Key, bool) {
	key, ok := k.m[id]
	return key, ok
}

// Len returns how many keys there are.
func (k *Keys) Len() int { return len(k.m) }

// KeyRing is a KeySource backed by a keys file that can be re-read while
// requests are verified (on SIGHUP, say): a reload swaps the whole set
// atomically, and a malformed file keeps the old keys.
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

// Reload re-reads the keys file. On error the keys in force stay.
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
