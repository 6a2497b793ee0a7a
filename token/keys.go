package token

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// MinKeyLen is the shortest signing key accepted, in bytes (RFC 7518
// §3.2 requires at least the hash size for HS256).
const MinKeyLen = 32

var kidPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// Key is one HS256 signing key and its key ID (the JWT header's kid).
type Key struct {
	ID     string
	Secret []byte
}

// String names the key without revealing its secret.
func (k Key) String() string { return "Key(" + k.ID + ")" }

// ParseKeys parses a comma-separated list of kid:base64key entries, as in
// REPLAYGUARD_SIGNING_KEYS. The base64 is standard, padding optional. It
// refuses keys shorter than MinKeyLen bytes, duplicate or malformed kids,
// and bad base64. Errors name entries by position, never by content, so
// a key written where its kid belongs cannot leak into a log.
func ParseKeys(spec string) ([]Key, error) {
	var keys []Key
	seen := map[string]bool{}
	for i, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		kid, b64, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("%w: entry %d is not kid:base64key", ErrBadKeys, i+1)
		}
		if !kidPattern.MatchString(kid) {
			return nil, fmt.Errorf("%w: entry %d: kid must match %s", ErrBadKeys, i+1, kidPattern)
		}
		if seen[kid] {
			return nil, fmt.Errorf("%w: entry %d repeats the kid of an earlier entry", ErrBadKeys, i+1)
		}
		seen[kid] = true
		secret, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(b64, "="))
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d: the key is not valid standard base64", ErrBadKeys, i+1)
		}
		if len(secret) < MinKeyLen {
			return nil, fmt.Errorf("%w: entry %d: the key is %d bytes, need at least %d", ErrBadKeys, i+1, len(secret), MinKeyLen)
		}
		keys = append(keys, Key{ID: kid, Secret: secret})
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrBadKeys)
	}
	return keys, nil
}

// GenerateKey returns a random 32-byte key with a random kid, from
// crypto/rand. Tokens signed with it do not survive a restart.
func GenerateKey() (Key, error) {
	b := make([]byte, MinKeyLen+4)
	if _, err := rand.Read(b); err != nil {
		return Key{}, fmt.Errorf("token: generating a key: %w", err)
	}
	return Key{ID: "ephemeral-" + hex.EncodeToString(b[MinKeyLen:]), Secret: b[:MinKeyLen]}, nil
}
