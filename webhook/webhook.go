package webhook

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/replayguard/replayguard/replay"
)

// Sentinel errors. Verify's refusals are the signature failures of
// package replay, so package problem answers them as it answers a refused
// RFC 9421 signature (401 signature_missing, signature_invalid and
// signature_expired, the last with server_time); compare with errors.Is
// against either name.
var (
	// ErrMissing: a header the scheme signs or keys on is absent or
	// blank (signature_missing). The same error as replay.ErrMissing.
	ErrMissing = replay.ErrMissing
	// ErrInvalid: a signature header that cannot be read, no signature
	// that a configured secret verifies over this body, or a timestamp
	// that is not a Unix time in seconds (signature_invalid). The same
	// error as replay.ErrInvalid.
	ErrInvalid = replay.ErrInvalid
	// ErrExpired: the signed timestamp lies outside the window, or before
	// WithNotBefore (signature_expired). The error is a
	// *replay.ExpiredError carrying the server's time. The same error as
	// replay.ErrExpired.
	ErrExpired = replay.ErrExpired
	// ErrNoID: a delivery that verified carries no usable ID to run it
	// once under: a Stripe body that is not a JSON object with a string
	// id, or an ID that is not 1 to MaxIDLength visible ASCII characters
	// (400 invalid_request).
	ErrNoID = errors.New("webhook: delivery has no usable id")
	// ErrSigner: a Signer was given an unusable secret, ID or time.
	ErrSigner = errors.New("webhook: cannot sign")
)

// Scheme is a provider's signature scheme.
type Scheme string

// The schemes a Verifier checks.
const (
	// Standard is Standard Webhooks v1 (also Svix): webhook-id,
	// webhook-timestamp and webhook-signature, "v1,<base64 HMAC-SHA256>"
	// with a whsec_ secret or "v1a,<base64 ed25519>" with a whpk_ public
	// key, over "id.timestamp.body". The key is webhook-id.
	Standard Scheme = "standard"
	// Stripe is Stripe's Stripe-Signature: "t=<time>,v1=<hex HMAC-SHA256
	// of t.body>", keyed with the whsec_ string itself. The key is the
	// event's id in the JSON body.
	Stripe Scheme = "stripe"
	// GitHub is GitHub's X-Hub-Signature-256: "sha256=<hex HMAC-SHA256 of
	// the body>". GitHub signs no time, so there is no window. The key is
	// X-GitHub-Delivery, which GitHub does not sign.
	GitHub Scheme = "github"
	// Slack is Slack's X-Slack-Signature: "v0=<hex HMAC-SHA256 of
	// v0:timestamp:body>" with X-Slack-Request-Timestamp. Slack signs
	// each retry anew, so the key comes from the body where it can: an
	// Events API event's event_id ("event_id=<id>"), a url_verification's
	// challenge ("challenge=<challenge>"); requests that carry no ID
	// (slash commands, interactivity) are keyed by the signature itself
	// ("v0=<hex>").
	Slack Scheme = "slack"
)

// Schemes lists every scheme, in the order the documentation gives them.
var Schemes = []Scheme{Standard, Stripe, GitHub, Slack}

// Limits and defaults.
const (
	// DefaultWindow is how far a signed timestamp may lie from the
	// server's time, on either side.
	DefaultWindow = 5 * time.Minute
	// MaxIDLength is the longest delivery ID accepted, in bytes.
	MaxIDLength = 255
	// maxSignatures bounds the signatures of one header Verify tries
	// (webhook-signature lists several, Stripe-Signature may repeat v1).
	maxSignatures = 16
)

// Headers of the schemes, in canonical form.
const (
	headerStandardID        = "Webhook-Id"
	headerStandardTimestamp = "Webhook-Timestamp"
	headerStandardSignature = "Webhook-Signature"
	headerSvixID            = "Svix-Id"
	headerSvixTimestamp     = "Svix-Timestamp"
	headerSvixSignature     = "Svix-Signature"
	headerStripeSignature   = "Stripe-Signature"
	headerGitHubSignature   = "X-Hub-Signature-256"
	headerGitHubDelivery    = "X-Github-Delivery"
	headerSlackSignature    = "X-Slack-Signature"
	headerSlackTimestamp    = "X-Slack-Request-Timestamp"
)

// Delivery is a verified webhook delivery.
type Delivery struct {
	// Scheme is the scheme that verified it.
	Scheme Scheme
	// ID is the key it runs once under: webhook-id (Standard), the
	// event's id (Stripe), X-GitHub-Delivery (GitHub). A Slack ID names
	// its kind before "=", so that keys of two kinds never collide:
	// "event_id=" and the body's event_id for an Events API event (the
	// same on every retry), "challenge=" and the challenge for a
	// url_verification, else "v0=" and the X-Slack-Signature in
	// lowercase hex (slash commands, interactivity, and a body that is
	// not a JSON object or whose ID is not 1 to MaxIDLength visible
	// ASCII characters with its prefix).
	ID string
	// Timestamp is the signed time, in UTC; the zero Time for GitHub,
	// which signs none.
	Timestamp time.Time
}

