package token

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"

	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/goccy/go-json"
	"github.com/golang-jwt/jwt/v5"
	"github.com/sony/sonyflake"

	"github.com/replayguard/replayguard/store"
)

// Where a token travels in an HTTP request, and where a proxy that
// redeemed it tells the app which token it was.
const (
	// Header carries a token to redeem.
	Header = "Idempotency-Token"
	// FormField is the form field that carries a token, for forms that
	// work without JavaScript.
	FormField = "idempotency_token"
	// IDHeader carries a redeemed token's ID from a proxy that redeemed it
	// (the gateway, or nginx through forward-auth) to the app behind it.
	IDHeader = "Replayguard-Token-Id"
)

// Limits and defaults.
const (
	// DefaultPurpose is used when an issue or redeem names no purpose.
	DefaultPurpose = "default"
	// DefaultTTL is a token's lifetime when the request names none.
	DefaultTTL = 5 * time.Minute
	// DefaultMaxTTL is the longest lifetime a request may ask for.
	DefaultMaxTTL = time.Hour
	// MinTTL is the shortest lifetime a token may have.
	MinTTL = 10 * time.Second
	// MaxLeeway is the most clock skew tolerated when checking exp.
	MaxLeeway = 5 * time.Second
	// MaxSubjectLen bounds a subject, in bytes.
	MaxSubjectLen = 256
	// MaxTokenLen bounds an encoded token, in bytes; longer ones are
	// invalid without being parsed. The longest token Issue can make (a
	// subject of MaxSubjectLen bytes, each escaped by JSON to six) is
	// about 2.5 KiB.
	MaxTokenLen = 4096
)

// purposePattern documents the purpose syntax; ValidPurpose checks it
// without the regexp engine, on every issue and redeem.
const purposePattern = `^[A-Za-z0-9._:/-]{1,64}$`

// ValidPurpose reports whether p is a well-formed purpose:
// ^[A-Za-z0-9._:/-]{1,64}$.
func ValidPurpose(p string) bool {
	if len(p) == 0 || len(p) > 64 {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '/' || c == '-') {
			return false
		}
	}
	return true
}

// Claims are the facts a verified token carries.
type Claims struct {
	// ID is the token's jti: a sonyflake ID in decimal.
	ID string
	// Purpose is what the token may be redeemed for.
	Purpose string
	// Subject is who the token is bound to; empty when unbound.
	Subject string
	// IssuedAt and ExpiresAt are the iat and exp claims.
	IssuedAt, ExpiresAt time.Time
}

// Issued is a freshly issued token and its claims.
type Issued struct {
	// Token is the compact JWT to hand to the client.
	Token string
	// TTL is the lifetime granted; the token lives at least this long
	// (ExpiresAt is rounded up to the second).
	TTL time.Duration
	Claims
}

// IssueRequest describes a token to issue. Zero values take the defaults.
type IssueRequest struct {
	// Purpose defaults to DefaultPurpose.
	Purpose string
	// Subject binds the token to a user or session; empty means unbound.
	Subject string
	// TTL defaults to the service's default TTL; otherwise it must lie in
	// [MinTTL, max TTL].
	TTL time.Duration
}

// jwtClaims is the JWT body: jti, iat, exp, sub and pur.
type jwtClaims struct {
	jwt.RegisteredClaims
	Purpose string `json:"pur"`
}

// Service issues, parses and redeems single-use tokens. Create it with
// New; it is safe for concurrent use.
type Service struct {
	store   store.Store
	signer  Key
	secrets map[string][]byte
	// headers maps the encoded JWT header this service writes for each
	// key to that key's MACs, so a token with a known header has its
	// signature checked before any JSON is decoded (see Parse).
	headers map[string]*macPool
	// signHeader is the encoded header of the signing key, signMAC its MACs.
	signHeader string
	signMAC    *macPool
	flake      *sonyflake.Sonyflake
	parser     *jwt.Parser
	validator  *jwt.Validator
	now        func() time.Time

	ttl, maxTTL time.Duration
	leeway      time.Duration
	machineID   *uint16
	// randomID: no machine ID was set and the host has no private IPv4
	// address, so machineID is random (see WithMachineID).
	randomID bool
}

// Option configures a Service.
type Option func(*Service)

