package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/store"
)

// The scripts, one atomic step each. Run sends EVALSHA
// and falls back to EVAL when the server answers NOSCRIPT.
var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed complete.lua
	completeSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed redeem.lua
	redeemSrc string
	//go:embed lookup.lua
	lookupSrc string

	acquire  = goredis.NewScript(acquireSrc)
	renew    = goredis.NewScript(renewSrc)
	complete = goredis.NewScript(completeSrc)
	release  = goredis.NewScript(releaseSrc)
	redeem   = goredis.NewScript(redeemSrc)
	lookup   = goredis.NewScript(lookupSrc)
)

// recordKey returns the Redis key that holds the record under key:
// prefix + "r:{" + key + "}". A token's own record, under the key
// store.TokenRecordKey(id), is prefix + "r:{" + id + "}t": it shares the
// token's hash tag (see tokenKey), so one script may touch both on Redis
// Cluster, and its trailing "t" sets it apart from every other record's
// key, which ends in "}".
//
// The record is a hash with the fields s ("p" while processing, "c" once
// completed), f (fingerprint), o (owner), r (the response, completed
// records only) and t (when Acquire or Redeem opened it: microseconds
// since the Unix epoch on the server's clock, absent from records opened
// by earlier releases), expiring at the lease's end or, once completed,
// at the end of its retention.
func (s *Store) recordKey(key string) string {
	if id, ok := store.TokenOfRecord(key); ok {
		return s.prefix + "r:{" + id + "}t"
	}
	return s.prefix + "r:{" + key + "}"
}

// ownedKeys are the KEYS of a script acting on the record under key: the
// record's key, and for a token's record with withToken, the token's key.
func (s *Store) ownedKeys(key string, withToken bool) []string {
	if id, ok := store.TokenOfRecord(key); ok && withToken {
		return []string{s.recordKey(key), s.tokenKey(id)}
	}
	return []string{s.recordKey(key)}
}

// Acquire implements store.Store with one Lua script (acquire.lua) that
// reads the record under key and creates it when absent, so exactly one
// of any number of concurrent callers acquires, and the others get the
// record found in the same round trip. When acquired, rec is the new
// processing record.
//
// The lease runs on the Redis server's clock (PEXPIRE). A lease <= 0
// acquires without leaving a record, as if it had expired at once: a later
// Renew, Complete or Release reports false. A Redis at its maxmemory
// limit with the noeviction policy refuses the write: store.ErrFull.
func (s *Store) Acquire(ctx context.Context, key, fingerprint, owner string, lease time.Duration) (store.Record, bool, error) {
	ctx, cancel, err := s.begin(ctx, "acquire")
	if err != nil {
		return store.Record{}, false, err
	}
	defer cancel()
	if store.Reserved(key) {
		return store.Record{}, false, fail("acquire", errors.New("the key is reserved for the store"))
	}
	rk := s.recordKey(key)
	c, err := s.open(ctx, rk)
	if err != nil {
		return store.Record{}, false, fail("acquire", err)
	}
	defer c.close()
	v, err := acquire.Run(ctx, c.w, []string{rk}, fingerprint, owner, millis(lease)).Slice()
	if err != nil {
		return store.Record{}, false, c.fail("acquire", err)
	}
	if len(v) == 1 && v[0] == int64(1) {
		if err := s.confirm(ctx, "acquire", c); err != nil {
			return store.Record{}, false, err
		}
		return store.Record{Fingerprint: fingerprint, Owner: owner}, true, nil
	}
	if len(v) != 5 || v[0] != int64(0) {
		return store.Record{}, false, unexpectedReply("acquire", v)
	}
	rec, ok := parseRecord(v[1:])
	if !ok {
		return store.Record{}, false, unexpectedReply("acquire", v)
	}
	return rec, false, nil
}

