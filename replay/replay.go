package replay

import (
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/replayguard/replayguard/store"
)

// Sentinel errors. package problem maps each to a 401 problem code in its
// one table. A nonce the store could not record is reported with the
// store's own error, which wraps store.ErrUnavailable (503
// store_unavailable) or is store.ErrFull.
var (
	// ErrMissing: the request has no Signature-Input or Signature header
	// (signature_missing).
	ErrMissing = errors.New("replay: signature missing")
	// ErrInvalid: bad syntax, unknown key, wrong algorithm, wrong
	// signature, a required component or parameter missing, a nonce over
	// MaxNonceLen bytes, or a content digest that does not match the body
	// (signature_invalid).
	ErrInvalid = errors.New("replay: signature invalid")
	// ErrExpired: created (or expires) is outside the window
	// (signature_expired). The error wraps an *ExpiredError carrying the
	// server's time.
	ErrExpired = errors.New("replay: signature expired")
	// ErrReplayed: this key ID and nonce were seen before
	// (replayed_request).
	ErrReplayed = errors.New("replay: replayed request")
)

// ExpiredError is the detail of ErrExpired: the server's clock reading,
// so clients can see their skew.
type ExpiredError struct {
	ServerTime time.Time
	Reason     string
}

func (e *ExpiredError) Error() string { return e.Reason }

// Unwrap makes errors.Is(err, ErrExpired) true.
func (e *ExpiredError) Unwrap() error { return ErrExpired }

// Algorithms a client key may have (RFC 9421 §6.2.2).
const (
	AlgHMACSHA256 = "hmac-sha256"
	AlgEd25519    = "ed25519"
)

// Limits and defaults.
const (
	// DefaultWindow is how far created may lie from now, either side.
	DefaultWindow = 5 * time.Minute
	// MaxNonceLen is the longest nonce accepted, in bytes.
	MaxNonceLen = 128
)

// DefaultRequired are the components every signature must cover, besides
// content-digest whenever the request has a body. "@query" may be
// replaced by "@target-uri", which covers it.
var DefaultRequired = []string{"@method", "@authority", "@path", "@query"}

// Key is one client key from the client keys file.
type Key struct {
	// ID is the keyid clients sign with.
	ID string
	// Alg is AlgHMACSHA256 or AlgEd25519; only it is ever used for ID.
	Alg string
	// Secret is the shared HMAC secret (hmac-sha256).
	Secret []byte
	// PublicKey is the client's Ed25519 public key (ed25519).
	PublicKey ed25519.PublicKey
	// Label is a free-form description; optional.
	Label string
}

// String names the key without its secret.
func (k Key) String() string { return "Key(" + k.ID + ", " + k.Alg + ")" }

// Message is the request a signature is checked against: the server's
// view of it.
type Message struct {
	// Method is the request method, e.g. "POST".
	Method string
	// URL is the full target URI; URL.Host is the authority and
	// URL.Scheme the scheme (both needed for @authority, @scheme and
	// @target-uri). A server fills them in: an incoming request's URL
	// has neither.
	URL *url.URL
	// Header holds the request's headers (Signature-Input and Signature
	// among them).
	Header http.Header
	// Body is the body actually received; nil when there is none.
	Body []byte
}

// Result describes a verified signature.
type Result struct {
	// KeyID is the signature's keyid.
	KeyID string
	// Label is the key's label from the keys file.
	Label string
	// Created is the signature's created parameter, in UTC (the policy
	// requires it; only this package's tests skip the policy).
	Created time.Time
	// Nonce is the signature's nonce parameter.
	Nonce string
	// Name is the signature's label in Signature-Input (e.g. "sig1").
	Name string
}

// KeySource finds client keys by ID. A *Keys is one; so is a *KeyRing,
// which can be reloaded while requests are verified.
type KeySource interface {
	Lookup(id string) (Key, bool)
}

// Verifier checks signed requests. Create it with NewVerifier.
type Verifier struct {
	keys  KeySource
	store store.Store
	macs  *macCache
	*settings
}

// Option configures a Verifier or a Signer. Each option's documentation
// says which it applies to; the other ignores it.
type Option func(*settings)

// settings are a Verifier's and a Signer's settings; each reads its own.
type settings struct {
	now func() time.Time

	// Verifier
	window    time.Duration
	notBefore time.Time
	required  []string
	unsafe    bool // skip the policy: the tests' UnsafeSkipPolicyForTests

	// Signer
	nonce      func() (string, error)
	components []string
	params     []string
	label      string
	expiry     time.Duration
}

