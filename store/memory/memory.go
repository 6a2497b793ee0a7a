package memory

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
	DefaultMaxBytes        = 128 << 20
	DefaultMaxLimiterKeys  = 100_000
	DefaultJanitorInterval = time.Second
)

// What an entry costs besides its strings and response, as measured on
// amd64 (a map slot, the entry, the key's header; a record's struct).
const (
	entryOverhead  = 128
	recordOverhead = 96
	// completeSlack is how far Complete may grow a record past the byte
	// budget: enough for an outcome without its body, so that a record
	// can always be completed as "not stored" (see store.Store.Complete).
	completeSlack = 512
)

// Store is the in-memory store. Create it with New; the zero value is not
// usable. It is safe for concurrent use.
type Store struct {
	maxKeys  int64
	interval time.Duration
	now      func() time.Time
	onPanic  func(v any) // sees a panic in the janitor (WithPanicHandler)
	seed     maphash.Seed

	shards [shardCount]shard
	// all counts every entry held, live or expired-but-unswept, and its
	// bytes; records counts the idempotency records among them (Acquire's),
	// which may take at most half of each bound, so that they never
	// starve tokens and nonces. A token's record (Redeem's) counts with
	// the tokens: it takes its token's place, and idempotency records
	// must not starve token routes either.
	all, records pool
	minExp       atomic.Int64 // no held entry expires before this (unix ns)
	sweep        sync.Mutex   // one reclaiming sweep at a time

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
	// tokenRecords counts the tokens' records (store.TokenRecordKey) in
	// m, so that a redemption looks for one only where one may be.
	tokenRecords int
	_            [40]byte // 24 bytes of fields + 40 = one 64-byte cache line per shard
}

// entry is a token, a nonce or a record. A token's record keeps the
// token's purpose and subject too, to compare them field by field.
type entry struct {
	purpose, subject string
	exp              int64   // unix ns
	rec              *record // set for an idempotency record only
	size             int64   // what the entry counts towards the byte bound
}

// pool counts entries and bytes against their bounds.
type pool struct {
	n, bytes       atomic.Int64
	maxN, maxBytes int64
	// full is set when the pool refused an addition, and cleared when an
	// addition to it succeeds again (see Store.count).
	full atomic.Bool
}

// add counts n entries and b bytes more, unless that would take the pool
// past a bound (force: the bytes may go past it): then it counts nothing
// and reports false. Taking away always succeeds.
func (p *pool) add(n, b int64, force bool) bool {
	nn, bb := p.n.Add(n), p.bytes.Add(b)
	if n > 0 && nn > p.maxN || b > 0 && bb > p.maxBytes && !force {
		p.n.Add(-n)
		p.bytes.Add(-b)
		return false
	}
	return true
}

// fits clears p's full flag: an addition to it succeeded.
func (p *pool) fits() {
	if p.full.Load() {
		p.full.Store(false)
	}
}

// isRecord reports whether the map key k holds an idempotency record
// (see recordKey), which counts in the records' pool. A token's record
// does not.
func isRecord(k string) bool {
	return len(k) >= 2 && k[0] == 0 && k[1] == 'r'
}

// sizeOf is what e, under the map key k, counts towards the byte bound.
func sizeOf(k string, e entry) int64 {
	n := entryOverhead + len(k) + len(e.purpose) + len(e.subject)
	if e.rec != nil {
		n += recordOverhead + len(e.rec.fingerprint) + len(e.rec.owner) + len(e.rec.response)
	}
	return int64(n)
}

// record is an idempotency record's content. A stored record is never
// modified: Complete stores a new one, so a reader may use the pointer
// it took under the shard lock after releasing the lock.
type record struct {
	completed          bool
	fingerprint, owner string
	response           []byte
	created            int64 // unix ns, when Acquire or Redeem opened it
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

// WithMaxEntries bounds how many entries (tokens, nonces and records
// together) the store holds at once; idempotency records (Acquire's) may
// take at most half of them, so that they never starve tokens, nonces
// and tokens' records (Redeem's, which count with the tokens). Exactly n live
// entries fit; redeeming, releasing or expiry frees a slot; Put, Redeem
// and Acquire past the bound return store.ErrFull and never evict a live
// entry. Defaults to DefaultMaxEntries (1,000,000); n <= 0 keeps the
// default.
func WithMaxEntries(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.all.maxN = int64(n)
		}
	}
}

