package webhook

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signer signs outgoing Standard Webhooks deliveries, for services that
// send webhooks: the webhook-signature a receiver's Verifier (or any
// Standard Webhooks library) accepts. Create it with NewSigner; it is safe
// for concurrent use.
type Signer struct {
	macKeys     [][]byte
	privateKeys []ed25519.PrivateKey
	settings
}

// NewSigner returns a Signer that signs with every one of secrets, one
// signature each: "whsec_<base64>" (the prefix is optional) for a v1
// HMAC-SHA256 signature, "whsk_<base64>" (an ed25519 seed) for a v1a one.
// Several secrets sign a delivery several times, which is how a sender
// rotates a secret without downtime: sign with the old and the new one
// until every receiver has the new one. Errors name a secret by position,
// never by value.
func NewSigner(secrets []string, opts ...Option) (*Signer, error) {
	s := &Signer{settings: newSettings(opts)}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("%w: no secret", ErrSigner)
	}
	for i, secret := range secrets {
		name := fmt.Sprintf("secret %d of %d", i+1, len(secrets))
		if strings.HasPrefix(secret, prefixSigning) {
			seed, err := decodeBase64(strings.TrimPrefix(secret, prefixSigning))
			if err != nil || len(seed) != ed25519.SeedSize {
				return nil, fmt.Errorf("%w: %s is not whsk_ and the base64 of a 32-byte ed25519 seed", ErrSigner, name)
			}
			s.privateKeys = append(s.privateKeys, ed25519.NewKeyFromSeed(seed))
			continue
		}
		if strings.HasPrefix(secret, prefixPublic) {
			return nil, fmt.Errorf("%w: %s is a whpk_ public key, which cannot sign: give its whsk_ signing key", ErrSigner, name)
		}
		key, err := decodeBase64(strings.TrimPrefix(secret, prefixSecret))
		if err != nil || len(key) == 0 {
			return nil, fmt.Errorf("%w: %s is not whsec_ and a base64 secret, or whsk_ and a base64 seed", ErrSigner, name)
		}
		s.macKeys = append(s.macKeys, key)
	}
	return s, nil
}

// Sign returns the webhook-signature value for the delivery id sent at
// timestamp (whole seconds) with body: one "v1,<base64>" or
// "v1a,<base64>" per secret, space separated. The id must be 1 to
// MaxIDLength visible ASCII characters without ".", and the body the
// bytes that will be sent.
func (s *Signer) Sign(id string, timestamp time.Time, body []byte) (string, error) {
	if err := checkID("the id", id); err != nil || strings.Contains(id, ".") {
		return "", fmt.Errorf("%w: the id must be 1 to %d visible ASCII characters without \".\"", ErrSigner, MaxIDLength)
	}
	ts := timestamp.Unix()
	if ts < 0 {
		return "", fmt.Errorf("%w: the timestamp is before 1970", ErrSigner)
	}
	signed := standardContent(id, ts, body)
	parts := make([]string, 0, len(s.macKeys)+len(s.privateKeys))
	for _, mac := range hmacs(s.macKeys, signed) {
		parts = append(parts, "v1,"+base64.StdEncoding.EncodeToString(mac))
	}
	for _, k := range s.privateKeys {
		parts = append(parts, "v1a,"+base64.StdEncoding.EncodeToString(ed25519.Sign(k, signed)))
	}
	return strings.Join(parts, " "), nil
}

// SignRequest signs r, a delivery with the ID id, now (the Signer's
// clock): it sets webhook-id, webhook-timestamp and webhook-signature. A
// redelivery keeps its id and is signed again, with a new timestamp. The
// body is read with r.GetBody (as http.NewRequest sets it for a
// bytes.Reader, bytes.Buffer or strings.Reader), else from r.Body, which
// is then replaced by a copy.
func (s *Signer) SignRequest(r *http.Request, id string) error {
	body, err := requestBody(r)
	if err != nil {
		return err
	}
	now := s.now()
	sig, err := s.Sign(id, now, body)
	if err != nil {
		return err
	}
	r.Header.Set(headerStandardID, id)
	r.Header.Set(headerStandardTimestamp, strconv.FormatInt(now.Unix(), 10))
	r.Header.Set(headerStandardSignature, sig)
	return nil
}

// requestBody returns r's body, leaving r able to send it.
func requestBody(r *http.Request) ([]byte, error) {
	switch {
	case r.Body == nil || r.Body == http.NoBody:
		return nil, nil
	case r.GetBody != nil:
		rc, err := r.GetBody()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSigner, err)
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	body, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: reading the body: %w", ErrSigner, err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return body, nil
}

// String describes s without its secrets.
func (s *Signer) String() string {
	return fmt.Sprintf("webhook.Signer(%d secrets)", len(s.macKeys)+len(s.privateKeys))
}

// GoString is String, so that %#v does not print the secrets either.
func (s *Signer) GoString() string { return s.String() }

// GenerateSecret returns a new v1 secret, "whsec_" and the base64 of 32
// random bytes (Standard Webhooks asks for 24 to 64), for a sender to
// give a receiver.
func GenerateSecret() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("%w: no randomness: %w", ErrSigner, err)
	}
	return prefixSecret + base64.StdEncoding.EncodeToString(b), nil
}

// GenerateKey returns a new v1a key pair: the sender keeps signing
// ("whsk_" and the base64 of an ed25519 seed) and gives receivers public
// ("whpk_" and the base64 of the public key).
func GenerateKey() (signing, public string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("%w: no randomness: %w", ErrSigner, err)
	}
	return prefixSigning + base64.StdEncoding.EncodeToString(priv.Seed()),
		prefixPublic + base64.StdEncoding.EncodeToString(pub), nil
}

// NewID returns a new delivery ID: "msg_" and 22 random base64url
// characters (128 bits). A redelivery must keep the ID of the delivery it
// repeats, so that receivers run it once.
func NewID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("%w: no randomness: %w", ErrSigner, err)
	}
	return "msg_" + base64.RawURLEncoding.EncodeToString(b), nil
}
