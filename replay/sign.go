package replay

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/dunglas/httpsfv"
)

// ErrSigner: a Signer was given an unusable key, key ID, algorithm,
// label or parameter, or could not sign a request (a covered component
// it lacks, a body that could not be read, randomness that failed).
var ErrSigner = errors.New("replay: cannot sign")

// defaultLabel is the label a Signer gives its signature in
// Signature-Input and Signature.
const defaultLabel = "sig1"

// defaultParams are the signature parameters a Signer writes, in this
// order; "expires" only with WithExpiry.
var defaultParams = []string{"created", "expires", "nonce", "keyid", "alg"}

// Signer signs outgoing requests with RFC 9421 HTTP Message Signatures so
// that a Replayguard Verifier accepts them: created now, a random nonce,
// keyid and alg, covering @method, @authority, @path and @query and, when
// the request has a body, content-digest (RFC 9530, sha-256), whose
// Content-Digest field it computes. Create one with NewSigner; it is safe
// for concurrent use. Transport signs every request an http.Client sends.
type Signer struct {
	keyID   string
	alg     string
	secret  []byte
	private ed25519.PrivateKey
	*settings
}

// WithNonceFunc replaces a Signer's nonce source. Defaults to 16 bytes from
// crypto/rand, base64url without padding (recommended). Every request
// needs its own nonce: a fixed one is only for tests, since the server
// accepts each key ID and nonce once.
func WithNonceFunc(nonce func() (string, error)) Option {
	return func(s *settings) {
		if nonce != nil {
			s.nonce = nonce
		}
	}
}

// WithComponents sets the components a Signer covers, in order, replacing the
// default: DefaultRequired, plus content-digest when the request has a
// body. Lowercase field names and the derived components SignatureBase
// supports may be listed. Covering content-digest makes the Signer set
// the Content-Digest field from the body.
func WithComponents(components ...string) Option {
	return func(s *settings) { s.components = append([]string(nil), components...) }
}

// WithParams sets which signature parameters a Signer writes, in order, from
// "created", "expires", "nonce", "keyid" and "alg". Defaults to all of
// them, in that order ("expires" only with WithExpiry). Leaving out nonce
// or created makes a signature that Replayguard's Verifier refuses: that
// is for reproducing test vectors.
func WithParams(params ...string) Option {
	return func(s *settings) { s.params = append([]string(nil), params...) }
}

// WithLabel sets the label of a Signer's signature (an RFC 8941 key).
// Defaults to "sig1".
func WithLabel(label string) Option { return func(s *settings) { s.label = label } }

// WithExpiry makes a Signer add the expires parameter, created + d. Defaults to none
// (the server's window bounds a signature's life anyway); d <= 0 keeps
// the default.
func WithExpiry(d time.Duration) Option {
	return func(s *settings) {
		if d > 0 {
			s.expiry = d
		}
	}
}

// NewSigner returns a Signer for the client key keyID with algorithm alg:
// AlgHMACSHA256 with the shared secret as key ([]byte), or AlgEd25519
// with an ed25519.PrivateKey. The secret is copied.
func NewSigner(keyID, alg string, key any, opts ...Option) (*Signer, error) {
	s := &Signer{keyID: keyID, alg: alg, settings: newSettings(opts)}
	if keyID == "" || !printableASCII(keyID) {
		return nil, fmt.Errorf("%w: the key ID must be printable ASCII and not empty", ErrSigner)
	}
	switch alg {
	case AlgHMACSHA256:
		secret, ok := key.([]byte)
		if !ok || len(secret) == 0 {
			return nil, fmt.Errorf("%w: %s needs the shared secret as a non-empty []byte, not %T", ErrSigner, alg, key)
		}
		s.secret = bytes.Clone(secret)
	case AlgEd25519:
		priv, ok := key.(ed25519.PrivateKey)
		if !ok || len(priv) != ed25519.PrivateKeySize {
			return nil, fmt.Errorf("%w: %s needs an ed25519.PrivateKey, not %T", ErrSigner, alg, key)
		}
		s.private = priv
	default:
		return nil, fmt.Errorf("%w: algorithm %q is not %s or %s", ErrSigner, alg, AlgHMACSHA256, AlgEd25519)
	}
	if !validKey(s.label) {
		return nil, fmt.Errorf("%w: label %q is not a structured-field key", ErrSigner, s.label)
	}
	for _, p := range s.params {
		switch p {
		case "created", "expires", "nonce", "keyid", "alg":
		default:
			return nil, fmt.Errorf("%w: unknown signature parameter %q", ErrSigner, p)
		}
	}
	return s, nil
}

