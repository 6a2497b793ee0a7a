package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/store"
)

// Defaults for the options below.
const (
	DefaultPrefix  = "rg:"
	DefaultTimeout = 500 * time.Millisecond
)

//go:embed redeem.lua
var redeemSrc string

// redeem is the atomic compare-and-delete behind RedeemToken. Run sends
// EVALSHA and falls back to EVAL when the server answers NOSCRIPT.
var redeem = goredis.NewScript(redeemSrc)

// Replies of redeem.lua.
const (
	replyAbsent          = 0
	replyRedeemed        = 1
	replyPurposeMismatch = 2
	replySubjectMismatch = 3
	replyRecorded        = 4 // redeem_record.lua only
)

// Client is the part of a go-redis client the store uses.
// *goredis.Client, *goredis.ClusterClient, *goredis.Ring and
// goredis.UniversalClient all satisfy it.
type Client interface {
	goredis.Scripter
	SetArgs(ctx context.Context, key string, value any, a goredis.SetArgs) *goredis.StatusCmd
	Del(ctx context.Context, keys ...string) *goredis.IntCmd
	Ping(ctx context.Context) *goredis.StatusCmd
	Close() error
}

var (
	_ Client = (*goredis.Client)(nil)
	_ Client = (*goredis.ClusterClient)(nil)
	_ Client = (*goredis.Ring)(nil)
	_ Client = (goredis.UniversalClient)(nil)
)

// Store is the Redis store. Create it with New; the zero value is not
// usable. It is safe for concurrent use.
type Store struct {
	client  Client
	limiter *redis_rate.Limiter
	prefix  string
	timeout time.Duration
	now     func() time.Time
	closed  atomic.Bool
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Limiter = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the string every key the store writes begins with, so
// that several deployments or tests can share one Redis. It must not
// contain '{' or '}', which would change the keys' hash tags.
// Defaults to DefaultPrefix ("rg:"); an empty p keeps the default.
func WithPrefix(p string) Option {
	return func(s *Store) {
		if p != "" {
			s.prefix = p
		}
	}
}

// WithTimeout bounds every call the store makes: each runs under
// context.WithTimeout(ctx, d), so a slow or unreachable Redis turns into
// an error after d at most (set ContextTimeoutEnabled on the client, see
// the package documentation). Defaults to DefaultTimeout (500ms);
// d <= 0 keeps the default.
func WithTimeout(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// WithClock replaces time.Now, for tests. PutToken and PutNonce use it
// only to decide that an expiry time has already passed; Redis expires
// keys, records included, by its own clock. Defaults to time.Now.
func WithClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// New returns a Store that keeps its tokens in the Redis behind client.
// The store takes ownership of client: Close closes it.
func New(client Client, opts ...Option) *Store {
	s := &Store{
		client:  client,
		limiter: redis_rate.NewLimiter(client),
		prefix:  DefaultPrefix,
		timeout: DefaultTimeout,
		now:     time.Now,
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// TokenKey returns the Redis key that holds the token id:
// prefix + "t:{" + id + "}". The braces are a Cluster hash tag, so any
// other key kept for the same id (prefix + "r:{" + id + "}", say) lives in
// the same slot and one script may touch both. An id that is empty or
// begins with '}' leaves the braces empty, which Redis ignores as a tag.
func (s *Store) TokenKey(id string) string {
	return s.prefix + "t:{" + id + "}"
}

// begin checks that the store is open and ctx is live, and returns ctx
// bounded by the store's timeout.
func (s *Store) begin(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if s.closed.Load() {
		return nil, nil, store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, cancel, nil
}

// PutToken implements store.Store with one SET key value NX EXAT/PXAT. The
// entry expires at expiresAt by the Redis server's clock, truncated to the
// millisecond. When expiresAt has already passed by the store's clock,
// nothing is stored and created is true, as if the entry had been stored
// and had expired at once. A purpose containing a newline is refused with
// an error: it would make the stored encoding ambiguous.
func (s *Store) PutToken(ctx context.Context, id string, t store.Token, expiresAt time.Time) (bool, error) {
	ctx, cancel, err := s.begin(ctx)
	if err != nil {
		return false, fmt.Errorf("redis: put: %w", err)
	}
	defer cancel()
	if strings.Contains(t.Purpose, "\n") {
		return false, errors.New("redis: put: purpose contains a newline")
	}
	if !expiresAt.After(s.now()) {
		return true, nil
	}
	err = s.client.SetArgs(ctx, s.TokenKey(id), encode(t), goredis.SetArgs{Mode: "NX", ExpireAt: expiresAt}).Err()
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, goredis.Nil):
		return false, nil
	}
	return false, fmt.Errorf("redis: put: %w", err)
}

// NonceKey returns the Redis key that records nonce within scope:
// prefix + "n:" + len(scope) + ":" + scope + ":" + nonce, unambiguous for
// every scope and nonce.
func (s *Store) NonceKey(scope, nonce string) string {
	return s.prefix + "n:" + strconv.Itoa(len(scope)) + ":" + scope + ":" + nonce
}

// PutNonce implements store.Store with one SET key 1 NX EXAT/PXAT.
func (s *Store) PutNonce(ctx context.Context, scope, nonce string, expiresAt time.Time) (bool, error) {
	ctx, cancel, err := s.begin(ctx)
	if err != nil {
		return false, fmt.Errorf("redis: nonce: %w", err)
	}
	defer cancel()
	if !expiresAt.After(s.now()) {
		return true, nil
	}
	err = s.client.SetArgs(ctx, s.NonceKey(scope, nonce), "1", goredis.SetArgs{Mode: "NX", ExpireAt: expiresAt}).Err()
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, goredis.Nil):
		return false, nil
	}
	return false, fmt.Errorf("redis: nonce: %w", err)
}

// RedeemToken implements store.Store with one Lua script (redeem.lua), so
// that exactly one of any number of concurrent callers sees Redeemed. The
// script also reads the token's record key (same hash slot): a token with
// a live record is Absent.
func (s *Store) RedeemToken(ctx context.Context, id string, want store.Token) (store.RedeemResult, error) {
	ctx, cancel, err := s.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("redis: redeem: %w", err)
	}
	defer cancel()
	value, purpose := redeemArgs(want)
	keys := []string{s.TokenKey(id), s.RecordKey(store.TokenRecordKey(id))}
	n, err := redeem.Run(ctx, s.client, keys, value, purpose).Int64()
	if err != nil {
		return 0, fmt.Errorf("redis: redeem: %w", err)
	}
	if res, ok := redeemResult(n); ok {
		return res, nil
	}
	return 0, fmt.Errorf("redis: redeem: unexpected script reply %d", n)
}

