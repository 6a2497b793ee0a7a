package memory

import (
	"bytes"
	"context"
	"errors"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/replayguard/replayguard/store"
)

const shardCount = 256 // a power of two

// Defaults for the options below.
const (
	DefaultMaxEntries      = 1_000_000
	DefaultMaxLimiterKeys  = 100_000
	DefaultJanitorInterval = time.Second
)

// Store is the in-memory store. Create it with New; the zero value is not
// usable. It is safe for concurrent use.
type Store struct {
	max      int64
	maxKeys  int64
	interval time.Duration
	now      func() time.Time
	seed     maphash.Seed

	shards [shardCount]shard
	n      atomic.Int64 // entries held, live or expired-but-unswept
	minExp atomic.Int64 // no held entry expires before this (unix ns)
	sweep  sync.Mutex   // one reclaiming sweep at a time

	limiters [shardCount]limShard
	nLim     atomic.Int64

	closed atomic.Bool
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

type shard struct {
	mu sync.Mutex
	m  map[string]entry
	_  [48]byte // 16 bytes of fields + 48 = one 64-byte cache line per shard
}

// entry is a token, a nonce or a record. A token's record keeps the
// token's purpose and subject too, to compare them field by field.
type entry struct {
	purpose, subject string
	exp              int64   // unix ns
	rec              *record // set for an idempotency record only
}

// record is an idempotency record's content. A stored record is never
// modified: Complete stores a new one, so a reader may use the pointer
// it took under the shard lock after releasing the lock.
type record struct {
	completed          bool
	fingerprint, owner string
	response           []byte
}

// export returns r as a store.Record with its own copy of the response.
func (r *record) export() store.Record {
	if r == nil {
		return store.Record{}
	}
	return store.Record{Completed: r.completed, Fingerprint: r.fingerprint, Owner: r.owner, Response: bytes.Clone(r.response)}
}

type limShard struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
	_  [48]byte
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Limiter = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithMaxEntries bounds how many entries (tokens, nonces and idempotency
// records together) the store holds at once. Exactly n live entries fit;
// redeeming, releasing or expiry frees a slot; Put, Redeem and Acquire
// past the bound return store.ErrFull and never evict a live entry.
// Defaults to DefaultMaxEntries (1,000,000); n <= 0 keeps the default.
func WithMaxEntries(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.max = int64(n)
		}
	}
}

// WithMaxLimiterKeys bounds how many rate-limiter keys (client IPs) are
// tracked at once. When that many clients are all active, new clients are
// refused until some go idle: memory stays bounded under an address spray.
// Defaults to DefaultMaxLimiterKeys (100,000); n <= 0 keeps the default.
func WithMaxLimiterKeys(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.maxKeys = int64(n)
		}
	}
}

// WithJanitorInterval sets how often expired entries and idle limiters are
// swept. Defaults to DefaultJanitorInterval (1s); d <= 0 keeps the default.
func WithJanitorInterval(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.interval = d
		}
	}
}

// WithClock replaces time.Now, for tests. Defaults to time.Now.
func WithClock(now func() time.Time) Option {
	return func(s *Store) {
		if now != nil {
			s.now = now
		}
	}
}

// New returns a running Store. Call Close to stop its janitor.
func New(opts ...Option) *Store {
	s := &Store{
		max:      DefaultMaxEntries,
		maxKeys:  DefaultMaxLimiterKeys,
		interval: DefaultJanitorInterval,
		now:      time.Now,
		seed:     maphash.MakeSeed(),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].m = make(map[string]entry)
		s.limiters[i].m = make(map[string]*rate.Limiter)
	}
	s.minExp.Store(math.MaxInt64)
	go s.janitor()
	return s
}

// shardIndex is the shard of a map key. A token's record shares its
// token's shard.
func (s *Store) shardIndex(key string) uint64 {
	if id, ok := store.TokenOfRecord(key); ok {
		key = id
	}
	return maphash.String(s.seed, key) & (shardCount - 1)
}

// check reports why a call cannot be carried out: the store is closed,
// or ctx is done.
func (s *Store) check(ctx context.Context, op string) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return store.Unavailable("memory: "+op, err)
	}
	return nil
}

// expiry is the expiry, in Unix nanoseconds, of an entry kept for ttl
// from now; it saturates instead of overflowing.
func expiry(now int64, ttl time.Duration) int64 {
	if ttl > 0 && now > math.MaxInt64-int64(ttl) {
		return math.MaxInt64
	}
	return now + int64(ttl)
}