// WithDefaultTTL sets the lifetime of tokens whose request names none.
// Defaults to DefaultTTL (5m). It must lie in [MinTTL, max TTL].
func WithDefaultTTL(d time.Duration) Option { return func(s *Service) { s.ttl = d } }

// WithMaxTTL sets the longest lifetime a request may ask for. Defaults to
// DefaultMaxTTL (1h).
func WithMaxTTL(d time.Duration) Option { return func(s *Service) { s.maxTTL = d } }

// WithMachineID sets the sonyflake machine ID. Give every instance that
// shares a store its own ID (recommended). Defaults to the lower 16 bits
// of the host's private IPv4 address or, on a host without one (a
// container without a private network, IPv6 only, some CI runners), a
// random ID from crypto/rand, which MachineID reports: instances sharing
// a store may then collide, which costs retries (see Issue), never a
// token issued twice.
func WithMachineID(id uint16) Option { return func(s *Service) { s.machineID = &id } }

// WithLeeway sets the clock skew tolerated when checking exp. Defaults to
// MaxLeeway (5s), which is also its upper bound.
func WithLeeway(d time.Duration) Option {
	return func(s *Service) { s.leeway = min(max(d, 0), MaxLeeway) }
}

// WithClock replaces time.Now for iat, exp and expiry checks, for tests.
// Defaults to time.Now. (IDs still come from sonyflake's own clock.)
func WithClock(now func() time.Time) Option {
	return func(s *Service) {
		if now != nil {
			s.now = now
		}
	}
}

// New returns a Service that keeps tokens in st and signs with keys[0];
// every key in keys verifies, so keys can be rotated by putting the new
// key first and keeping the old one until its tokens have expired.
func New(st store.Store, keys []Key, opts ...Option) (*Service, error) {
	if st == nil {
		return nil, errors.New("token: nil store")
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys", ErrBadKeys)
	}
	s := &Service{
		store:   st,
		signer:  keys[0],
		secrets: make(map[string][]byte, len(keys)),
		headers: make(map[string]*macPool, len(keys)),
		now:     time.Now,
		ttl:     DefaultTTL,
		maxTTL:  DefaultMaxTTL,
		leeway:  MaxLeeway,
	}
	for _, k := range keys {
		if len(k.Secret) < MinKeyLen || !kidPattern.MatchString(k.ID) {
			return nil, fmt.Errorf("%w: kid %q is malformed or shorter than %d bytes", ErrBadKeys, k.ID, MinKeyLen)
		}
		if _, dup := s.secrets[k.ID]; dup {
			return nil, fmt.Errorf("%w: duplicate kid %q", ErrBadKeys, k.ID)
		}
		s.secrets[k.ID] = k.Secret
	}
	for _, o := range opts {
		o(s)
	}
	if s.maxTTL < MinTTL {
		return nil, fmt.Errorf("token: max TTL %v is below the minimum %v", s.maxTTL, MinTTL)
	}
	if s.ttl < MinTTL || s.ttl > s.maxTTL {
		return nil, fmt.Errorf("token: default TTL %v is outside [%v, %v]", s.ttl, MinTTL, s.maxTTL)
	}
	if err := s.newFlake(); err != nil {
		return nil, err
	}
	for _, k := range keys {
		t := jwt.New(jwt.SigningMethodHS256)
		t.Header["kid"] = k.ID
		signed, err := t.SignedString(k.Secret)
		if err != nil {
			return nil, fmt.Errorf("token: signing: %w", err)
		}
		header := signed[:strings.IndexByte(signed, '.')]
		s.headers[header] = newMACPool(k.Secret)
		if k.ID == s.signer.ID {
			s.signHeader = header
			s.signMAC = s.headers[header]
		}
	}
	popts := []jwt.ParserOption{
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithLeeway(s.leeway),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithTimeFunc(s.now),
		jwt.WithStrictDecoding(),
	}
	s.parser = jwt.NewParser(popts...)
	s.validator = jwt.NewValidator(popts...)
	return s, nil
}

// newSonyflake is sonyflake.New; tests replace it to play a host without
// a private IPv4 address.
var newSonyflake = sonyflake.New