// redeemArgs are the ARGV of the redeem scripts for want: the expected
// stored value and the expected purpose with its separator.
func redeemArgs(want store.Token) (value, purpose string) {
	if strings.Contains(want.Purpose, "\n") {
		// No stored purpose has a newline: the scripts can only answer
		// Absent or PurposeMismatch.
		return "", ""
	}
	return encode(want), want.Purpose + "\n"
}

// redeemResult is the RedeemResult of a redeem script's reply code.
func redeemResult(n int64) (store.RedeemResult, bool) {
	switch n {
	case replyAbsent:
		return store.Absent, true
	case replyRedeemed:
		return store.Redeemed, true
	case replyPurposeMismatch:
		return store.PurposeMismatch, true
	case replySubjectMismatch:
		return store.SubjectMismatch, true
	}
	return 0, false
}

// encode is the stored form of t, its Fingerprint. Purposes never contain
// a newline, so the first one ends the purpose; the subject may contain
// anything.
func encode(t store.Token) string { return t.Fingerprint() }

// Allow implements store.Limiter with go-redis/redis_rate (GCRA in one Lua
// script, on the Redis server's clock): l.Burst events at once, refilled
// at l.Rate per l.Period. The key is "rate:" + prefix + key; redis_rate
// adds the "rate:" itself, which matters for ACL key patterns.
// A zero limit or a Period <= 0 allows everything, and a Burst below 1
// counts as 1, as in store/memory.
func (s *Store) Allow(ctx context.Context, key string, l store.Limit) (bool, time.Duration, error) {
	ctx, cancel, err := s.begin(ctx)
	if err != nil {
		return false, 0, fmt.Errorf("redis: allow: %w", err)
	}
	defer cancel()
	if l.IsZero() || l.Period <= 0 {
		return true, 0, nil
	}
	res, err := s.limiter.Allow(ctx, s.prefix+key, redis_rate.Limit{Rate: l.Rate, Burst: max(l.Burst, 1), Period: l.Period})
	if err != nil {
		return false, 0, fmt.Errorf("redis: allow: %w", err)
	}
	if res.Allowed > 0 {
		return true, 0, nil
	}
	return false, max(res.RetryAfter, 0), nil
}

// Ping implements store.Store with one PING. On a cluster client it asks
// one node, not every shard.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("redis: ping: %w", err)
	}
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis: ping: %w", err)
	}
	return nil
}

// Close closes the client the store was made with. Calls after Close
// return store.ErrClosed. It is safe to call more than once; only the
// first call closes the client.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("redis: close: %w", err)
	}
	return nil
}

// ACLCommands are the commands the store sends, itself and from its Lua
// scripts and go-redis/redis_rate's, as a Redis ACL rule. A Redis user for
// Replayguard needs them, its keys (~<prefix>* ~rate:<prefix>*), +select
// when the client's options name a database other than 0 (go-redis
// selects it on every new connection) and, on a Cluster, +cluster|slots. The README quotes this rule, and a test runs the
// conformance suite as a user that has exactly these.
const ACLCommands = "+get +set +del +exists +hmget +hset +pexpireat +time +eval +evalsha +ping"