// unexpectedReply is the error for a script reply of the wrong shape. It
// tells the shape only (element types and lengths): a record's elements
// hold a stored response, which may carry an app's cookies or personal
// data and must not reach a log line.
func unexpectedReply(op string, v []any) error {
	shape := make([]string, len(v))
	for i, e := range v {
		switch e := e.(type) {
		case string:
			shape[i] = fmt.Sprintf("string(%d bytes)", len(e))
		case int64:
			shape[i] = fmt.Sprint(e)
		default:
			shape[i] = fmt.Sprintf("%T", e)
		}
	}
	return fail(op, fmt.Errorf("unexpected script reply [%s]", strings.Join(shape, " ")))
}

// parseRecord reads the fields s, f, o and r of a record a script found.
func parseRecord(v []any) (store.Record, bool) {
	var f [4]string
	for i := range f {
		str, ok := v[i].(string)
		if !ok {
			return store.Record{}, false
		}
		f[i] = str
	}
	rec := store.Record{Completed: f[0] == "c", Fingerprint: f[1], Owner: f[2]}
	if rec.Completed {
		rec.Response = []byte(f[3])
	}
	return rec, true
}

// Renew implements store.Store with one Lua script (renew.lua) that checks
// the owner and state and sets the key's expiry to lease from now. A lease
// <= 0 ends the record at once: ok is true and the next Acquire acquires.
func (s *Store) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	return s.runOwned(ctx, "renew", renew, s.ownedKeys(key, false), owner, millis(lease))
}

// Complete implements store.Store with one Lua script (complete.lua) that
// checks the owner and state, stores response (any bytes) and replaces the
// lease with keep. A keep <= 0 completes and ends the record at once: ok is
// true and the next Acquire acquires. Completing a token's record deletes
// the token in the same script.
func (s *Store) Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (bool, error) {
	return s.runOwned(ctx, "complete", complete, s.ownedKeys(key, true), owner, response, millis(keep))
}

// Release implements store.Store with one Lua script (release.lua) that
// checks the owner and state and deletes the record.
func (s *Store) Release(ctx context.Context, key, owner string) (bool, error) {
	return s.runOwned(ctx, "release", release, s.ownedKeys(key, false), owner)
}

// runOwned runs one of the scripts that act on an owner's processing
// record: ARGV[1] is the owner, the reply 1 (done) or 0 (not that owner's
// processing record).
func (s *Store) runOwned(ctx context.Context, op string, script *goredis.Script, keys []string, owner string, args ...any) (bool, error) {
	ctx, cancel, err := s.begin(ctx, op)
	if err != nil {
		return false, err
	}
	defer cancel()
	c, err := s.open(ctx, keys[0])
	if err != nil {
		return false, fail(op, err)
	}
	defer c.close()
	n, err := script.Run(ctx, c.w, keys, append([]any{owner}, args...)...).Int64()
	if err != nil {
		return false, c.fail(op, err)
	}
	switch n {
	case 0:
		return false, nil
	case 1:
		if err := s.confirm(ctx, op, c); err != nil {
			return false, err
		}
		return true, nil
	}
	return false, fail(op, fmt.Errorf("unexpected script reply %d", n))
}