// newFlake sets s.flake under the machine ID of WithMachineID, else the
// lower 16 bits of the host's private IPv4 address, else a random one
// (s.randomID), and records the ID in s.machineID.
func (s *Service) newFlake() error {
	var id uint16
	settings := sonyflake.Settings{CheckMachineID: func(m uint16) bool { id = m; return true }}
	if s.machineID != nil {
		set := *s.machineID
		settings.MachineID = func() (uint16, error) { return set, nil }
	}
	flake, err := newSonyflake(settings)
	if s.machineID == nil && errors.Is(err, sonyflake.ErrNoPrivateAddress) {
		random, rerr := RandomMachineID()
		if rerr != nil {
			return rerr
		}
		settings.MachineID = func() (uint16, error) { return random, nil }
		flake, err = newSonyflake(settings)
		s.randomID = true
	}
	if err != nil {
		return fmt.Errorf("token: sonyflake: %w", err)
	}
	s.flake, s.machineID = flake, &id
	return nil
}

// MachineID returns the sonyflake machine ID in the IDs s issues, and
// whether it is random: no WithMachineID and no private IPv4 address on
// the host, so another instance sharing the store may draw the same one.
// Set it with WithMachineID (REPLAYGUARD_MACHINE_ID for the server) where
// that matters.
func (s *Service) MachineID() (id uint16, random bool) { return *s.machineID, s.randomID }

// RandomMachineID returns a random sonyflake machine ID from crypto/rand:
// what New uses on a host without a private IPv4 address when no
// WithMachineID is given. Two instances sharing a store may still
// collide; issuing never overwrites a live token, but set distinct IDs
// explicitly where you can.
func RandomMachineID() (uint16, error) {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("token: random machine ID: %w", err)
	}
	return binary.BigEndian.Uint16(b[:]), nil
}

// Issue creates a token, stores it with set-if-absent until its exp, and
// returns it. A store failure is returned as the store gave it, wrapping
// store.ErrUnavailable (or store.ErrFull); the token is then never
// returned.
func (s *Service) Issue(ctx context.Context, req IssueRequest) (Issued, error) {
	purpose := req.Purpose
	if purpose == "" {
		purpose = DefaultPurpose
	}
	if !ValidPurpose(purpose) {
		return Issued{}, fmt.Errorf("%w: purpose must match %s", ErrBadRequest, purposePattern)
	}
	if err := validSubject(req.Subject); err != nil {
		return Issued{}, err
	}
	ttl := req.TTL
	if ttl == 0 {
		ttl = s.ttl
	}
	if ttl < MinTTL || ttl > s.maxTTL {
		return Issued{}, fmt.Errorf("%w: ttl must be between %d and %d seconds", ErrBadRequest, int(MinTTL.Seconds()), int(s.maxTTL.Seconds()))
	}
	// NumericDate has whole seconds: exp is rounded up so the token lives
	// at least ttl, and the stored entry expires exactly at exp.
	now := s.now()
	iat := now.Truncate(time.Second)
	exp := now.Add(ttl)
	if t := exp.Truncate(time.Second); !t.Equal(exp) {
		exp = t.Add(time.Second)
	}
	c := Claims{Purpose: purpose, Subject: req.Subject, IssuedAt: iat, ExpiresAt: exp}
	// A collision (two instances sharing a machine ID) is refused by the
	// store's set-if-absent; try a fresh ID a few times.
	for range 3 {
		id, err := s.flake.NextID()
		if err != nil {
			return Issued{}, fmt.Errorf("token: sonyflake: %w", err)
		}
		c.ID = strconv.FormatUint(id, 10)
		// The store keeps it for as long as exp is ahead by this clock,
		// counted on the store's own.
		created, err := s.store.Put(ctx, c.ID, store.Token{Purpose: c.Purpose, Subject: c.Subject}, c.ExpiresAt.Sub(now))
		if err != nil {
			return Issued{}, err
		}
		if created {
			tok, err := s.sign(c)
			if err != nil {
				return Issued{}, err
			}
			return Issued{Token: tok, Claims: c, TTL: ttl}, nil
		}
	}
	return Issued{}, fmt.Errorf("%w: token ID collisions: give each instance its own machine ID", store.ErrUnavailable)
}

