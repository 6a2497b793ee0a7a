package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Reserved key prefixes; see TokenRecordKey and NonceKey.
const (
	tokenRecordPrefix = "\x00t"
	noncePrefix       = "\x00n"
)

// TokenRecordKey returns the record key of token id's own record, as
// opened by Redeem: pass it to Renew, Complete and Release. A store keeps
// the record beside the token (in Redis, in the same hash slot), so that
// one atomic step can look at both.
func TokenRecordKey(id string) string { return tokenRecordPrefix + id }

// TokenOfRecord returns the token ID of a key made by TokenRecordKey, and
// false for any other key.
func TokenOfRecord(key string) (id string, ok bool) {
	if len(key) < len(tokenRecordPrefix) || key[:len(tokenRecordPrefix)] != tokenRecordPrefix {
		return "", false
	}
	return key[len(tokenRecordPrefix):], true
}

// NonceKey returns the key under which Put records nonce within scope (a
// client's key ID, say): "\x00n" + len(scope) + ":" + scope + ":" + nonce,
// with the length in decimal. It is unambiguous for every scope and
// nonce, whatever bytes they hold: the scope's length comes first.
func NonceKey(scope, nonce string) string {
	return noncePrefix + strconv.Itoa(len(scope)) + ":" + scope + ":" + nonce
}

// IsNonceKey reports whether key was made by NonceKey.
func IsNonceKey(key string) bool {
	return len(key) >= len(noncePrefix) && key[:len(noncePrefix)] == noncePrefix
}

// Reserved reports whether key is one of the store's own (it begins with
// "\x00"): never a token ID or a caller's record key.
func Reserved(key string) bool { return len(key) > 0 && key[0] == 0 }

var (
	// ErrUnavailable is wrapped by every error of a store that did not
	// confirm the operation: a network failure, a timeout, a canceled
	// context, a closed store. The outcome is unknown.
	ErrUnavailable = errors.New("store: unavailable")
	// ErrFull is returned by Put, Redeem and Acquire when a bounded store
	// holds as many live entries as it may. Live entries are never
	// evicted to make room. Nothing was stored.
	ErrFull = errors.New("store: full")
	// ErrClosed is returned by any call made after Close. It wraps
	// ErrUnavailable.
	ErrClosed = fmt.Errorf("%w: closed", ErrUnavailable)
)

// Unavailable returns err wrapped in ErrUnavailable, with op as context,
// unless it already wraps ErrUnavailable or is ErrFull. Stores call it on
// every error they return.
func Unavailable(op string, err error) error {
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrFull) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// Token is what the store keeps for one issued, unredeemed token.
type Token struct {
	// Purpose is the purpose the token was issued for. It never contains
	// a newline.
	Purpose string
	// Subject is the subject the token is bound to; empty when unbound.
	Subject string
}

// Fingerprint returns the fingerprint of the record that Redeem opens for
// t: t.Purpose + "\n" + t.Subject.
func (t Token) Fingerprint() string { return t.Purpose + "\n" + t.Subject }

// RedeemResult says what an atomic redemption found.
type RedeemResult int

// The outcomes of Redeem. Only Redeemed changes anything.
const (
	// Redeemed: the token was present, purpose and subject matched, and
	// it has now been deleted (without an owner) or taken by a new record
	// (with one). Exactly one caller ever sees this per token.
	Redeemed RedeemResult = iota + 1
	// Absent: no live token has this ID (never issued, already redeemed,
	// or expired).
	Absent
	// PurposeMismatch: the token exists but was issued for another purpose.
	// It stays valid.
	PurposeMismatch
	// SubjectMismatch: the purpose matched but the subject did not (also
	// when the token is bound and the caller gave no subject, or the token
	// is unbound and the caller gave one). It stays valid.
	SubjectMismatch
	// Recorded: the token has a live record, processing or completed,
	// with the caller's fingerprint. The token counts as taken.
	Recorded
)

// String returns the lowercase name of r, as used in metrics labels.
func (r RedeemResult) String() string {
	switch r {
	case Redeemed:
		return "redeemed"
	case Absent:
		return "absent"
	case PurposeMismatch:
		return "purpose_mismatch"
	case SubjectMismatch:
		return "subject_mismatch"
	case Recorded:
		return "recorded"
	}
	return "unknown"
}