// WithMaxBytes bounds the memory the store's entries take, in bytes:
// their keys, purposes, subjects and stored responses, plus a fixed
// overhead each (about 128 bytes, 224 for a record). Idempotency records
// may take at most half of it, as with WithMaxEntries. A Put, Redeem or Acquire that does not fit returns
// store.ErrFull; a Complete whose response does not fit returns it too
// (package idempotency then completes the record without the body). The
// process needs about twice this much for the Go heap to collect it.
// Defaults to DefaultMaxBytes (128 MiB); n <= 0 keeps the default.
func WithMaxBytes(n int64) Option {
	return func(s *Store) {
		if n > 0 {
			s.all.maxBytes = n
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

// WithPanicHandler sets f to see a panic in the janitor's goroutine
// before it goes on: f can log it and flush the logs, since the panic
// still ends the process, as any unrecovered panic in a goroutine does
// (the janitor may hold a shard's lock: going on would stall the store),
// and then no deferred call of any other goroutine runs. Defaults to
// none.
func WithPanicHandler(f func(v any)) Option {
	return func(s *Store) { s.onPanic = f }
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
		maxKeys:  DefaultMaxLimiterKeys,
		interval: DefaultJanitorInterval,
		now:      time.Now,
		seed:     maphash.MakeSeed(),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	s.all.maxN, s.all.maxBytes = DefaultMaxEntries, DefaultMaxBytes
	for _, o := range opts {
		o(s)
	}
	s.records.maxN, s.records.maxBytes = s.all.maxN/2, s.all.maxBytes/2
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
	e.size = sizeOf(k, e)
	if !s.reserve(k, e.size, now) {
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
			s.uncount(k, e)
			return old, false, nil
		}
		s.uncount(k, old) // replacing an expired entry
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

// reserve counts one entry of size bytes under the map key k towards the
// bounds, reclaiming expired entries first when it does not fit and some
// may have expired.
func (s *Store) reserve(k string, size, now int64) bool {
	for swept := false; ; swept = true {
		if s.count(k, 1, size, false) {
			return true
		}
		if swept || now < s.minExp.Load() {
			return false
		}
		s.reclaim(now)
	}
}

// count adds n entries and b bytes under the map key k to the pools, or
// nothing and false when they do not fit (see pool.add). The pool that
// refused is marked full; a growth that fits (not a forced one) clears
// the marks of the pools it went into.
func (s *Store) count(k string, n, b int64, force bool) bool {
	rec := isRecord(k)
	if rec && !s.records.add(n, b, force) {
		s.records.full.Store(true)
		return false
	}
	if !s.all.add(n, b, force) {
		if rec {
			s.records.add(-n, -b, false)
		}
		s.all.full.Store(true)
		return false
	}
	if (n > 0 || b > 0) && !force {
		s.all.fits()
		if rec {
			s.records.fits()
		}
	}
	return true
}

// uncount takes e, held under the map key k, out of the pools.
func (s *Store) uncount(k string, e entry) { s.count(k, -1, -e.size, false) }

// drop deletes the entry e under k from sh, whose lock the caller holds.
func (s *Store) drop(sh *shard, k string, e entry) {
	delete(sh.m, k)
	if _, ok := store.TokenOfRecord(k); ok {
		sh.tokenRecords--
	}
	s.uncount(k, e)
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
				s.drop(sh, k, e)
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
	_, ok := s.liveEntryLocked(sh, k, now)
	return ok
}

// liveEntryLocked is liveLocked that also returns the live entry.
func (s *Store) liveEntryLocked(sh *shard, k string, now int64) (entry, bool) {
	e, ok := sh.m[k]
	if ok && e.exp <= now {
		s.drop(sh, k, e)
		return entry{}, false
	}
	return e, ok
}

// redeemLocked compares the token under id with want. When it matches
// and owner is empty, the token is deleted: Redeemed. When it matches and
// owner is not, nothing changes and open is true: the caller opens the
// record. The caller holds id's shard lock and has checked the record.
func (s *Store) redeemLocked(sh *shard, id string, want store.Token, owner string, now int64) (res store.RedeemResult, open bool) {
	e, ok := s.liveEntryLocked(sh, id, now)
	if !ok {
		return store.Absent, false
	}
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
	s.drop(sh, id, e)
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
	rk := store.TokenRecordKey(id)
	r := &record{fingerprint: want.Fingerprint(), owner: owner, created: now}
	e := entry{purpose: want.Purpose, subject: want.Subject, exp: exp, rec: r}
	e.size = sizeOf(rk, e)
	reserved := s.reserve(rk, e.size, now)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	res, rec, open = s.redeemRecordLocked(sh, id, want, owner, now)
	switch {
	case !open:
		if reserved {
			s.uncount(rk, e)
		}
		return res, rec, nil
	case !reserved:
		return 0, store.Record{}, store.ErrFull
	}
	sh.m[rk] = e
	sh.tokenRecords++
	s.lowerMinExp(exp)
	return store.Redeemed, r.export(), nil
}

// redeemRecordLocked is Redeem's decision under id's shard lock:
// the live record when there is one, else redeemLocked's.
func (s *Store) redeemRecordLocked(sh *shard, id string, want store.Token, owner string, now int64) (store.RedeemResult, store.Record, bool) {
	if sh.tokenRecords == 0 {
		res, open := s.redeemLocked(sh, id, want, owner, now)
		return res, store.Record{}, open
	}
	rk := store.TokenRecordKey(id)
	if e, ok := s.liveEntryLocked(sh, rk, now); ok {
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
	r := &record{fingerprint: fingerprint, owner: owner, created: now}
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
func (s *Store) update(ctx context.Context, op, key, owner string, dropToken bool, f func(e entry) (entry, error)) (bool, error) {
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
		s.drop(sh, k, e)
		return false, nil
	case e.rec == nil || e.rec.completed || (owner != "" && e.rec.owner != owner):
		return false, nil
	}
	old := e
	e, err := f(e)
	if err != nil {
		return false, err
	}
	if id, ok := store.TokenOfRecord(k); ok && dropToken {
		if t, ok := sh.m[id]; ok {
			s.drop(sh, id, t)
		}
	}
	if e.exp <= now {
		s.drop(sh, k, old)
		return true, nil
	}
	if e.size = sizeOf(k, e); e.size != old.size {
		// A growth within completeSlack is let past the byte bound, so
		// that a record can always be completed without its body.
		if !s.count(k, 0, e.size-old.size, e.size-old.size <= completeSlack) {
			return false, store.ErrFull
		}
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
	return s.update(ctx, "renew", key, owner, false, func(e entry) (entry, error) {
		e.exp = expiry(s.now().UnixNano(), lease)
		return e, nil
	})
}

// Complete implements store.Store. The store keeps its own copy of
// response. A keep <= 0 completes the record and ends it at once: ok is
// true and the next Acquire acquires. Completing a token's record deletes
// the token. A response that takes the store past its byte bound
// (WithMaxBytes) by more than a few hundred bytes is store.ErrFull, and
// the record stays processing.
func (s *Store) Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (bool, error) {
	resp := bytes.Clone(response) // outside the shard lock
	return s.update(ctx, "complete", key, owner, true, func(e entry) (entry, error) {
		e.exp = expiry(s.now().UnixNano(), keep)
		e.rec = &record{completed: true, fingerprint: e.rec.fingerprint, owner: owner, response: resp, created: e.rec.created}
		return e, nil
	})
}

// Release implements store.Store.
func (s *Store) Release(ctx context.Context, key, owner string) (bool, error) {
	return s.update(ctx, "release", key, owner, false, func(e entry) (entry, error) {
		e.exp = math.MinInt64 // deleted by update
		return e, nil
	})
}

// Lookup implements store.Store: it reads the live record under key
// under its shard's lock, on the store's clock (WithClock), and changes
// nothing: an expired entry is left for the janitor.
func (s *Store) Lookup(ctx context.Context, key string) (store.Record, bool, error) {
	if err := s.check(ctx, "lookup"); err != nil {
		return store.Record{}, false, err
	}
	if _, ok := store.TokenOfRecord(key); store.Reserved(key) && !ok {
		return store.Record{}, false, nil
	}
	now := s.now().UnixNano()
	k := recordKey(key)
	sh := &s.shards[s.shardIndex(k)]
	sh.mu.Lock()
	e, ok := sh.m[k]
	sh.mu.Unlock()
	if !ok || e.exp <= now || e.rec == nil {
		return store.Record{}, false, nil
	}
	rec := e.rec.export() // the record is never modified: see record
	rec.Created, rec.Expires = time.Unix(0, e.rec.created), time.Unix(0, e.exp)
	return rec, true, nil
}

// Usage implements store.Usager: what the store holds against its bounds.
// Expired entries the janitor has not removed yet still count.
func (s *Store) Usage() store.Usage {
	return store.Usage{
		Entries: s.all.n.Load(), Bytes: s.all.bytes.Load(),
		MaxEntries: s.all.maxN, MaxBytes: s.all.maxBytes,
		Records: s.records.n.Load(), RecordBytes: s.records.bytes.Load(),
		MaxRecords: s.records.maxN, MaxRecordBytes: s.records.maxBytes,
		Full: s.all.full.Load(), RecordsFull: s.records.full.Load(),
	}
}

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
	lim := s.limiterLocked(sh, key, l)
	if lim == nil {
		return false, s.interval, nil
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

// Charge counts an event of weight n for key against l, as Allow counts
// one of weight 1 in the same bucket (guard.WithAddressBytes counts a
// stored response's bytes with it): n over l.Burst counts as l.Burst. The
// weight is taken even when less than n is left: the bucket then owes the
// rest, and Allow refuses the key until it has refilled. fits reports
// whether n was left (false, too, when the store tracks as many keys as
// WithMaxLimiterKeys lets it). err is for system failures only.
func (s *Store) Charge(ctx context.Context, key string, l store.Limit, n int) (fits bool, err error) {
	if err := s.check(ctx, "charge"); err != nil {
		return false, err
	}
	if l.IsZero() || n <= 0 {
		return true, nil
	}
	now := s.now()
	sh := &s.limiters[s.shardIndex(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	lim := s.limiterLocked(sh, key, l)
	if lim == nil {
		return false, nil
	}
	r := lim.ReserveN(now, min(n, lim.Burst())) // not canceled: a debt stays
	return r.OK() && r.DelayFrom(now) == 0, nil
}

// limiterLocked returns key's bucket in sh, whose lock the caller holds,
// made for l when there is none; nil when the store tracks as many keys
// as it may.
func (s *Store) limiterLocked(sh *limShard, key string, l store.Limit) *rate.Limiter {
	if lim, ok := sh.m[key]; ok {
		return lim
	}
	if s.nLim.Add(1) > s.maxKeys {
		s.nLim.Add(-1)
		return nil
	}
	lim := rate.NewLimiter(rate.Limit(float64(l.Rate)/l.Period.Seconds()), max(l.Burst, 1))
	sh.m[key] = lim
	return lim
}

// Ping implements store.Store. It fails after Close, and with
// store.ErrFull while the store is full: an entry that did not fit its
// bound (after expired ones were reclaimed) was refused, and none has
// fit it since, so new tokens and nonces are refused. A store whose
// records' half alone is full (Usage's RecordsFull) still answers: it
// serves tokens, nonces and the records it holds, and refuses only new
// idempotency records.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.check(ctx, "ping"); err != nil {
		return err
	}
	if u := s.Usage(); u.Full {
		return fmt.Errorf("%w: memory: %d entries of %d, %d bytes of %d; records %d of %d, %d bytes of %d",
			store.ErrFull, u.Entries, u.MaxEntries, u.Bytes, u.MaxBytes, u.Records, u.MaxRecords, u.RecordBytes, u.MaxRecordBytes)
	}
	return nil
}

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
	if f := s.onPanic; f != nil {
		defer func() {
			if v := recover(); v != nil {
				f(v)
				panic(v)
			}
		}()
	}
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