func validSubject(sub string) error {
	if len(sub) > MaxSubjectLen {
		return fmt.Errorf("%w: subject is longer than %d bytes", ErrBadRequest, MaxSubjectLen)
	}
	if !utf8.ValidString(sub) {
		// JSON would sign U+FFFD while the store kept the raw bytes.
		return fmt.Errorf("%w: subject is not valid UTF-8", ErrBadRequest)
	}
	return nil
}

// sign returns the token of c, signed with the signing key. It writes
// the bytes signJSON writes (a test holds it to that), by hand, into the
// key's pooled scratch buffer: the token string is its one allocation.
func (s *Service) sign(c Claims) (string, error) {
	if jwt.TimePrecision != time.Second {
		return s.signJSON(c) // appendClaims writes whole seconds only
	}
	// Equivalent to jwt.Token.SignedString, with the header segment (the
	// same for every token of a key) encoded once in New.
	m := s.signMAC.get()
	defer s.signMAC.put(m)
	b := appendClaims(m.buf[:0], c)
	n := len(b)
	b = append(b, s.signHeader...)
	b = append(b, '.')
	b = base64.RawURLEncoding.AppendEncode(b, b[:n])
	_, _ = m.h.Write(b[n:])
	b = append(b, '.')
	b = base64.RawURLEncoding.AppendEncode(b, m.h.Sum(m.sum[:0]))
	m.buf = b
	return string(b[n:]), nil
}

// signJSON is sign by reflection, with goccy/go-json and golang-jwt's
// NumericDate: how tokens were signed before appendClaims, and still are
// when jwt.TimePrecision is not a second.
func (s *Service) signJSON(c Claims) (string, error) {
	claims, err := json.Marshal(jwtClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			ID:        c.ID,
			Subject:   c.Subject,
			IssuedAt:  jwt.NewNumericDate(c.IssuedAt),
			ExpiresAt: jwt.NewNumericDate(c.ExpiresAt),
		},
		Purpose: c.Purpose,
	})
	if err != nil {
		return "", fmt.Errorf("token: encoding claims: %w", err)
	}
	signing := s.signHeader + "." + base64.RawURLEncoding.EncodeToString(claims)
	m := s.signMAC.get()
	defer s.signMAC.put(m)
	_, _ = io.WriteString(m.h, signing)
	return signing + "." + base64.RawURLEncoding.EncodeToString(m.h.Sum(m.sum[:0])), nil
}

// Parse verifies a token's signature (HS256 only, kid from the key ring)
// and its exp, without touching the store. It returns ErrInvalid or
// ErrExpired. As golang-jwt does, a token whose signature and claims are
// good but whose exp has passed comes back with its claims and an error
// wrapping ErrExpired: such claims may be used to finish what the token
// started before it expired, never to redeem it.
func (s *Service) Parse(tok string) (Claims, error) {
	if len(tok) == 0 || len(tok) > MaxTokenLen || strings.Count(tok, ".") != 2 {
		return Claims{}, fmt.Errorf("%w: malformed", ErrInvalid)
	}
	// Fast path: a token whose header is byte for byte one this service
	// writes ({"alg":"HS256","kid":...,"typ":"JWT"}) has its HMAC checked
	// before any JSON is decoded, so a forgery costs one HMAC; a genuine
	// one then only needs its claims decoded and validated (readClaims).
	// Any other header goes through golang-jwt's full parser, which pins
	// HS256 and the kid ring.
	dot1, dot2 := strings.IndexByte(tok, '.'), strings.LastIndexByte(tok, '.')
	macs, ok := s.headers[tok[:dot1]]
	if !ok {
		var jc jwtClaims
		_, err := s.parser.ParseWithClaims(tok, &jc, s.keyFor)
		return checkClaims(claimsOf(&jc, err))
	}
	m := macs.get()
	defer macs.put(m)
	if !m.valid(tok[:dot2], tok[dot2+1:]) {
		return Claims{}, errBadSignature
	}
	return checkClaims(s.readClaims(m, tok[dot1+1:dot2]))
}

// errBadSignature is Parse's answer to a token with a known header whose
// MAC is wrong, made once: forgeries are the answer's hot path.
var errBadSignature = fmt.Errorf("%w: signature is invalid", ErrInvalid)