// Store keeps issued tokens until they are redeemed or expire, nonces
// until their window has passed, and records of executions.
//
// Every method takes a context; implementations honour its deadline and
// return an error wrapping ErrUnavailable when they cannot confirm the
// operation (see the package documentation). Exactly one of any number of
// concurrent callers wins each set-if-absent (Put, Acquire) and each
// redemption.
type Store interface {
	// Put stores t under key if no live entry holds key, for ttl.
	// created is false and err is nil when a live entry already holds
	// key; the existing entry is left untouched. key is a token ID, or a
	// NonceKey, whose entry is a set-if-absent marker (t is then ignored):
	// created false means the nonce was seen before. A bounded store that
	// is full returns ErrFull.
	Put(ctx context.Context, key string, t Token, ttl time.Duration) (created bool, err error)

	// Redeem redeems token id for want and can open a record of the
	// execution it starts, under TokenRecordKey(id), in one atomic step:
	//
	//   - the token has a live record whose fingerprint is
	//     want.Fingerprint(): Recorded, and rec is that record,
	//     processing or completed; for another fingerprint,
	//     PurposeMismatch or SubjectMismatch as the record's fingerprint
	//     decides. Nothing changes;
	//   - else the token is absent (id may be any string; a reserved one
	//     is absent), or it does not match want: Absent, PurposeMismatch
	//     (another purpose) or SubjectMismatch (the same purpose, another
	//     subject). Nothing changes;
	//   - else, with an empty owner, the token is deleted: Redeemed, and
	//     rec is empty;
	//   - else the token is kept and a processing record with want's
	//     fingerprint, owned by owner and leased for lease, is opened
	//     beside it: Redeemed, and rec is the new record.
	//
	// While the token has a live record it is taken. When the lease ends
	// without Complete (a crash) the record is gone and the token, if still
	// live, can be redeemed again, once; Release deletes the record to the
	// same effect. Complete on the record key deletes the token, so it
	// cannot come back when the completed record expires. A lease <= 0
	// redeems without leaving a record: the token stays live. A bounded
	// store that is full returns ErrFull when it would open a record; the
	// other outcomes are answered as usual.
	Redeem(ctx context.Context, id string, want Token, owner string, lease time.Duration) (res RedeemResult, rec Record, err error)

	// Acquire opens a processing record under key, owned by owner and
	// leased for lease, when no live record exists: acquired is true and
	// rec is the new record. Otherwise acquired is false and rec is the
	// live record found, processing or completed. A bounded store that is
	// full returns ErrFull, except when a live record holds key: that is
	// found as usual. key must not be Reserved.
	Acquire(ctx context.Context, key, fingerprint, owner string, lease time.Duration) (rec Record, acquired bool, err error)

	// Renew extends the lease of owner's processing record under key to
	// lease from now. ok is false when the record is gone, completed or
	// held by another owner, and when owner is empty.
	Renew(ctx context.Context, key, owner string, lease time.Duration) (ok bool, err error)

	// Complete turns owner's processing record under key into a completed
	// record holding response (any bytes; the store keeps its own copy),
	// kept for keep, which replaces the lease. ok is false when the record
	// is gone, completed or held by another owner. When key is
	// TokenRecordKey(id), the token id is deleted too.
	//
	// For Complete and Release, an empty owner stands for any owner: the
	// live processing record is ended whoever holds it. It is for callers
	// that cannot name the execution (the HTTP API's backends that do not
	// send the lease they were given); an execution that knows its owner
	// names it, so that it never ends a later execution's record.
	Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (ok bool, err error)

	// Release deletes owner's processing record under key, so that a retry
	// runs. ok is false when the record is gone, completed or held by
	// another owner (an empty owner: see Complete).
	Release(ctx context.Context, key, owner string) (ok bool, err error)

	// Lookup returns the live record under key (a caller's record key, or
	// TokenRecordKey(id) for a token's record), processing or completed,
	// with Created and Expires set and its own copy of Response. found is
	// false and err is nil when no live record holds key: an ended lease or
	// retention is no record. A Reserved key other than a TokenRecordKey is
	// never found. Lookup changes nothing: it is for operators, who look at
	// a record before they end it with Release(ctx, key, "").
	Lookup(ctx context.Context, key string) (rec Record, found bool, err error)

	// Ping reports whether the store can serve requests now.
	Ping(ctx context.Context) error

	// Close releases the store's resources; it stops background work and
	// waits for it. Calls after Close return an error wrapping
	// ErrUnavailable (ErrClosed, or the client's own closed error for
	// stores that wrap a caller's client).
	Close() error
}

// Record is the record of an execution: processing while it runs under
// a lease, then completed with the outcome every duplicate gets.
type Record struct {
	// Completed is false while the record is processing.
	Completed bool
	// Fingerprint is the first request's fingerprint, so a reused key with
	// another request can be told apart. A token's record has the token's
	// Fingerprint.
	Fingerprint string
	// Owner identifies the execution that holds a processing record.
	Owner string
	// Response is a completed record's stored outcome, opaque to the store.
	// It is the caller's own copy.
	Response []byte
	// Created is when the record was opened (by Acquire, or by Redeem for
	// a token's record), on the store's clock; Renew and Complete keep it.
	// Lookup sets it; the other methods leave it zero. It is zero, too,
	// for a record opened before the store kept it (a PostgreSQL row from
	// before its migration 002, a Redis record opened by an earlier
	// release).
	Created time.Time
	// Expires is when the record ends unless it is renewed: the lease's
	// end while processing, the retention's end once completed, on the
	// store's clock. Lookup sets it; the other methods leave it zero.
	Expires time.Time
}

// Usage is what a bounded store holds against its bounds (see Usager).
// Records are the idempotency records (Acquire's) among the entries,
// which a store may bound apart (the memory store keeps them to half);
// tokens' records (Redeem's) count with the tokens.
type Usage struct {
	Entries, MaxEntries, Bytes, MaxBytes             int64
	Records, MaxRecords, RecordBytes, MaxRecordBytes int64
	// Full is true while the store refuses what does not fit its overall
	// bounds, such as a new token or nonce: Ping then returns ErrFull.
	Full bool
	// RecordsFull is true while the store refuses new idempotency
	// records, which have bounds of their own. Ping still succeeds: the
	// store serves tokens, nonces and the records it holds.
	RecordsFull bool
}

// Usager is a Store that is bounded and reports how full it is, such as
// the memory store.
type Usager interface {
	Usage() Usage
}

// Limit is a rate: Rate events per Period, with bursts of up to Burst.
type Limit struct {
	Rate   int
	Burst  int
	Period time.Duration
}

// IsZero reports whether l means "no limit".
func (l Limit) IsZero() bool { return l.Rate <= 0 }

// Limiter counts events per key against a Limit.
type Limiter interface {
	// Allow records one event for key. When the event is over the limit,
	// allowed is false and retryAfter says when the next one would be
	// allowed. err wraps ErrUnavailable, for system failures only.
	Allow(ctx context.Context, key string, l Limit) (allowed bool, retryAfter time.Duration, err error)
}