// newSettings applies opts over the defaults, which are set here and
// nowhere else.
func newSettings(opts []Option) *settings {
	s := &settings{
		now:    time.Now,
		window: DefaultWindow,
		nonce:  randomNonce,
		params: append([]string(nil), defaultParams...),
		label:  defaultLabel,
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// WithWindow sets how far a Verifier lets created lie from now, on either
// side; each nonce is kept in the store for as long as the window could
// still accept its signature (see Verify). Defaults to DefaultWindow (5m);
// d <= 0 keeps the default.
func WithWindow(d time.Duration) Option {
	return func(s *settings) {
		if d > 0 {
			s.window = d
		}
	}
}

// WithClock replaces time.Now, for tests and test vectors. A Verifier
// checks the window with this clock (how long a nonce is kept is a
// duration the store measures with its own, so the two never have to
// agree); a Signer takes created from it, and the client's clock must lie
// within the server's window of the server's. Defaults to time.Now.
func WithClock(now func() time.Time) Option {
	return func(s *settings) {
		if now != nil {
			s.now = now
		}
	}
}

// WithNotBefore makes a Verifier refuse, as expired, signatures created before t
// truncated to the second. Pass the process start with a store that
// forgets its nonces on restart, such as the memory store: a signature
// made before the restart could otherwise be replayed. Defaults to none.
func WithNotBefore(t time.Time) Option { return func(s *settings) { s.notBefore = t } }

// WithRequired adds components every signature a Verifier accepts must cover, beyond
// DefaultRequired: field names (any case, for example "Authorization")
// or derived components. Defaults to none.
func WithRequired(components ...string) Option {
	return func(s *settings) {
		for _, c := range components {
			s.required = append(s.required, strings.ToLower(c))
		}
	}
}

// NewVerifier returns a Verifier that finds keys in keys and records
// nonces in st.
func NewVerifier(keys KeySource, st store.Store, opts ...Option) *Verifier {
	return &Verifier{keys: keys, store: st, macs: new(macCache), settings: newSettings(opts)}
}

// Verify checks m's signature and, when it is good, records its nonce.
// The window is measured with the Verifier's clock (WithClock), that is
// the server's.
// It returns the Result, or an error wrapping exactly one of ErrMissing,
// ErrInvalid, ErrExpired (as an *ExpiredError), ErrReplayed,
// store.ErrUnavailable or store.ErrFull. It never panics, whatever m
// holds.
//
// Which signature: Signature-Input may list several (an intermediary can
// add its own). Verify checks exactly one, the first member of
// Signature-Input, in field order, whose keyid names a key of the
// KeySource, and ignores the others; when no member does, the request is
// ErrInvalid (unknown key). Signature-Input, Signature or Content-Digest
// over 8 KiB is ErrInvalid.
//
// The checks, in order:
//   - Signature-Input or Signature absent (or blank): ErrMissing;
//   - either not a structured-field dictionary, no member with a known
//     keyid, a parameter of the wrong type, an alg parameter other than
//     the key's algorithm (RFC 9421 §3.2), created or nonce missing, a
//     nonce over MaxNonceLen bytes, a required component not covered
//     (DefaultRequired, WithRequired, and content-digest when m.Body is
//     not empty), a covered Content-Digest that matches no sha-256 or
//     sha-512 digest of m.Body, a covered component m lacks or that is
//     not supported (see SignatureBase), a wrong signature: ErrInvalid;
//   - |now − created| over the window (now truncated to the second),
//     expires at or before now, or created before WithNotBefore:
//     ErrExpired;
//   - the nonce already recorded for this key ID: ErrReplayed; the
//     store failing: its error, wrapping store.ErrUnavailable.
//
// The nonce is recorded only after every other check passed, so a
// forgery cannot burn a real client's nonce. It is kept for created +
// window + 1s − now: until the last moment the window check could accept
// the signature again (created + window, checked against now truncated to
// the second, so up to a second more). That is a duration, which the store
// counts on its own clock from the moment it records the nonce: a store
// whose clock is ahead of this server's, or behind it, keeps the nonce
// exactly as long. Servers that share a store must still agree with each
// other within the window's margin (use NTP): one whose clock is behind
// the others' accepts a signature later than they do.
func (v *Verifier) Verify(ctx context.Context, m Message) (Result, error) {
	inputVals := headerValues(m.Header, "Signature-Input")
	sigVals := headerValues(m.Header, "Signature")
	if blank(inputVals) || blank(sigVals) {
		return Result{}, ErrMissing
	}
	if fieldLen(inputVals) > maxFieldBytes || fieldLen(sigVals) > maxFieldBytes {
		return Result{}, invalid("Signature-Input or Signature is over %d bytes", maxFieldBytes)
	}
	sc := scratches.Get().(*scratch)
	res, p, key, err := v.check(m, inputVals, sigVals, sc)
	sc.release()
	if err != nil {
		return Result{}, err
	}
	if v.unsafe {
		return res, nil
	}

	now := v.now()
	if err := v.checkWindow(now, p); err != nil {
		return Result{}, err
	}
	if v.store == nil {
		return Result{}, fmt.Errorf("%w: no nonce store", store.ErrUnavailable)
	}
	// Past the window's far edge by this clock, on the store's clock.
	keep := res.Created.Add(v.window + time.Second).Sub(now)
	fresh, err := v.store.Put(ctx, store.NonceKey(key.ID, p.nonce), store.Token{}, keep)
	if err != nil {
		return Result{}, err
	}
	if !fresh {
		return Result{}, ErrReplayed
	}
	return res, nil
}

// check is Verify up to the window: it parses the two fields, chooses
// the signature, applies the policy's syntactic part and checks the
// content digest and the signature, working in sc. Nothing it returns
// points into sc.
func (v *Verifier) check(m Message, inputVals, sigVals []string, sc *scratch) (Result, sigParams, Key, error) {
	fail := func(err error) (Result, sigParams, Key, error) { return Result{}, sigParams{}, Key{}, err }
	inputs, ok := parseInputFast(fieldOf(inputVals), sc.members[:0], sc.comps[:0], sc.params[:0])
	if !ok {
		d, err := httpsfv.UnmarshalDictionary(inputVals)
		if err != nil {
			return fail(invalid("Signature-Input is not a structured-field dictionary"))
		}
		inputs = inputsOf(d)
	}
	sc.inputs = inputs
	sigLabel, sig, ok := parseSignatureFast(fieldOf(sigVals), &sc.b64, sc.sig[:])
	var sigs *httpsfv.Dictionary
	if !ok {
		var err error
		if sigs, err = httpsfv.UnmarshalDictionary(sigVals); err != nil {
			return fail(invalid("Signature is not a structured-field dictionary"))
		}
	}

	input, key, err := v.choose(inputs)
	if err != nil {
		return fail(err)
	}
	name := input.label
	p, err := parseSigParams(input.params)
	if err != nil {
		return fail(invalid("%s: %v", name, err))
	}
	if p.hasAlg && p.alg != key.Alg {
		return fail(invalid("%s: alg %q is not the algorithm of key %q", name, clip(p.alg), clip(key.ID)))
	}
	if !v.unsafe {
		if !p.hasCreated {
			return fail(invalid("%s: no created parameter", name))
		}
		if !p.hasNonce {
			return fail(invalid("%s: no nonce parameter", name))
		}
	}
	if sigs != nil {
		if sig, err = signatureOf(sigs, name); err != nil {
			return fail(err)
		}
	} else if sigLabel != name {
		return fail(invalid("Signature has no member %s", name))
	}

	if !v.unsafe {
		for _, r := range DefaultRequired {
			if !covers(input.comps, r) {
				return fail(invalid("%s does not cover %s", name, r))
			}
		}
		for _, r := range v.required {
			if !covers(input.comps, r) {
				return fail(invalid("%s does not cover %s", name, clip(r)))
			}
		}
		if len(m.Body) > 0 && !covered(input.comps, compContentDigest) {
			return fail(invalid("%s does not cover content-digest and the request has a body", name))
		}
	}
	if covered(input.comps, compContentDigest) {
		if err := checkContentDigest(headerValues(m.Header, "Content-Digest"), m.Body, sc); err != nil {
			return fail(invalid("%v", err))
		}
	}

	base, err := appendBase(sc.base[:0], m, input)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrInvalid, err))
	}
	sc.base = base
	if err := v.checkSignature(key, base, sig, sc.mac[:0]); err != nil {
		return fail(invalid("%s: %v", name, err))
	}

	res := Result{KeyID: key.ID, Label: key.Label, Nonce: p.nonce, Name: name}
	if p.hasCreated {
		res.Created = time.Unix(p.created, 0).UTC()
	}
	return res, p, key, nil
}