// checkClaims finishes Parse from the claims c of a token whose signature
// is good, whether c has its iat and exp (dated), and err, the error of
// decoding and validating them.
func checkClaims(c Claims, dated bool, err error) (Claims, error) {
	expired := onlyExpired(err)
	if err != nil && !expired {
		return Claims{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !dated || c.ID == "" || !ValidPurpose(c.Purpose) || len(c.Subject) > MaxSubjectLen {
		return Claims{}, fmt.Errorf("%w: missing or malformed claims", ErrInvalid)
	}
	if _, err := strconv.ParseUint(c.ID, 10, 64); err != nil {
		return Claims{}, fmt.Errorf("%w: jti is not a sonyflake ID", ErrInvalid)
	}
	if expired {
		return c, fmt.Errorf("%w: %w", ErrExpired, err)
	}
	return c, nil
}

// claimsOf returns jc's claims, whether it has both iat and exp, and err.
func claimsOf(jc *jwtClaims, err error) (Claims, bool, error) {
	c := Claims{ID: jc.ID, Purpose: jc.Purpose, Subject: jc.Subject}
	if jc.IssuedAt == nil || jc.ExpiresAt == nil {
		return c, false, err
	}
	c.IssuedAt, c.ExpiresAt = jc.IssuedAt.Time, jc.ExpiresAt.Time
	return c, true, err
}

// onlyExpired reports whether err is a claims validation error that says
// the token expired and nothing else (the signature was good).
func onlyExpired(err error) bool {
	return errors.Is(err, jwt.ErrTokenExpired) &&
		!errors.Is(err, jwt.ErrTokenSignatureInvalid) && !errors.Is(err, jwt.ErrTokenMalformed) &&
		!errors.Is(err, jwt.ErrTokenUsedBeforeIssued) && !errors.Is(err, jwt.ErrTokenNotValidYet)
}

// readClaims decodes and validates the claims segment seg of a token
// whose signature m verified, as decodeClaims does, with the same
// results: the segment appendClaims writes is read by parseClaims and
// checked by validate without reflection; any other goes to decodeClaims.
func (s *Service) readClaims(m *macState, seg string) (Claims, bool, error) {
	if c, ok := m.fastClaims(seg); ok {
		return c, true, s.validate(c)
	}
	var jc jwtClaims
	return claimsOf(&jc, s.decodeClaims(seg, &jc))
}

// validate checks c as s.validator checks jwtClaims with c's values (New
// sets WithExpirationRequired, WithIssuedAt and WithLeeway, nothing for
// nbf, aud, iss or sub): now must be before exp plus the leeway and not
// before iat less the leeway. When a check fails, the error is the
// Validator's own for c; it reads the clock again, so the answer is what
// decodeClaims would have said at that instant.
func (s *Service) validate(c Claims) error {
	now := s.now()
	if now.Before(c.ExpiresAt.Add(s.leeway)) && !now.Before(c.IssuedAt.Add(-s.leeway)) {
		return nil
	}
	return s.validator.Validate(&jwtClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			ID:        c.ID,
			Subject:   c.Subject,
			IssuedAt:  &jwt.NumericDate{Time: c.IssuedAt},
			ExpiresAt: &jwt.NumericDate{Time: c.ExpiresAt},
		},
		Purpose: c.Purpose,
	})
}

// decodeClaims decodes the base64url claims segment of a token whose
// signature is verified, and validates them as the parser would, by
// reflection: goccy/go-json, NumericDate and golang-jwt's Validator.
func (s *Service) decodeClaims(seg string, jc *jwtClaims) error {
	raw, err := b64.DecodeString(seg)
	if err != nil {
		return fmt.Errorf("claims are not base64url: %w", err)
	}
	if err := json.Unmarshal(raw, jc); err != nil {
		return fmt.Errorf("claims are not a JSON object: %w", err)
	}
	return s.validator.Validate(jc)
}

// b64 decodes base64url strictly: one spelling per value, so that a token
// cannot be re-encoded.
var b64 = base64.RawURLEncoding.Strict()

// macPool recycles keyed HMAC-SHA256 states, which cost two SHA-256
// blocks and several allocations to set up, with scratch memory for the
// token being signed or verified.
type macPool struct{ p sync.Pool }