// Option configures a Verifier or a Signer. Each option's documentation
// says which it applies to; the other ignores it.
type Option func(*settings)

// settings are a Verifier's and a Signer's settings; each reads its own.
type settings struct {
	now       func() time.Time
	window    time.Duration
	notBefore time.Time
}

// newSettings applies opts over the defaults, which are set here and
// nowhere else.
func newSettings(opts []Option) settings {
	s := settings{now: time.Now, window: DefaultWindow}
	for _, o := range opts {
		o(&s)
	}
	return s
}

// WithWindow sets how far a Verifier lets a signed timestamp lie from
// the server's time, on either side (Standard, Stripe, Slack; GitHub
// signs no time). Defaults to DefaultWindow (5m, what every provider's
// own library uses); d <= 0 keeps the default.
func WithWindow(d time.Duration) Option {
	return func(s *settings) {
		if d > 0 {
			s.window = d
		}
	}
}

// WithClock replaces time.Now, for tests and test vectors: a Verifier
// checks the window with it, a Signer takes the timestamp of SignRequest
// from it. Defaults to time.Now.
func WithClock(now func() time.Time) Option {
	return func(s *settings) {
		if now != nil {
			s.now = now
		}
	}
}

// WithNotBefore makes a Verifier refuse, as expired, deliveries
// timestamped before t truncated to the second. Pass the process start
// when the records of deliveries are kept in a store that forgets them on
// restart, such as the memory store: a delivery seen before the restart
// could otherwise run again. GitHub deliveries carry no time and are not
// refused. Defaults to none.
func WithNotBefore(t time.Time) Option { return func(s *settings) { s.notBefore = t } }

// Verifier checks the deliveries of one scheme against one or more
// secrets (any one verifies, so a secret can be rotated without downtime).
// Create it with New; it is safe for concurrent use.
type Verifier struct {
	scheme     Scheme
	macKeys    [][]byte            // HMAC keys
	publicKeys []ed25519.PublicKey // Standard v1a
	settings
}

// New returns a Verifier for scheme that accepts a signature made with
// any one of secrets:
//
//   - Standard: "whsec_<base64>" (the prefix is optional, as in the
//     Standard Webhooks libraries) for v1 signatures, "whpk_<base64>" (an
//     ed25519 public key) for v1a; a "whsk_" signing key is refused, since
//     it belongs to the sender;
//   - Stripe: the endpoint's signing secret, "whsec_…", used as it is;
//   - GitHub: the webhook's secret;
//   - Slack: the app's signing secret.
//
// A secret that is empty, has leading or trailing white space or does
// not fit its scheme is an error that names it by position, never by
// value.
func New(scheme Scheme, secrets []string, opts ...Option) (*Verifier, error) {
	v := &Verifier{scheme: scheme, settings: newSettings(opts)}
	if !scheme.known() {
		return nil, fmt.Errorf("webhook: unknown scheme %q: want one of %s", clip(string(scheme)), schemeNames())
	}
	if len(secrets) == 0 {
		return nil, fmt.Errorf("webhook: %s: no secret", scheme)
	}
	for i, secret := range secrets {
		name := fmt.Sprintf("%s secret %d of %d", scheme, i+1, len(secrets))
		switch {
		case secret == "":
			return nil, fmt.Errorf("webhook: %s is empty", name)
		case strings.TrimSpace(secret) != secret:
			return nil, fmt.Errorf("webhook: %s has leading or trailing white space", name)
		}
		switch scheme {
		case Standard:
			switch {
			case strings.HasPrefix(secret, prefixPublic):
				key, err := decodeBase64(strings.TrimPrefix(secret, prefixPublic))
				if err != nil || len(key) != ed25519.PublicKeySize {
					return nil, fmt.Errorf("webhook: %s is not whpk_ and the base64 of a 32-byte ed25519 public key", name)
				}
				v.publicKeys = append(v.publicKeys, ed25519.PublicKey(key))
			case strings.HasPrefix(secret, prefixSigning):
				return nil, fmt.Errorf("webhook: %s is a whsk_ signing key, which only the sender may hold: configure its whpk_ public key", name)
			default:
				key, err := decodeBase64(strings.TrimPrefix(secret, prefixSecret))
				if err != nil || len(key) == 0 {
					return nil, fmt.Errorf("webhook: %s is not whsec_ and a base64 secret, or whpk_ and a base64 public key", name)
				}
				v.macKeys = append(v.macKeys, key)
			}
		case Stripe:
			if !strings.HasPrefix(secret, prefixSecret) {
				return nil, fmt.Errorf("webhook: %s does not start with whsec_: give the endpoint's signing secret, not an API key", name)
			}
			v.macKeys = append(v.macKeys, []byte(secret))
		default:
			v.macKeys = append(v.macKeys, []byte(secret))
		}
	}
	return v, nil
}