// Redeem implements store.Store with one Lua script (redeem.lua) over the
// token's key and its record's key, which share a hash slot: it answers
// from a live record, or compares the token and then deletes it (no owner)
// or opens a processing record beside it, so exactly one of any number of
// concurrent callers gets Redeemed.
//
// The lease runs on the Redis server's clock; a lease <= 0 redeems
// without leaving a record, and the token stays. A Redis at its maxmemory
// limit with the noeviction policy refuses to open a record
// (store.ErrFull), but still redeems without one: deleting a token is a
// write Redis allows when it is full.
func (s *Store) Redeem(ctx context.Context, id string, want store.Token, owner string, lease time.Duration) (store.RedeemResult, store.Record, error) {
	ctx, cancel, err := s.begin(ctx, "redeem")
	if err != nil {
		return 0, store.Record{}, err
	}
	defer cancel()
	if store.Reserved(id) {
		return store.Absent, store.Record{}, nil
	}
	value, purpose := redeemArgs(want)
	keys := []string{s.tokenKey(id), s.recordKey(store.TokenRecordKey(id))}
	c, err := s.open(ctx, keys[0])
	if err != nil {
		return 0, store.Record{}, fail("redeem", err)
	}
	defer c.close()
	v, err := redeem.Run(ctx, c.w, keys, value, purpose, owner, millis(lease)).Slice()
	if err != nil {
		return 0, store.Record{}, c.fail("redeem", err)
	}
	if len(v) == 0 {
		return 0, store.Record{}, unexpectedReply("redeem", v)
	}
	n, _ := v[0].(int64)
	switch {
	case n == replyRecorded && len(v) == 5:
		rec, ok := parseRecord(v[1:])
		if !ok {
			return 0, store.Record{}, unexpectedReply("redeem", v)
		}
		return store.Recorded, rec, nil
	case len(v) != 1:
		return 0, store.Record{}, unexpectedReply("redeem", v)
	}
	res, ok := redeemResult(n)
	if !ok {
		return 0, store.Record{}, unexpectedReply("redeem", v)
	}
	if res != store.Redeemed {
		return res, store.Record{}, nil
	}
	if err := s.confirm(ctx, "redeem", c); err != nil {
		return 0, store.Record{}, err
	}
	if owner != "" {
		return store.Redeemed, store.Record{Fingerprint: want.Fingerprint(), Owner: owner}, nil
	}
	return store.Redeemed, store.Record{}, nil
}

// Lookup implements store.Store with one Lua script (lookup.lua) that
// reads the record's hash, its remaining lifetime (PTTL) and the server's
// clock (TIME) in one round trip and changes nothing, so it never waits
// for replicas (WithMinReplicas). Created and Expires are on the Redis
// server's clock: Expires is the server's time plus the record's PTTL, to
// the millisecond. A record opened by an earlier release, which did not
// keep its opening time, has a zero Created.
func (s *Store) Lookup(ctx context.Context, key string) (store.Record, bool, error) {
	ctx, cancel, err := s.begin(ctx, "lookup")
	if err != nil {
		return store.Record{}, false, err
	}
	defer cancel()
	if _, ok := store.TokenOfRecord(key); store.Reserved(key) && !ok {
		return store.Record{}, false, nil
	}
	v, err := lookup.Run(ctx, s.writer, []string{s.recordKey(key)}).Slice()
	if err != nil {
		return store.Record{}, false, fail("lookup", err)
	}
	if len(v) == 1 && v[0] == int64(0) {
		return store.Record{}, false, nil
	}
	if len(v) != 9 || v[0] != int64(1) {
		return store.Record{}, false, unexpectedReply("lookup", v)
	}
	rec, ok := parseRecord(v[1:5])
	if !ok {
		return store.Record{}, false, unexpectedReply("lookup", v)
	}
	created, ok1 := v[5].(string)
	pttl, ok2 := v[6].(int64)
	sec, ok3 := v[7].(string)
	usec, ok4 := v[8].(string)
	now, ok5 := serverTime(sec, usec)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return store.Record{}, false, unexpectedReply("lookup", v)
	}
	if created != "" {
		us, err := strconv.ParseInt(created, 10, 64)
		if err != nil {
			return store.Record{}, false, unexpectedReply("lookup", v)
		}
		rec.Created = time.UnixMicro(us)
	}
	if pttl >= 0 { // -1: no expiry, which the store never leaves a record with
		rec.Expires = now.Add(time.Duration(pttl) * time.Millisecond)
	}
	return rec, true, nil
}

// serverTime is the instant of a TIME reply: seconds and microseconds.
func serverTime(sec, usec string) (time.Time, bool) {
	s, err1 := strconv.ParseInt(sec, 10, 64)
	us, err2 := strconv.ParseInt(usec, 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, false
	}
	return time.UnixMicro(s*1_000_000 + us), true
}