// validKey reports whether k is an RFC 8941 key: lcalpha or "*", then
// lcalpha, digits, "_", "-", "." or "*".
func validKey(k string) bool {
	if k == "" || !(k[0] >= 'a' && k[0] <= 'z' || k[0] == '*') {
		return false
	}
	for i := 1; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*') {
			return false
		}
	}
	return true
}

// printableASCII reports whether s is all printable ASCII (what an
// RFC 8941 string may hold).
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// randomNonce returns 16 bytes from crypto/rand, base64url without
// padding (22 characters).
func randomNonce() (string, error) {
	b := make([]byte, 16)
	if _, err := io.ReadFull(rand.Reader, b); err != nil {
		return "", fmt.Errorf("%w: no randomness for the nonce: %w", ErrSigner, err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// Sign signs req in place: it sets Signature-Input and Signature
// (replacing any already there) and, when content-digest is covered,
// Content-Digest. It reads the body to digest it: through req.GetBody
// when set, leaving req.Body unread; otherwise it reads req.Body and puts
// back an in-memory copy (with GetBody and ContentLength). The whole body
// is held in memory. It signs the request as net/http sends it: the
// authority is req.Host when set, else req.URL.Host (which must be ASCII:
// use the punycode form of an internationalised name), and the path is
// req.URL.EscapedPath(). req.URL must be absolute, as for any client
// request.
func (s *Signer) Sign(req *http.Request) error {
	if s == nil || (s.secret == nil && s.private == nil) {
		return fmt.Errorf("%w: no key (create Signers with NewSigner)", ErrSigner)
	}
	if req == nil || req.URL == nil {
		return fmt.Errorf("%w: no request URL", ErrSigner)
	}
	if req.URL.Opaque != "" {
		return fmt.Errorf("%w: opaque request URLs are not supported", ErrSigner)
	}
	// Sign the target as net/http sends it: the escaped path, and the
	// authority from req.Host or req.URL.Host.
	u := *req.URL
	u.RawPath = req.URL.EscapedPath()
	if req.Host != "" {
		u.Host = req.Host
	}
	if !printableASCII(u.Host) {
		// net/http would send its punycode form, which we cannot compute
		// without x/net/idna.
		return fmt.Errorf("%w: the host %q is not ASCII: use its punycode (xn--) form", ErrSigner, u.Host)
	}
	body, err := readBody(req)
	if err != nil {
		return err
	}
	components := s.components
	if components == nil {
		components = DefaultRequired
		if len(body) > 0 {
			components = append(append([]string(nil), DefaultRequired...), compContentDigest)
		}
	}
	m := Message{Method: req.Method, URL: &u, Header: req.Header.Clone(), Body: body}
	if m.Method == "" {
		m.Method = http.MethodGet
	}
	if m.Header == nil {
		m.Header = http.Header{}
	}
	digest := ""
	items := make([]httpsfv.Item, len(components))
	for i, c := range components {
		items[i] = httpsfv.Item{Value: c, Params: httpsfv.NewParams()}
		switch c {
		case compContentDigest:
			digest = ContentDigest(body)
			m.Header.Set("Content-Digest", digest)
		case "content-length":
			// net/http sends the body's length, never Header's
			// Content-Length, and 0 for POST, PUT and PATCH without one.
			switch {
			case len(body) > 0:
				m.Header.Set("Content-Length", strconv.Itoa(len(body)))
			case m.Method == http.MethodPost || m.Method == http.MethodPut || m.Method == http.MethodPatch:
				m.Header.Set("Content-Length", "0")
			default:
				m.Header.Del("Content-Length")
			}
		case "host":
			// Likewise it sends req.Host or req.URL.Host, never Header's Host.
			m.Header.Set("Host", u.Host)
		}
	}
	params, err := s.signatureParams()
	if err != nil {
		return err
	}
	input := httpsfv.InnerList{Items: items, Params: params}
	base, err := SignatureBase(m, s.label, input)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSigner, err)
	}
	sig, err := s.sign([]byte(base))
	if err != nil {
		return err
	}
	inputField := httpsfv.NewDictionary()
	inputField.Add(s.label, input)
	sigInput, err := httpsfv.Marshal(inputField)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSigner, err)
	}
	sigDict := httpsfv.NewDictionary()
	sigDict.Add(s.label, httpsfv.Item{Value: sig, Params: httpsfv.NewParams()})
	sigField, err := httpsfv.Marshal(sigDict)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSigner, err)
	}
	if req.Header == nil {
		req.Header = http.Header{}
	}
	if digest != "" {
		req.Header.Set("Content-Digest", digest)
	}
	req.Header.Set("Signature-Input", sigInput)
	req.Header.Set("Signature", sigField)
	return nil
}

