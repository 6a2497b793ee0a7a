package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/store"
)

// The idempotency record scripts, one atomic step each. Run sends EVALSHA
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
	//go:embed redeem_record.lua
	redeemRecordSrc string

	acquire      = goredis.NewScript(acquireSrc)
	renew        = goredis.NewScript(renewSrc)
	complete     = goredis.NewScript(completeSrc)
	release      = goredis.NewScript(releaseSrc)
	redeemRecord = goredis.NewScript(redeemRecordSrc)
)

// RecordKey returns the Redis key that holds the idempotency record under
// key: prefix + "r:{" + key + "}". A token's own record, under the key
// store.TokenRecordKey(id), is prefix + "r:{" + id + "}t": it shares the
// token's hash tag (see TokenKey), so one script may touch both on Redis
// Cluster, and its trailing "t" sets it apart from every other record's
// key, which ends in "}".
//
// The record is a hash with the fields s ("p" while processing, "c" once
// completed), f (fingerprint), o (owner) and r (the response, completed
// records only), expiring at the lease's end or, once completed, at the
// end of its retention.
func (s *Store) RecordKey(key string) string {
	if id, ok := strings.CutPrefix(key, store.TokenRecordPrefix); ok {
		return s.prefix + "r:{" + id + "}t"
	}
	return s.prefix + "r:{" + key + "}"
}

// ownedKeys are the KEYS of a script acting on the record under key: the
// record's key, and for a token's record with withToken, the token's key.
func (s *Store) ownedKeys(key string, withToken bool) []string {
	if id, ok := strings.CutPrefix(key, store.TokenRecordPrefix); ok && withToken {
		return []string{s.RecordKey(key), s.TokenKey(id)}
	}
	return []string{s.RecordKey(key)}
}

// pexpireAt is t as a PEXPIREAT argument: Unix milliseconds, truncated.
// Times before 1970 become 1ms after it, which has passed on any server,
// so that Redis deletes the key rather than refusing the argument.
func pexpireAt(t time.Time) string {
	return strconv.FormatInt(max(t.UnixMilli(), 1), 10)
}

// Acquire implements store.Store with one Lua script (acquire.lua) that
// reads the record under key and creates it when absent, so exactly one
// of any number of concurrent callers acquires, and the others get the
// record found in the same round trip. When acquired, rec is the new
// processing record.
//
// The lease ends at leaseUntil by the Redis server's clock. A leaseUntil
// that has already passed there acquires without leaving a record, as if
// it had expired at once: a later Renew, Complete or Release reports false.
// Redis keeps no entry bound, so Acquire never returns store.ErrFull; a
// server at its maxmemory limit answers with an error instead.
func (s *Store) Acquire(ctx context.Context, key, fingerprint, owner string, leaseUntil time.Time) (store.Record, bool, error) {
	ctx, cancel, err := s.begin(ctx)
	if err != nil {
		return store.Record{}, false, fmt.Errorf("redis: acquire: %w", err)
	}
	defer cancel()
	v, err := acquire.Run(ctx, s.client, []string{s.RecordKey(key)}, fingerprint, owner, pexpireAt(leaseUntil)).Slice()
	if err != nil {
		return store.Record{}, false, fmt.Errorf("redis: acquire: %w", err)
	}
	if len(v) == 1 && v[0] == int64(1) {
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
	return fmt.Errorf("redis: %s: unexpected script reply [%s]", op, strings.Join(shape, " "))
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
// the owner and state and moves the key's expiry to leaseUntil. A
// leaseUntil that has already passed by the server's clock ends the record
// at once: ok is true and the next Acquire acquires.
func (s *Store) Renew(ctx context.Context, key, owner string, leaseUntil time.Time) (bool, error) {
	return s.runOwned(ctx, "renew", renew, s.ownedKeys(key, false), owner, pexpireAt(leaseUntil))
}

// Complete implements store.Store with one Lua script (complete.lua) that
// checks the owner and state, stores response (any bytes) and replaces the
// lease's expiry with keepUntil. A keepUntil that has already passed by the
// server's clock completes and ends the record at once: ok is true and the
// next Acquire acquires. Completing a token's record deletes the token in
// the same script.
func (s *Store) Complete(ctx context.Context, key, owner string, response []byte, keepUntil time.Time) (bool, error) {
	return s.runOwned(ctx, "complete", complete, s.ownedKeys(key, true), owner, response, pexpireAt(keepUntil))
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
	ctx, cancel, err := s.begin(ctx)
	if err != nil {
		return false, fmt.Errorf("redis: %s: %w", op, err)
	}
	defer cancel()
	n, err := script.Run(ctx, s.client, keys, append([]any{owner}, args...)...).Int64()
	if err != nil {
		return false, fmt.Errorf("redis: %s: %w", op, err)
	}
	switch n {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("redis: %s: unexpected script reply %d", op, n)
}

// RedeemRecord implements store.Store with one Lua script
// (redeem_record.lua) over the token's key and its record's key, which
// share a hash slot: it answers from a live record, or compares the token
// and then deletes it (no owner) or opens a processing record beside it,
// so exactly one of any number of concurrent callers gets Redeemed.
//
// The lease ends at leaseUntil by the Redis server's clock; one that has
// already passed there redeems without leaving a record, and the token
// stays. Redis keeps no entry bound, so RedeemRecord never returns
// store.ErrFull.
func (s *Store) RedeemRecord(ctx context.Context, id string, want store.Token, owner string, leaseUntil time.Time) (store.RedeemResult, store.Record, error) {
	ctx, cancel, err := s.begin(ctx)
	if err != nil {
		return 0, store.Record{}, fmt.Errorf("redis: redeem record: %w", err)
	}
	defer cancel()
	value, purpose := redeemArgs(want)
	keys := []string{s.TokenKey(id), s.RecordKey(store.TokenRecordKey(id))}
	v, err := redeemRecord.Run(ctx, s.client, keys, value, purpose, owner, pexpireAt(leaseUntil)).Slice()
	if err != nil {
		return 0, store.Record{}, fmt.Errorf("redis: redeem record: %w", err)
	}
	if len(v) == 0 {
		return 0, store.Record{}, unexpectedReply("redeem record", v)
	}
	n, _ := v[0].(int64)
	switch {
	case n == replyRecorded && len(v) == 5:
		rec, ok := parseRecord(v[1:])
		if !ok {
			return 0, store.Record{}, unexpectedReply("redeem record", v)
		}
		return store.Recorded, rec, nil
	case len(v) != 1:
		return 0, store.Record{}, unexpectedReply("redeem record", v)
	case n == replyRedeemed && owner != "":
		return store.Redeemed, store.Record{Fingerprint: want.Fingerprint(), Owner: owner}, nil
	}
	res, ok := redeemResult(n)
	if !ok {
		return 0, store.Record{}, unexpectedReply("redeem record", v)
	}
	return res, store.Record{}, nil
}