// Put implements store.Store. A nonce's entry (store.NonceKey) is a
// token entry with no purpose or subject, under a key no token ID has.
func (s *Store) Put(ctx context.Context, key string, t store.Token, ttl time.Duration) (bool, error) {
	if err := s.check(ctx, "put"); err != nil {
		return false, err
	}
	if store.Reserved(key) && !store.IsNonceKey(key) {
		return false, store.Unavailable("memory: put", errReservedKey)
	}
	if ttl <= 0 {
		return true, nil // stored and expired at once, as Redis does
	}
	now := s.now().UnixNano()
	_, created, err := s.put(key, entry{purpose: t.Purpose, subject: t.Subject, exp: expiry(now, ttl)}, now)
	return created, err
}

// errReservedKey refuses a caller's key that begins with "\x00".
var errReservedKey = errors.New("the key is reserved for the store")

// put stores e under k when no live entry holds k, taking a slot of the
// bound. Otherwise it returns the live entry and false. A live entry is
// reported as such even when the store is full, so that a caller holding
// a taken ID tries another one (or sees the record it raced for) instead
// of giving up; only a new entry that does not fit is store.ErrFull.
// e.exp must be after now.
func (s *Store) put(k string, e entry, now int64) (entry, bool, error) {
	sh := &s.shards[s.shardIndex(k)]
	sh.mu.Lock()
	old, ok := sh.m[k]
	sh.mu.Unlock()
	if ok && old.exp > now {
		return old, false, nil
	}
	// reserve may sweep every shard: it must run without a shard lock.
	if !s.reserve(now) {
		sh.mu.Lock()
		old, ok := sh.m[k]
		sh.mu.Unlock()
		if ok && old.exp > now {
			return old, false, nil
		}
		return entry{}, false, store.ErrFull
	}
	sh.mu.Lock()
	if old, ok := sh.m[k]; ok {
		if old.exp > now {
			sh.mu.Unlock()
			s.n.Add(-1)
			return old, false, nil
		}
		s.n.Add(-1) // replacing an expired entry takes no new slot
	}
	sh.m[k] = e
	sh.mu.Unlock()
	s.lowerMinExp(e.exp)
	return entry{}, true, nil
}

// lowerMinExp keeps minExp a lower bound after an entry expiring at exp
// was stored.
func (s *Store) lowerMinExp(exp int64) {
	for {
		m := s.minExp.Load()
		if exp >= m || s.minExp.CompareAndSwap(m, exp) {
			return
		}
	}
}

// reserve takes one slot of the bound, reclaiming expired entries first
// when the store is full and some may have expired.
func (s *Store) reserve(now int64) bool {
	swept := false
	for {
		c := s.n.Load()
		if c < s.max {
			if s.n.CompareAndSwap(c, c+1) {
				return true
			}
			continue
		}
		if swept || now < s.minExp.Load() {
			return false
		}
		s.reclaim(now)
		swept = true
	}
}

// reclaim removes every expired entry and recomputes minExp. Concurrent
// callers wait for one sweep instead of repeating it.
func (s *Store) reclaim(now int64) {
	s.sweep.Lock()
	defer s.sweep.Unlock()
	if now < s.minExp.Load() {
		return // another caller just swept
	}
	// Lower bound first: entries put during the sweep keep it correct.
	s.minExp.Store(math.MaxInt64)
	min := int64(math.MaxInt64)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.exp <= now {
				delete(sh.m, k)
				s.n.Add(-1)
			} else if e.exp < min {
				min = e.exp
			}
		}
		sh.mu.Unlock()
	}
	for {
		m := s.minExp.Load()
		if min >= m || s.minExp.CompareAndSwap(m, min) {
			return
		}
	}
}

// liveLocked reports whether a live entry holds k, deleting it when it
// has expired. The caller holds k's shard lock.
func (s *Store) liveLocked(sh *shard, k string, now int64) bool {
	e, ok := sh.m[k]
	if ok && e.exp <= now {
		delete(sh.m, k)
		s.n.Add(-1)
		return false
	}
	return ok
}

// redeemLocked compares the token under id with want. When it matches
// and owner is empty, the token is deleted: Redeemed. When it matches and
// owner is not, nothing changes and open is true: the caller opens the
// record. The caller holds id's shard lock and has checked the record.
func (s *Store) redeemLocked(sh *shard, id string, want store.Token, owner string, now int64) (res store.RedeemResult, open bool) {
	if !s.liveLocked(sh, id, now) {
		return store.Absent, false
	}
	e := sh.m[id]
	switch {
	case e.rec != nil:
		return store.Absent, false
	case e.purpose != want.Purpose:
		return store.PurposeMismatch, false
	case e.subject != want.Subject:
		return store.SubjectMismatch, false
	case owner != "":
		return 0, true
	}
	delete(sh.m, id)
	s.n.Add(-1)
	return store.Redeemed, false
}