// signatureParams returns the signature parameters for one signature.
func (s *Signer) signatureParams() (*httpsfv.Params, error) {
	created := s.now().Unix()
	p := httpsfv.NewParams()
	for _, name := range s.params {
		switch name {
		case "created":
			p.Add("created", created)
		case "expires":
			if s.expiry > 0 {
				p.Add("expires", created+int64(s.expiry/time.Second))
			}
		case "nonce":
			n, err := s.nonce()
			if err != nil {
				return nil, fmt.Errorf("%w: nonce: %w", ErrSigner, err)
			}
			if n == "" || len(n) > MaxNonceLen || !printableASCII(n) {
				return nil, fmt.Errorf("%w: the nonce must be 1 to %d printable ASCII bytes", ErrSigner, MaxNonceLen)
			}
			p.Add("nonce", n)
		case "keyid":
			p.Add("keyid", s.keyID)
		case "alg":
			p.Add("alg", s.alg)
		}
	}
	return p, nil
}

// sign returns the signature of base with the Signer's key.
func (s *Signer) sign(base []byte) ([]byte, error) {
	switch s.alg {
	case AlgHMACSHA256:
		mac := hmac.New(sha256.New, s.secret)
		mac.Write(base)
		return mac.Sum(nil), nil
	case AlgEd25519:
		sig, err := s.private.Sign(nil, base, crypto.Hash(0))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSigner, err)
		}
		return sig, nil
	}
	return nil, fmt.Errorf("%w: no key (create Signers with NewSigner)", ErrSigner)
}

// readBody returns req's body, leaving req able to send it: through
// GetBody when there is one, else by reading req.Body and putting back an
// in-memory copy. nil when there is no body.
func readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	if req.GetBody != nil {
		rc, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("%w: GetBody: %w", ErrSigner, err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("%w: reading the body: %w", ErrSigner, err)
		}
		if req.ContentLength <= 0 && len(b) > 0 {
			req.ContentLength = int64(len(b))
		}
		return b, nil
	}
	b, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: reading the body: %w", ErrSigner, err)
	}
	req.Body = io.NopCloser(bytes.NewReader(b))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	req.ContentLength = int64(len(b))
	if len(b) == 0 {
		req.Body, req.GetBody = http.NoBody, nil
	}
	return b, nil
}

// Transport is an http.RoundTripper that signs every request with Signer
// before Base sends it: each request gets a fresh created time and nonce,
// so a retry is a new signature. It signs a clone and leaves the caller's
// request unchanged (its body is consumed, as any RoundTripper's).
//
//	client := &http.Client{Transport: &replay.Transport{Signer: signer}}
type Transport struct {
	// Signer signs the requests; required.
	Signer *Signer
	// Base sends the signed requests. Defaults to http.DefaultTransport.
	Base http.RoundTripper
}

var _ http.RoundTripper = (*Transport)(nil)

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Signer == nil {
		closeBody(req)
		return nil, fmt.Errorf("%w: Transport has no Signer", ErrSigner)
	}
	r := req.Clone(req.Context())
	if err := t.Signer.Sign(r); err != nil {
		closeBody(req)
		return nil, err
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// closeBody closes req's body, as a RoundTripper must even on errors.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}