// macState is one keyed HMAC-SHA256 and its scratch memory, which lives
// on the heap with it so that nothing passed to the hash.Hash interface
// needs an allocation of its own.
type macState struct {
	h   hash.Hash
	sum [sha256.Size]byte
	buf []byte
}

func newMACPool(secret []byte) *macPool {
	m := &macPool{}
	m.p.New = func() any {
		return &macState{h: hmac.New(sha256.New, secret), buf: make([]byte, 0, 512)}
	}
	return m
}

// get returns a reset state; give it back with put.
func (m *macPool) get() *macState {
	st := m.p.Get().(*macState)
	st.h.Reset()
	return st
}

func (m *macPool) put(st *macState) { m.p.Put(st) }

// valid reports whether sig (unpadded base64url) is the MAC of signed,
// compared in constant time.
func (m *macState) valid(signed, sig string) bool {
	if b64.DecodedLen(len(sig)) != sha256.Size {
		return false
	}
	var got [sha256.Size]byte
	// Strict: one spelling per signature, so a token cannot be re-encoded.
	if n, err := b64.Decode(got[:], []byte(sig)); err != nil || n != sha256.Size {
		return false
	}
	// hash.Hash takes bytes, and converting signed would allocate.
	m.buf = append(m.buf[:0], signed...)
	_, _ = m.h.Write(m.buf)
	return hmac.Equal(m.h.Sum(m.sum[:0]), got[:])
}

// fastClaims decodes the claims segment seg with parseClaims, into
// Claims whose strings share one allocation; ok is false when seg is not
// what sign writes.
func (m *macState) fastClaims(seg string) (Claims, bool) {
	if jwt.TimePrecision != time.Second {
		return Claims{}, false // NumericDate would truncate to it
	}
	// Decode from a copy of seg in buf to the bytes after it.
	b := append(m.buf[:0], seg...)
	b, err := b64.AppendDecode(b, b)
	m.buf = b
	if err != nil {
		return Claims{}, false
	}
	c, exp, iat, ok := parseClaims(string(b[len(seg):]))
	c.ExpiresAt, c.IssuedAt = time.Unix(exp, 0), time.Unix(iat, 0)
	return c, ok
}

func (s *Service) keyFor(t *jwt.Token) (any, error) {
	kid, _ := t.Header["kid"].(string)
	secret, ok := s.secrets[kid]
	if !ok {
		return nil, errors.New("unknown kid")
	}
	return secret, nil
}

// Redeem verifies tok and atomically consumes it for purpose (empty means
// DefaultPurpose) and subject (empty means an unbound token). A forged or
// expired token never reaches the store. It returns the token's claims
// exactly once per token; afterwards ErrUsed (also for a token taken by
// its record, see RedeemRecord). ErrPurposeMismatch and ErrSubjectMismatch
// leave the token valid. A store failure is returned as the store gave
// it, wrapping store.ErrUnavailable: the caller must not proceed.
func (s *Service) Redeem(ctx context.Context, tok, purpose, subject string) (Claims, error) {
	return s.RedeemWith(ctx, tok, purpose, subject, func(ctx context.Context, id string, want store.Token) (store.RedeemResult, error) {
		res, _, err := s.store.Redeem(ctx, id, want, "", 0)
		return res, err
	})
}

// RedeemWith is Redeem with the store step done by redeem, which deletes
// the token id when it matches want, as store.Store.Redeem does without an
// owner: inside the application's own database transaction, say, so that
// the token is spent if and only if the transaction commits (package
// idempotency/pgtx). Everything else is Redeem's: the checks before the
// store, and the errors. redeem's error is returned as it is.
func (s *Service) RedeemWith(ctx context.Context, tok, purpose, subject string, redeem func(ctx context.Context, id string, want store.Token) (store.RedeemResult, error)) (Claims, error) {
	c, err := s.check(tok, purpose, subject)
	if err != nil {
		return Claims{}, err
	}
	res, err := redeem(ctx, c.ID, store.Token{Purpose: c.Purpose, Subject: c.Subject})
	if err != nil {
		return Claims{}, err
	}
	if err := s.redeemError(c, res); err != nil {
		return Claims{}, err
	}
	return c, nil
}