// Redeem implements store.Store. The token and its record share the
// token's shard, so one lock covers both; the record is one entry of the
// bound. A lease <= 0 redeems without storing a record, as if it had
// expired at once (Redis does the same): the token stays, and a later
// Renew, Complete or Release reports false.
func (s *Store) Redeem(ctx context.Context, id string, want store.Token, owner string, lease time.Duration) (store.RedeemResult, store.Record, error) {
	if err := s.check(ctx, "redeem"); err != nil {
		return 0, store.Record{}, err
	}
	if store.Reserved(id) {
		return store.Absent, store.Record{}, nil
	}
	now := s.now().UnixNano()
	exp := expiry(now, lease)
	sh := &s.shards[s.shardIndex(id)]
	sh.mu.Lock()
	res, rec, open := s.redeemRecordLocked(sh, id, want, owner, now)
	sh.mu.Unlock()
	switch {
	case !open:
		return res, rec, nil
	case exp <= now:
		return store.Redeemed, store.Record{Fingerprint: want.Fingerprint(), Owner: owner}, nil
	}
	// reserve may sweep every shard: it must run without a shard lock.
	// The token is looked at again once the slot is held.
	reserved := s.reserve(now)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	res, rec, open = s.redeemRecordLocked(sh, id, want, owner, now)
	switch {
	case !open:
		if reserved {
			s.n.Add(-1)
		}
		return res, rec, nil
	case !reserved:
		return 0, store.Record{}, store.ErrFull
	}
	r := &record{fingerprint: want.Fingerprint(), owner: owner}
	sh.m[store.TokenRecordKey(id)] = entry{purpose: want.Purpose, subject: want.Subject, exp: exp, rec: r}
	s.lowerMinExp(exp)
	return store.Redeemed, r.export(), nil
}

// redeemRecordLocked is Redeem's decision under id's shard lock:
// the live record when there is one, else redeemLocked's.
func (s *Store) redeemRecordLocked(sh *shard, id string, want store.Token, owner string, now int64) (store.RedeemResult, store.Record, bool) {
	rk := store.TokenRecordKey(id)
	if s.liveLocked(sh, rk, now) {
		e := sh.m[rk]
		switch {
		case e.purpose != want.Purpose:
			return store.PurposeMismatch, store.Record{}, false
		case e.subject != want.Subject:
			return store.SubjectMismatch, store.Record{}, false
		}
		return store.Recorded, e.rec.export(), false
	}
	res, open := s.redeemLocked(sh, id, want, owner, now)
	return res, store.Record{}, open
}

// recordKey is the map key of the idempotency record under key. The
// "\x00r" prefix sets records apart from tokens and from nonces ("\x00n");
// a token's record key (store.TokenRecordKey) is its own map key.
func recordKey(key string) string {
	if _, ok := store.TokenOfRecord(key); ok {
		return key
	}
	return "\x00r" + key
}

// Acquire implements store.Store. When acquired, rec is the new
// processing record. A lease <= 0 acquires without storing anything, as
// if the record had expired at once (Redis does the same): a later Renew,
// Complete or Release then reports false.
func (s *Store) Acquire(ctx context.Context, key, fingerprint, owner string, lease time.Duration) (store.Record, bool, error) {
	if err := s.check(ctx, "acquire"); err != nil {
		return store.Record{}, false, err
	}
	if store.Reserved(key) {
		return store.Record{}, false, store.Unavailable("memory: acquire", errReservedKey)
	}
	now := s.now().UnixNano()
	exp := expiry(now, lease)
	k := recordKey(key)
	if exp <= now {
		sh := &s.shards[s.shardIndex(k)]
		sh.mu.Lock()
		old, ok := sh.m[k]
		sh.mu.Unlock()
		if ok && old.exp > now {
			return old.rec.export(), false, nil
		}
		return store.Record{Fingerprint: fingerprint, Owner: owner}, true, nil
	}
	r := &record{fingerprint: fingerprint, owner: owner}
	old, acquired, err := s.put(k, entry{exp: exp, rec: r}, now)
	switch {
	case err != nil:
		return store.Record{}, false, err
	case !acquired:
		return old.rec.export(), false, nil
	}
	return r.export(), true, nil
}