// signatureOf returns the byte sequence of the member name of sigs, a
// Signature field httpsfv parsed.
func signatureOf(sigs *httpsfv.Dictionary, name string) ([]byte, error) {
	sigMember, ok := sigs.Get(name)
	if !ok {
		return nil, invalid("Signature has no member %s", name)
	}
	sigItem, ok := sigMember.(httpsfv.Item)
	if !ok {
		return nil, invalid("Signature %s is not a byte sequence", name)
	}
	sig, ok := sigItem.Value.([]byte)
	if !ok {
		return nil, invalid("Signature %s is not a byte sequence", name)
	}
	return sig, nil
}

// choose returns the first member of inputs whose keyid names a known key.
func (v *Verifier) choose(inputs []inputMember) (*inputMember, Key, error) {
	if len(inputs) == 0 {
		return nil, Key{}, invalid("Signature-Input is empty")
	}
	sawKeyID := false
	for i := range inputs {
		mem := &inputs[i]
		if !mem.isList {
			continue
		}
		id, ok := mem.param("keyid")
		if !ok || id.kind != kindString {
			continue
		}
		sawKeyID = true
		if v.keys == nil {
			continue
		}
		if key, ok := v.keys.Lookup(id.s); ok {
			return mem, key, nil
		}
	}
	if sawKeyID {
		return nil, Key{}, invalid("unknown keyid")
	}
	return nil, Key{}, invalid("no signature in Signature-Input has a keyid")
}