// Secret prefixes of Standard Webhooks.
const (
	prefixSecret  = "whsec_" // v1 (HMAC) secret; Stripe's secrets share it
	prefixPublic  = "whpk_"  // v1a (ed25519) public key
	prefixSigning = "whsk_"  // v1a signing key (its seed)
)

// ParseScheme returns the scheme named name: standard, stripe, github or
// slack.
func ParseScheme(name string) (Scheme, error) {
	if s := Scheme(name); s.known() {
		return s, nil
	}
	return "", fmt.Errorf("webhook: unknown scheme %q: want one of %s", clip(name), schemeNames())
}

func (s Scheme) known() bool {
	for _, k := range Schemes {
		if s == k {
			return true
		}
	}
	return false
}

func schemeNames() string {
	names := make([]string, len(Schemes))
	for i, s := range Schemes {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// Scheme returns the scheme v verifies.
func (v *Verifier) Scheme() Scheme { return v.scheme }

// Window returns how far a signed timestamp may lie from the server's
// time; 0 for GitHub, whose deliveries carry no time.
func (v *Verifier) Window() time.Duration {
	if v.scheme == GitHub {
		return 0
	}
	return v.window
}

// String describes v without its secrets.
func (v *Verifier) String() string {
	return fmt.Sprintf("webhook.Verifier(%s, %d secrets)", v.scheme, len(v.macKeys)+len(v.publicKeys))
}

// GoString is String, so that %#v does not print the secrets either.
func (v *Verifier) GoString() string { return v.String() }

// Check reports whether h carries every header v's scheme signs or keys
// on, without a body: an error wrapping ErrMissing names the first one
// absent. Verify makes the same check first; a caller that reads the body
// only for a delivery that may verify calls Check before reading it.
func (v *Verifier) Check(h http.Header) error {
	_, err := v.headers(h)
	return err
}

// Verify checks a delivery: its headers h and its body exactly as
// received, the bytes the provider signed. It returns the Delivery, or an
// error wrapping exactly one of ErrMissing, ErrInvalid, ErrExpired (as a
// *replay.ExpiredError) or ErrNoID. The checks, in order:
//
//   - a header the scheme signs or keys on absent or blank: ErrMissing;
//   - a signature header that cannot be read, a timestamp that is not a
//     Unix time in seconds, a Standard webhook-id containing "." (which
//     would make the signed content ambiguous), or no signature that a
//     secret verifies over the body: ErrInvalid. Signatures are compared
//     in constant time (hmac.Equal); Standard v1a ones are checked with
//     ed25519.Verify against every whpk_ key;
//   - |now − timestamp| over the window (now truncated to the second), or
//     a timestamp before WithNotBefore: ErrExpired;
//   - no ID to key the delivery on: ErrNoID.
//
// The window is measured with v's clock (WithClock), the server's. Verify
// never touches a store and never panics, whatever h and body hold.
func (v *Verifier) Verify(h http.Header, body []byte) (Delivery, error) {
	f, err := v.headers(h)
	if err != nil {
		return Delivery{}, err
	}
	switch v.scheme {
	case Standard:
		return v.verifyStandard(f, body)
	case Stripe:
		return v.verifyStripe(f, body)
	case GitHub:
		return v.verifyGitHub(f, body)
	case Slack:
		return v.verifySlack(f, body)
	}
	return Delivery{}, fmt.Errorf("%w: unknown scheme %q", ErrInvalid, clip(string(v.scheme)))
}

// fields are the header values a scheme reads, by role.
type fields struct {
	id, timestamp, signature string
	// names of the headers read, for messages.
	idName, timestampName, signatureName string
}

// headers finds the headers of v's scheme in h, or the ErrMissing of the
// first one absent.
func (v *Verifier) headers(h http.Header) (fields, error) {
	var f fields
	switch v.scheme {
	case Standard:
		// Svix sends svix-* headers; Standard Webhooks senders
		// webhook-*. One family is read whole, never a mix.
		f.idName, f.timestampName, f.signatureName = headerStandardID, headerStandardTimestamp, headerStandardSignature
		if !present(h, headerStandardID) && !present(h, headerStandardTimestamp) && !present(h, headerStandardSignature) &&
			(present(h, headerSvixID) || present(h, headerSvixTimestamp) || present(h, headerSvixSignature)) {
			f.idName, f.timestampName, f.signatureName = headerSvixID, headerSvixTimestamp, headerSvixSignature
		}
	case Stripe:
		f.signatureName = headerStripeSignature
	case GitHub:
		f.signatureName, f.idName = headerGitHubSignature, headerGitHubDelivery
	case Slack:
		f.signatureName, f.timestampName = headerSlackSignature, headerSlackTimestamp
	}
	for _, x := range []struct {
		name string
		dst  *string
	}{{f.idName, &f.id}, {f.timestampName, &f.timestamp}, {f.signatureName, &f.signature}} {
		if x.name == "" {
			continue
		}
		vals := headerValues(h, x.name)
		if len(vals) == 0 || blank(vals) {
			return fields{}, fmt.Errorf("%w: no %s header", ErrMissing, lower(x.name))
		}
		if len(vals) > 1 && x.dst != &f.signature {
			return fields{}, fmt.Errorf("%w: %d %s headers; send one", ErrInvalid, len(vals), lower(x.name))
		}
		*x.dst = strings.TrimSpace(strings.Join(vals, " "))
	}
	return f, nil
}

// lower is a header name as the providers' documentation writes it for
// Standard Webhooks (lowercase), else as given.
func lower(name string) string {
	switch name {
	case headerStandardID, headerStandardTimestamp, headerStandardSignature, headerSvixID, headerSvixTimestamp, headerSvixSignature:
		return strings.ToLower(name)
	case headerGitHubDelivery:
		return "X-GitHub-Delivery"
	}
	return name
}

// checkTime applies the window and WithNotBefore to ts, a signed Unix
// time in seconds.
func (v *Verifier) checkTime(ts int64) error {
	now := v.now()
	nowSec := now.Unix()
	expired := func(format string, args ...any) error {
		return &replay.ExpiredError{ServerTime: now.UTC(), Reason: replay.ErrExpired.Error() + ": " + fmt.Sprintf(format, args...)}
	}
	// ts is 0 or more and nowSec far from the int64 limits, so the
	// difference cannot overflow; the window is compared in whole
	// seconds, as the timestamps are.
	d, w := nowSec-ts, int64(v.window/time.Second)
	switch {
	case d > w:
		return expired("timestamped %ds before the server's time; the window is %s", d, v.window)
	case d < -w:
		return expired("timestamped %ds after the server's time; the window is %s", -d, v.window)
	case !v.notBefore.IsZero() && ts < v.notBefore.Unix():
		return expired("timestamped before %s, when this server started forgetting the deliveries it had run", v.notBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// parseTimestamp reads a signed timestamp: a Unix time in seconds, digits
// only and without leading zeros, so that one time has one spelling.
func parseTimestamp(name, s string) (int64, error) {
	bad := fmt.Errorf("%w: %s is not a Unix time in seconds", ErrInvalid, name)
	if s == "" || len(s) > 18 || (s[0] == '0' && s != "0") {
		return 0, bad
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, bad
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, bad
	}
	return n, nil
}

// checkID reports whether id can key a delivery: 1 to MaxIDLength bytes
// of visible ASCII.
func checkID(what, id string) error {
	if id == "" || len(id) > MaxIDLength {
		return fmt.Errorf("%w: %s must be 1 to %d characters, got %d", ErrNoID, what, MaxIDLength, len(id))
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] >= 0x7f {
			return fmt.Errorf("%w: %s must be visible ASCII", ErrNoID, what)
		}
	}
	return nil
}

// decodeBase64 reads standard base64, with or without padding.
func decodeBase64(s string) ([]byte, error) {
	if strings.HasSuffix(s, "=") {
		return base64.StdEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// present reports whether h has a non-blank name field.
func present(h http.Header, name string) bool {
	vals := headerValues(h, name)
	return len(vals) > 0 && !blank(vals)
}

// headerValues returns h's field lines for name (canonical), looking it
// up case-insensitively when h's keys are not canonical (headers built by
// hand rather than by net/http).
func headerValues(h http.Header, name string) []string {
	if vals := h[name]; len(vals) > 0 {
		return vals
	}
	var vals []string
	for k, vs := range h {
		if strings.EqualFold(k, name) {
			vals = append(vals, vs...)
		}
	}
	return vals
}

// blank reports whether vals holds no non-blank field line.
func blank(vals []string) bool {
	for _, v := range vals {
		if strings.TrimSpace(v) != "" {
			return false
		}
	}
	return true
}

// clip shortens s, a value from a request or a configuration, for an
// error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