// update runs f on owner's live processing record under key, under the
// shard lock, and stores the entry f returns; ok is false and nothing
// changes when there is no such record. An entry whose expiry has passed
// is deleted instead of stored. With dropToken, a token's record also
// deletes its token.
func (s *Store) update(ctx context.Context, op, key, owner string, dropToken bool, f func(e entry) entry) (bool, error) {
	if err := s.check(ctx, op); err != nil {
		return false, err
	}
	now := s.now().UnixNano()
	k := recordKey(key)
	sh := &s.shards[s.shardIndex(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	switch {
	case !ok:
		return false, nil
	case e.exp <= now:
		delete(sh.m, k)
		s.n.Add(-1)
		return false, nil
	case e.rec == nil || e.rec.completed || (owner != "" && e.rec.owner != owner):
		return false, nil
	}
	if id, ok := store.TokenOfRecord(k); ok && dropToken {
		if _, ok := sh.m[id]; ok {
			delete(sh.m, id)
			s.n.Add(-1)
		}
	}
	e = f(e)
	if e.exp <= now {
		delete(sh.m, k)
		s.n.Add(-1)
		return true, nil
	}
	sh.m[k] = e
	s.lowerMinExp(e.exp)
	return true, nil
}

// Renew implements store.Store. A lease <= 0 ends the record at once: ok
// is true and the next Acquire acquires.
func (s *Store) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	if owner == "" { // only Complete and Release take "" for any owner
		return false, s.check(ctx, "renew")
	}
	return s.update(ctx, "renew", key, owner, false, func(e entry) entry {
		e.exp = expiry(s.now().UnixNano(), lease)
		return e
	})
}

// Complete implements store.Store. The store keeps its own copy of
// response. A keep <= 0 completes the record and ends it at once: ok is
// true and the next Acquire acquires. Completing a token's record deletes
// the token.
func (s *Store) Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (bool, error) {
	resp := bytes.Clone(response) // outside the shard lock
	return s.update(ctx, "complete", key, owner, true, func(e entry) entry {
		e.exp = expiry(s.now().UnixNano(), keep)
		e.rec = &record{completed: true, fingerprint: e.rec.fingerprint, owner: owner, response: resp}
		return e
	})
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, key, owner string) (bool, error) {
	return s.update(ctx, "release", key, owner, false, func(e entry) entry {
		e.exp = math.MinInt64 // deleted by update
		return e
	})
}

// Len returns how many entries the store holds, counting expired entries
// the janitor has not removed yet.
func (s *Store) Len() int { return int(s.n.Load()) }

// Allow implements store.Limiter with an in-process token bucket per key
// (golang.org/x/time/rate): l.Burst events at once, refilled at
// l.Rate per l.Period.
func (s *Store) Allow(ctx context.Context, key string, l store.Limit) (bool, time.Duration, error) {
	if err := s.check(ctx, "allow"); err != nil {
		return false, 0, err
	}
	if l.IsZero() {
		return true, 0, nil
	}
	now := s.now()
	sh := &s.limiters[s.shardIndex(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	lim, ok := sh.m[key]
	if !ok {
		if s.nLim.Add(1) > s.maxKeys {
			s.nLim.Add(-1)
			return false, s.interval, nil
		}
		lim = rate.NewLimiter(rate.Limit(float64(l.Rate)/l.Period.Seconds()), max(l.Burst, 1))
		sh.m[key] = lim
	}
	r := lim.ReserveN(now, 1)
	if !r.OK() {
		return false, l.Period, nil
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d, nil
	}
	return true, 0, nil
}

// Ping implements store.Store; it fails only after Close.
func (s *Store) Ping(ctx context.Context) error { return s.check(ctx, "ping") }

// Close stops the janitor and waits for it to exit. It is safe to call
// more than once.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		<-s.done
	})
	return nil
}

func (s *Store) janitor() {
	defer close(s.done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			now := s.now()
			s.reclaim(now.UnixNano())
			s.sweepLimiters(now)
		}
	}
}

// sweepLimiters forgets keys whose bucket is full again: forgetting them
// changes nothing for their next event.
func (s *Store) sweepLimiters(now time.Time) {
	for i := range s.limiters {
		sh := &s.limiters[i]
		sh.mu.Lock()
		for k, lim := range sh.m {
			if lim.TokensAt(now) >= float64(lim.Burst()) {
				delete(sh.m, k)
				s.nLim.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}