// sigParams are the signature parameters Verify uses (RFC 9421 §2.3).
type sigParams struct {
	created, expires       int64
	hasCreated, hasExpires bool
	nonce, alg             string
	hasNonce, hasAlg       bool
}

// parseSigParams checks the types of the known signature parameters and
// the nonce's length. Unknown parameters are allowed; they are signed.
func parseSigParams(ps []sfParam) (sigParams, error) {
	var p sigParams
	for _, raw := range ps {
		k := raw.key
		var ok bool
		switch k {
		case "created":
			p.created, ok = raw.n, raw.kind == kindInt
			p.hasCreated = true
		case "expires":
			p.expires, ok = raw.n, raw.kind == kindInt
			p.hasExpires = true
		case "nonce":
			p.nonce, ok = raw.s, raw.kind == kindString
			p.hasNonce = true
			if ok && (p.nonce == "" || len(p.nonce) > MaxNonceLen) {
				return p, fmt.Errorf("nonce must be 1 to %d bytes", MaxNonceLen)
			}
		case "alg":
			p.alg, ok = raw.s, raw.kind == kindString
			p.hasAlg = true
		case "keyid", "tag":
			ok = raw.kind == kindString
		default:
			ok = true
		}
		if !ok {
			if k == "created" || k == "expires" {
				return p, fmt.Errorf("%s must be an integer", k)
			}
			return p, fmt.Errorf("%s must be a string", k)
		}
	}
	return p, nil
}

// covers reports whether the covered components comps satisfy the
// requirement r: r itself, or @target-uri for @query.
func covers(comps []component, r string) bool {
	return covered(comps, r) || (r == compQuery && covered(comps, compTargetURI))
}

// covered reports whether comps holds the string c.
func covered(comps []component, c string) bool {
	for _, it := range comps {
		if it.isString && it.name == c {
			return true
		}
	}
	return false
}

// checkSignature verifies sig over base with key's own algorithm; an
// HMAC is computed into buf's spare capacity.
func (v *Verifier) checkSignature(key Key, base, sig, buf []byte) error {
	switch key.Alg {
	case AlgHMACSHA256:
		if len(key.Secret) == 0 {
			return errors.New("the key has no secret")
		}
		if !hmac.Equal(v.macs.sum(key.Secret, base, buf), sig) {
			return errors.New("wrong signature")
		}
		return nil
	case AlgEd25519:
		if len(key.PublicKey) != ed25519.PublicKeySize {
			return errors.New("the key has no valid public key")
		}
		if len(sig) != ed25519.SignatureSize || !ed25519.Verify(key.PublicKey, base, sig) {
			return errors.New("wrong signature")
		}
		return nil
	}
	return errors.New("the key has an unsupported algorithm")
}

// checkWindow applies the window, expires and WithNotBefore to p at now.
func (v *Verifier) checkWindow(now time.Time, p sigParams) error {
	nowSec := now.Unix()
	expired := func(format string, args ...any) error {
		return &ExpiredError{ServerTime: now.UTC(), Reason: ErrExpired.Error() + ": " + fmt.Sprintf(format, args...)}
	}
	// time.Time.Sub saturates, so created may be any integer.
	d := time.Unix(nowSec, 0).Sub(time.Unix(p.created, 0))
	if d > v.window {
		return expired("created %ds before the server's time; the window is %s", nowSec-p.created, v.window)
	}
	if d < -v.window {
		return expired("created %ds after the server's time; the window is %s", p.created-nowSec, v.window)
	}
	if p.hasExpires && p.expires <= nowSec {
		return expired("expired %ds ago", nowSec-p.expires)
	}
	if !v.notBefore.IsZero() && p.created < v.notBefore.Unix() {
		return expired("created before %s, when this server started forgetting nonces", v.notBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// invalid returns an error wrapping ErrInvalid with detail.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// clip shortens s, a value from the request, for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
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

// headerValues returns h's field lines for name, looking it up
// case-insensitively when h's keys are not canonical (headers built by
// hand rather than by net/http).
func headerValues(h http.Header, name string) []string {
	if vals := h.Values(name); len(vals) > 0 {
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
