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
	// untimed checks signatures without validating claims, for
	// ParseExpired.
	untimed *jwt.Parser
	now     func() time.Time

	ttl, maxTTL time.Duration
	leeway      time.Duration
	machineID   *uint16
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
// shares a store its own ID. Defaults to the lower 16 bits of the host's
// private IPv4 address; New returns ErrNoMachineID when there is none.
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
	settings := sonyflake.Settings{}
	if s.machineID != nil {
		id := *s.machineID
		settings.MachineID = func() (uint16, error) { return id, nil }
	}
	flake, err := sonyflake.New(settings)
	if err != nil {
		if errors.Is(err, sonyflake.ErrNoPrivateAddress) {
			return nil, fmt.Errorf("%w: %v", ErrNoMachineID, err)
		}
		return nil, fmt.Errorf("token: sonyflake: %w", err)
	}
	s.flake = flake
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
	s.untimed = jwt.NewParser(jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}), jwt.WithStrictDecoding(), jwt.WithoutClaimsValidation())
	return s, nil
}

// RandomMachineID returns a random sonyflake machine ID from crypto/rand,
// for hosts without a private IPv4 address. Two instances sharing a store
// may still collide; issuing never overwrites a live token, but set
// distinct IDs explicitly where you can.
func RandomMachineID() (uint16, error) {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("token: random machine ID: %w", err)
	}
	return binary.BigEndian.Uint16(b[:]), nil
}

// Issue creates a token, stores it with set-if-absent until its exp, and
// returns it. A store failure is ErrUnavailable (or ErrStoreFull); the
// token is then never returned.
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
		created, err := s.store.PutToken(ctx, c.ID, store.Token{Purpose: c.Purpose, Subject: c.Subject}, c.ExpiresAt)
		if err != nil {
			if errors.Is(err, store.ErrFull) {
				return Issued{}, fmt.Errorf("%w: %w", ErrStoreFull, err)
			}
			return Issued{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if created {
			tok, err := s.sign(c)
			if err != nil {
				return Issued{}, err
			}
			return Issued{Token: tok, Claims: c, TTL: ttl}, nil
		}
	}
	return Issued{}, fmt.Errorf("%w: token ID collisions: give each instance its own machine ID", ErrUnavailable)
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

func (s *Service) sign(c Claims) (string, error) {
	// Equivalent to jwt.Token.SignedString, with the header segment (the
	// same for every token of a key) encoded once in New.
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
	var sig [sha256.Size]byte
	s.signMAC.sum(signing, sig[:0])
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig[:]), nil
}

// Parse verifies a token's signature (HS256 only, kid from the key ring)
// and its exp, without touching the store. It returns ErrInvalid or
// ErrExpired.
func (s *Service) Parse(tok string) (Claims, error) { return s.parse(tok, true) }

// ParseExpired is Parse for a token whose exp may have passed: it verifies
// the signature and the claims' form exactly as Parse does, but not the
// times, and returns ErrInvalid only. It serves calls that finish what a
// token started before it expired, such as completing the token's
// record; never redeem with it.
func (s *Service) ParseExpired(tok string) (Claims, error) { return s.parse(tok, false) }

