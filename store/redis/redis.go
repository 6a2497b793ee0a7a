package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/store"
)

// Defaults for the options below.
const (
	DefaultPrefix      = "rg:"
	DefaultTimeout     = 500 * time.Millisecond
	DefaultMinReplicas = 0
	DefaultPipelines   = 2
)

var (
	// ErrNotReplicated is wrapped by the error of a change the master
	// made but that fewer replicas than WithMinReplicas asks for
	// acknowledged within the call's timeout (or whose WAIT failed).
	// Whether the change survives a failover is unknown, as for any call
	// whose reply was lost. It wraps store.ErrUnavailable.
	ErrNotReplicated = fmt.Errorf("%w: change not acknowledged by enough replicas", store.ErrUnavailable)
)

// Replies of redeem.lua.
const (
	replyAbsent          = 0
	replyRedeemed        = 1
	replyPurposeMismatch = 2
	replySubjectMismatch = 3
	replyRecorded        = 4
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
	client      Client
	writer      writer // client, as the writer of the calls that need no WAIT
	limiter     *redis_rate.Limiter
	prefix      string
	timeout     time.Duration
	minReplicas int
	pipelines   int
	batched     bool // writer is a batchWriter
	closed      atomic.Bool
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

// WithTimeout bounds every call the store makes: each ends within d of
// its start, or by its context's deadline when that is earlier, so a
// slow or unreachable Redis turns into an error after d at most (set
// ContextTimeoutEnabled on the client, see the package documentation).
// A call that is not pipelined (see WithPipelining) runs under
// context.WithTimeout(ctx, d). A pipelined one makes no context of its
// own: its deadline travels with its command, and each pipeline runs
// under the earliest such deadline among its commands, so that every
// command's outcome is known, or it has failed, by its own call's
// deadline. Defaults to DefaultTimeout (500ms); d <= 0 keeps the
// default.
func WithTimeout(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// WithMinReplicas makes every change the store makes wait until n
// replicas of the master that made it have acknowledged it, and fail
// otherwise. A change is a Put that created, a Redeem that redeemed or
// opened a record, an Acquire that acquired, and a Renew, Complete or
// Release that returned true. After one, the store sends WAIT n on the
// connection that made it (WAIT counts the replicas that have
// acknowledged that connection's writes) with what is left of the
// call's timeout, less a margin (half of it, 150ms at most, as Redis may
// answer a timed-out WAIT up to 1000/hz ms late). When fewer than n
// replicas acknowledged in that time, the call returns an error
// wrapping ErrNotReplicated, and so store.ErrUnavailable, instead of
// success.
//
// What it guarantees: every success the store reports is held in the
// memory of n replicas as well as the master's, so a failover to one of
// them (Sentinel promoting a replica, a Cluster replica taking over its
// master's slots) cannot undo it: a redeemed token stays redeemed, a
// recorded nonce stays recorded. What it does not: WAIT is not a
// consensus. A replica that acknowledged and then fails too, or a
// failover to a replica that had not acknowledged while another had, can
// still lose a change; Redis' own min-replicas-to-write on the master
// complements it. The store does not send WAITAOF (Redis 7.2), so
// acknowledged means in the replica's memory, not on its disk.
//
// What it costs: a second round trip and the replication delay on every
// change, and a connection held for the whole call (calls that change
// nothing, such as refusals, are not slowed); and availability: while
// fewer than n replicas are connected, every change fails after the full
// timeout, although the master has made it, so a token so redeemed is
// used up, unconfirmed, and an acquired key stays taken until its lease
// ends. Allow (the rate limit) and Ping never wait.
//
// It needs a *goredis.Client (a single server, or Sentinel through
// goredis.NewFailoverClient), whose Conn pins the connection, or a
// *goredis.ClusterClient, where the WAIT goes to the master that holds
// the key (MasterForKey); with any other client every change fails. A
// Redis ACL user then needs +wait besides ACLCommands. Turn off the
// client's maintenance notifications (MaintNotificationsConfig with
// maintnotifications.ModeDisabled; FailoverClients always do): in
// go-redis v9.23 a Conn shares its client's options but not their lock,
// and in the default auto mode the first connections rewrite them when
// the server refuses the feature, a data race.
//
// Defaults to DefaultMinReplicas (0): a change is acknowledged by the
// master alone, with no extra command, and a failover may undo the last
// ones. Recommended: 1 wherever Redis has replicas and automatic
// failover and a redemption must survive it. n < 0 keeps the default.
func WithMinReplicas(n int) Option {
	return func(s *Store) {
		if n >= 0 {
			s.minReplicas = n
		}
	}
}

// WithPipelining sends the commands that concurrent calls make at the
// same moment together, as one pipeline, with up to n pipelines in flight
// at once: while they are, the calls that arrive queue their commands,
// and the next pipeline takes every command queued by then. Nothing
// waits for more commands: a lone call's command leaves at once, on its
// own. Each call
// keeps its deadline (see WithTimeout: a pipeline runs until the
// earliest deadline among its commands, a call also gives up when its
// context ends, and a command whose call gave up before a pipeline took
// it is never sent) and its error: a pipeline that fails fails every
// call whose reply it did not read with store.ErrUnavailable. On a
// Cluster, go-redis splits each pipeline by node. The client must bound
// its reads and writes by their context's deadline (ContextTimeoutEnabled,
// see the package documentation); with a client that is not known to,
// every queued call arms a timer of its own.
//
// What it buys: one write and one read system call on each side for a
// whole pipeline instead of one per command, which on a busy server is
// most of a command's cost (BENCHMARKS.md). Defaults to
// DefaultPipelines (2; recommended). n = 0 sends each command on its own
// pooled connection; n < 0 keeps the default. With WithMinReplicas, whose
// WAIT must follow its change on the same connection, commands are never
// pipelined. A client without Pipelined (not a Client, ClusterClient or
// Ring) is never pipelined either.
func WithPipelining(n int) Option {
	return func(s *Store) {
		if n >= 0 {
			s.pipelines = n
		}
	}
}

// New returns a Store that keeps its tokens in the Redis behind client.
// The store takes ownership of client: Close closes it.
func New(client Client, opts ...Option) *Store {
	s := &Store{
		client:      client,
		writer:      client,
		prefix:      DefaultPrefix,
		timeout:     DefaultTimeout,
		minReplicas: DefaultMinReplicas,
		pipelines:   DefaultPipelines,
	}
	for _, o := range opts {
		o(s)
	}
	p, ok := client.(pipeliner)
	if ok && s.pipelines > 0 && s.minReplicas == 0 {
		bw := batchWriter{b: newBatch(p, s.pipelines, !contextTimeouts(client)), client: client}
		s.writer = bw
		s.batched = true
		s.limiter = redis_rate.NewLimiter(bw)
	} else {
		s.limiter = redis_rate.NewLimiter(client)
	}
	return s
}

// tokenKey returns the Redis key that holds the token id:
// prefix + "t:{" + id + "}". The braces are a Cluster hash tag, so any
// other key kept for the same id (its record, prefix + "r:{" + id + "}t")
// lives in the same slot and one script may touch both. An id that is
// empty or begins with '}' leaves the braces empty, which Redis ignores as
// a tag.
func (s *Store) tokenKey(id string) string {
	return s.prefix + "t:{" + id + "}"
}

// putKey returns the Redis key of a Put: the token's key, or for a nonce
// (store.NonceKey) prefix + "n:" + len(scope) + ":" + scope + ":" + nonce.
func (s *Store) putKey(key string) string {
	if store.IsNonceKey(key) {
		return s.prefix + "n:" + key[len("\x00n"):]
	}
	return s.tokenKey(key)
}

// contextTimeouts reports whether client is known to bound its sends'
// network reads and writes by their context's deadline: a Client,
// ClusterClient or Ring with ContextTimeoutEnabled.
func contextTimeouts(client Client) bool {
	switch c := client.(type) {
	case *goredis.Client:
		return c.Options().ContextTimeoutEnabled
	case *goredis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *goredis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// begin checks that the store is open and ctx is live, and returns ctx
// bounded by the store's timeout, with its cancel. On the batched path
// that is a callContext (see batch): ctx, with the call's deadline
// beside it for the batch to read, and nothing to cancel; only the
// batch's writer and limiter may be given it. Otherwise it is
// context.WithTimeout(ctx, s.timeout), whose deadline confirm reads.
func (s *Store) begin(ctx context.Context, op string) (context.Context, context.CancelFunc, error) {
	if err := s.check(ctx, op); err != nil {
		return nil, nil, err
	}
	if s.batched {
		return &callContext{Context: ctx, deadline: time.Now().Add(s.timeout)}, nop, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, cancel, nil
}

// check returns the error of a call on a closed store, or under a
// context that has ended, if any.
func (s *Store) check(ctx context.Context, op string) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fail(op, err)
	}
	return nil
}

// fail is the error of a call that did not complete: store.ErrFull when
// Redis refused a write for being at its maxmemory (with noeviction, its
// OOM error), else an error wrapping store.ErrUnavailable.
func fail(op string, err error) error {
	if strings.HasPrefix(err.Error(), "OOM ") {
		return fmt.Errorf("%w: redis: %s: %w", store.ErrFull, op, unprefixed{err})
	}
	return store.Unavailable("redis: "+op, unprefixed{err})
}

// unprefixed is err without go-redis's own "redis: " at the start of its
// message, since the store's errors already say "redis: <op>": a pool
// timeout reads "redis: get: connection pool timeout", not "redis: get:
// redis: connection pool timeout". errors.Is and errors.As still see err.
type unprefixed struct{ err error }

func (u unprefixed) Error() string { return strings.TrimPrefix(u.err.Error(), "redis: ") }
func (u unprefixed) Unwrap() error { return u.err }

// millis is d as a PX or PEXPIRE argument: whole milliseconds, rounded
// up so that an entry never lives shorter than asked; 0 for d <= 0.
func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// Put implements store.Store with one SET key value NX PX ttl, which
// Redis expires by its own clock. A ttl <= 0 stores nothing and created
// is true, as if the entry had been stored and had expired at once. A
// purpose containing a newline is refused with an error: it would make
// the stored encoding ambiguous.
func (s *Store) Put(ctx context.Context, key string, t store.Token, ttl time.Duration) (bool, error) {
	ctx, cancel, err := s.begin(ctx, "put")
	if err != nil {
		return false, err
	}
	defer cancel()
	switch {
	case strings.Contains(t.Purpose, "\n"):
		return false, fail("put", errors.New("purpose contains a newline"))
	case store.Reserved(key) && !store.IsNonceKey(key):
		return false, fail("put", errors.New("the key is reserved for the store"))
	case ttl <= 0:
		return true, nil
	}
	rk := s.putKey(key)
	c, err := s.open(ctx, rk)
	if err != nil {
		return false, fail("put", err)
	}
	defer c.close()
	err = c.w.SetArgs(ctx, rk, encode(t), goredis.SetArgs{Mode: "NX", TTL: time.Duration(millis(ttl)) * time.Millisecond}).Err()
	switch {
	case err == nil:
		if err := s.confirm(ctx, "put", c); err != nil {
			return false, err
		}
		return true, nil
	case errors.Is(err, goredis.Nil):
		return false, nil
	}
	return false, c.fail("put", err)
}

// redeemArgs are the ARGV of redeem.lua for want: the expected stored
// value and the expected purpose with its separator.
func redeemArgs(want store.Token) (value, purpose string) {
	if strings.Contains(want.Purpose, "\n") {
		// No stored purpose has a newline: the script can only answer
		// Absent or PurposeMismatch.
		return "", ""
	}
	return encode(want), want.Purpose + "\n"
}

// redeemResult is the RedeemResult of a redeem.lua reply code.
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
	ctx, cancel, err := s.begin(ctx, "allow")
	if err != nil {
		return false, 0, err
	}
	defer cancel()
	if l.IsZero() || l.Period <= 0 {
		return true, 0, nil
	}
	res, err := s.limiter.Allow(ctx, s.prefix+key, redis_rate.Limit{Rate: l.Rate, Burst: max(l.Burst, 1), Period: l.Period})
	if err != nil {
		return false, 0, fail("allow", err)
	}
	if res.Allowed > 0 {
		return true, 0, nil
	}
	return false, max(res.RetryAfter, 0), nil
}

// Ping implements store.Store with one PING. On a cluster client it asks
// one node, not every shard.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.check(ctx, "ping"); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout) // never batched
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		return fail("ping", err)
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
		return fmt.Errorf("redis: close: %w", unprefixed{err})
	}
	return nil
}

// ACLCommands are the commands the store sends, itself and from its Lua
// scripts and go-redis/redis_rate's, as a Redis ACL rule. A Redis user for
// Replayguard needs them, its keys (~<prefix>* ~rate:<prefix>*), +select
// when the client's options name a database other than 0 (go-redis
// selects it on every new connection), on a Cluster +cluster|slots, and
// with WithMinReplicas +wait. The README quotes this rule, and tests run
// the conformance suite as a user that has exactly these (and +wait).
const ACLCommands = "+get +set +del +hmget +hset +pexpire +pttl +time +eval +evalsha +ping"