// RedeemRecord is Redeem for a token whose one execution may be recorded
// beside it, in the store's one atomic step (store.Store.Redeem):
//
//   - a token with a live record for purpose and subject is not redeemed:
//     found is true and rec is that record, processing or completed, even
//     after the token's exp, so that a late duplicate is answered from it;
//   - else, with an owner, the token is redeemed by opening a processing
//     record owned by owner and leased for lease, which rec returns; the
//     token stays in the store, taken by its record, until the record is
//     completed (which consumes it) or released or its lease ends (which
//     give it back for one retry);
//   - else, without an owner, the token is redeemed as by Redeem.
//
// A token whose exp has passed is never redeemed: it is ErrExpired unless
// its record answers. The other errors are Redeem's. package idempotency
// builds its token records on this step.
func (s *Service) RedeemRecord(ctx context.Context, tok, purpose, subject, owner string, lease time.Duration) (c Claims, rec store.Record, found bool, err error) {
	c, err = s.check(tok, purpose, subject)
	expired := err != nil && c.ID != "" // only ErrExpired comes with claims
	if err != nil && !expired {
		return Claims{}, store.Record{}, false, err
	}
	if expired {
		owner, lease = "", 0 // only its record may answer
	}
	res, rec, serr := s.store.Redeem(ctx, c.ID, store.Token{Purpose: c.Purpose, Subject: c.Subject}, owner, lease)
	switch {
	case serr != nil:
		return Claims{}, store.Record{}, false, serr
	case res == store.Recorded:
		return c, rec, true, nil
	case expired:
		return Claims{}, store.Record{}, false, err
	}
	if err := s.redeemError(c, res); err != nil {
		return Claims{}, store.Record{}, false, err
	}
	return c, rec, false, nil
}

// check is Redeem without the store: it verifies tok and that it was
// issued for purpose (empty means DefaultPurpose) and subject (empty
// means an unbound token). It returns ErrBadRequest for a malformed
// purpose or subject, ErrInvalid, ErrExpired, ErrPurposeMismatch or
// ErrSubjectMismatch. An expired token that is otherwise good for purpose
// and subject comes back with its claims and ErrExpired, for
// RedeemRecord; every other error comes without claims.
func (s *Service) check(tok, purpose, subject string) (Claims, error) {
	if purpose == "" {
		purpose = DefaultPurpose
	}
	if !ValidPurpose(purpose) {
		return Claims{}, fmt.Errorf("%w: purpose must match %s", ErrBadRequest, purposePattern)
	}
	if err := validSubject(subject); err != nil {
		return Claims{}, err
	}
	c, err := s.Parse(tok)
	if err != nil && !errors.Is(err, ErrExpired) {
		return Claims{}, err
	}
	// The signed claims carry what the store holds: a mismatch needs no
	// round trip. The store compares again, atomically, before deleting.
	switch {
	case c.Purpose != purpose:
		if err != nil {
			return Claims{}, err
		}
		return Claims{}, ErrPurposeMismatch
	case c.Subject != subject:
		if err != nil {
			return Claims{}, err
		}
		return Claims{}, ErrSubjectMismatch
	}
	return c, err
}

// redeemError returns the error of a redemption of the token c whose
// store answer was res: nil for store.Redeemed; ErrPurposeMismatch and
// ErrSubjectMismatch (the token stays valid); ErrUsed for store.Absent and
// store.Recorded (a token taken by its record, when the caller does not
// answer from it), or ErrExpired when c's exp has passed by the service's
// clock (the store dropped the token inside the leeway).
func (s *Service) redeemError(c Claims, res store.RedeemResult) error {
	switch res {
	case store.Redeemed:
		return nil
	case store.PurposeMismatch:
		return ErrPurposeMismatch
	case store.SubjectMismatch:
		return ErrSubjectMismatch
	case store.Absent, store.Recorded:
		if !s.now().Before(c.ExpiresAt) {
			return ErrExpired // inside the leeway, gone from the store
		}
		return ErrUsed
	}
	return fmt.Errorf("%w: unexpected store result %d", store.ErrUnavailable, res)
}

// Ping reports whether the store answers.
func (s *Service) Ping(ctx context.Context) error { return s.store.Ping(ctx) }

// SigningKeyID returns the kid of the key that signs new tokens.
func (s *Service) SigningKeyID() string { return s.signer.ID }