// parse verifies tok; checkTime says whether exp and iat are validated.
func (s *Service) parse(tok string, checkTime bool) (Claims, error) {
	if len(tok) == 0 || len(tok) > MaxTokenLen || strings.Count(tok, ".") != 2 {
		return Claims{}, fmt.Errorf("%w: malformed", ErrInvalid)
	}
	// Fast path: a token whose header is byte for byte one this service
	// writes ({"alg":"HS256","kid":...,"typ":"JWT"}) has its HMAC checked
	// before any JSON is decoded, so a forgery costs one HMAC; a genuine
	// one then only needs its claims decoded and validated (golang-jwt's
	// Validator: exp with leeway, iat). Any other header goes through
	// golang-jwt's full parser, which pins HS256 and the kid ring.
	var jc jwtClaims
	var err error
	dot1, dot2 := strings.IndexByte(tok, '.'), strings.LastIndexByte(tok, '.')
	parser := s.parser
	if !checkTime {
		parser = s.untimed
	}
	if macs, ok := s.headers[tok[:dot1]]; ok {
		if !macs.valid(tok[:dot2], tok[dot2+1:]) {
			return Claims{}, fmt.Errorf("%w: signature is invalid", ErrInvalid)
		}
		err = s.decodeClaims(tok[dot1+1:dot2], &jc, checkTime)
	} else {
		_, err = parser.ParseWithClaims(tok, &jc, s.keyFor)
	}
	if err != nil {
		if errors.Is(err, jwt.ErrTokenExpired) {
			return Claims{}, fmt.Errorf("%w: %w", ErrExpired, err)
		}
		return Claims{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if jc.ID == "" || jc.IssuedAt == nil || jc.ExpiresAt == nil || !ValidPurpose(jc.Purpose) || len(jc.Subject) > MaxSubjectLen {
		return Claims{}, fmt.Errorf("%w: missing or malformed claims", ErrInvalid)
	}
	if _, err := strconv.ParseUint(jc.ID, 10, 64); err != nil {
		return Claims{}, fmt.Errorf("%w: jti is not a sonyflake ID", ErrInvalid)
	}
	return Claims{
		ID:        jc.ID,
		Purpose:   jc.Purpose,
		Subject:   jc.Subject,
		IssuedAt:  jc.IssuedAt.Time,
		ExpiresAt: jc.ExpiresAt.Time,
	}, nil
}

// decodeClaims decodes the base64url claims segment of a token whose
// signature is verified, and validates them as the parser would when
// validate is set.
func (s *Service) decodeClaims(seg string, jc *jwtClaims, validate bool) error {
	raw, err := base64.RawURLEncoding.Strict().DecodeString(seg)
	if err != nil {
		return fmt.Errorf("claims are not base64url: %w", err)
	}
	if err := json.Unmarshal(raw, jc); err != nil {
		return fmt.Errorf("claims are not a JSON object: %w", err)
	}
	if !validate {
		return nil
	}
	return s.validator.Validate(jc)
}

// macPool recycles keyed HMAC-SHA256 states, which cost two SHA-256
// blocks and several allocations to set up.
type macPool struct{ p sync.Pool }

func newMACPool(secret []byte) *macPool {
	m := &macPool{}
	m.p.New = func() any { return hmac.New(sha256.New, secret) }
	return m
}

// sum appends the MAC of msg to b.
func (m *macPool) sum(msg string, b []byte) []byte {
	h := m.p.Get().(hash.Hash)
	h.Reset()
	_, _ = io.WriteString(h, msg)
	b = h.Sum(b)
	m.p.Put(h)
	return b
}

// valid reports whether sig (unpadded base64url) is the MAC of signed,
// compared in constant time.
func (m *macPool) valid(signed, sig string) bool {
	if base64.RawURLEncoding.DecodedLen(len(sig)) != sha256.Size {
		return false
	}
	var got, want [sha256.Size]byte
	// Strict: one spelling per signature, so a token cannot be re-encoded.
	if n, err := base64.RawURLEncoding.Strict().Decode(got[:], []byte(sig)); err != nil || n != sha256.Size {
		return false
	}
	return hmac.Equal(m.sum(signed, want[:0]), got[:])
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
// exactly once per token; afterwards ErrUsed. ErrPurposeMismatch and
// ErrSubjectMismatch leave the token valid. ErrUnavailable means the
// store did not confirm: the caller must not proceed.
func (s *Service) Redeem(ctx context.Context, tok, purpose, subject string) (Claims, error) {
	c, err := s.Check(tok, purpose, subject)
	if err != nil {
		return Claims{}, err
	}
	res, err := s.store.RedeemToken(ctx, c.ID, store.Token{Purpose: c.Purpose, Subject: c.Subject})
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err := s.RedeemError(c, res); err != nil {
		return Claims{}, err
	}
	return c, nil
}

// Check is Redeem without the store: it verifies tok and that it was
// issued for purpose (empty means DefaultPurpose) and subject (empty
// means an unbound token). It returns ErrBadRequest for a malformed
// purpose or subject, ErrInvalid, ErrExpired, ErrPurposeMismatch or
// ErrSubjectMismatch. The claims it returns name the purpose and subject
// to redeem for, as store.Token{Purpose: c.Purpose, Subject: c.Subject}.
// Callers that redeem by other means (an idempotency.Keeper's StartToken)
// turn the store's answer into an error with RedeemError.
func (s *Service) Check(tok, purpose, subject string) (Claims, error) {
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
	if err != nil {
		return Claims{}, err
	}
	// The signed claims carry what the store holds: a mismatch needs no
	// round trip. The store compares again, atomically, before deleting.
	if c.Purpose != purpose {
		return Claims{}, ErrPurposeMismatch
	}
	if c.Subject != subject {
		return Claims{}, ErrSubjectMismatch
	}
	return c, nil
}

// RedeemError returns the error of a redemption of the token c (checked
// with Check) whose store answer was res: nil for store.Redeemed;
// ErrPurposeMismatch and ErrSubjectMismatch (the token stays valid);
// ErrUsed for store.Absent, or ErrExpired when c's exp has passed by the
// service's clock (the store dropped the token inside the leeway), and
// for store.Recorded, a token taken by its record, when the caller does
// not answer from that record; ErrUnavailable for anything else.
func (s *Service) RedeemError(c Claims, res store.RedeemResult) error {
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
	return fmt.Errorf("%w: unexpected store result %d", ErrUnavailable, res)
}

// Ping reports whether the store answers.
func (s *Service) Ping(ctx context.Context) error { return s.store.Ping(ctx) }

// SigningKeyID returns the kid of the key that signs new tokens.
func (s *Service) SigningKeyID() string { return s.signer.ID }
