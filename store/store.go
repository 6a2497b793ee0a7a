// Package store defines the storage contract behind Replayguard.
//
// The contract uses only built-in types so that implementations
// (store/memory, store/redis) never import the packages that use them.
// Every implementation is checked by the one conformance suite in
// store/storetest.
package store

import (
	"context"
	"errors"
	"time"
)

// TokenRecordPrefix begins every record key that names a token's record
// (see TokenRecordKey). Record keys beginning with "\x00" are reserved
// for the stores' own use: callers of Acquire must not choose them.
const TokenRecordPrefix = "\x00t"

// TokenRecordKey returns the record key of token id's record, as opened
// by RedeemRecord: pass it to Renew, Complete and Release. A store keeps
// the record beside the token (in Redis, in the same hash slot), so that
// one atomic step can look at both.
func TokenRecordKey(id string) string { return TokenRecordPrefix + id }

// Fingerprint returns the fingerprint of a record that RedeemRecord opens
// for t: t.Purpose + "\n" + t.Subject.
func (t Token) Fingerprint() string { return t.Purpose + "\n" + t.Subject }

var (
	// ErrFull is returned by PutToken, PutNonce, Acquire and RedeemRecord
	// when a bounded store holds as many live entries as it may. Live
	// entries are never evicted to make room.
	ErrFull = errors.New("store: full")
	// ErrClosed is returned by any call made after Close.
	ErrClosed = errors.New("store: closed")
)

// Token is what the store keeps for one issued, unredeemed token.
type Token struct {
	// Purpose is the purpose the token was issued for.
	Purpose string
	// Subject is the subject the token is bound to; empty when unbound.
	Subject string
}

// RedeemResult says what an atomic redemption found.
type RedeemResult int

// The outcomes of RedeemToken and RedeemRecord. Only Redeemed removes
// the token (or, for RedeemRecord with an owner, marks it taken by a
// record).
const (
	// Redeemed: the token was present, purpose and subject matched, and it
	// has now been deleted. Exactly one caller ever sees this per token.
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
	// Recorded: the token has a live record, processing or completed
	// (RedeemRecord only). The token counts as taken.
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

// Store keeps issued tokens until they are redeemed or expire.
//
// Every method takes a context; implementations honour its deadline and
// return an error when they cannot confirm the operation. An error means
// "unknown outcome, treat as failure": callers must never report success
// on an error. Errors are for system failures only; a missing token is
// Absent with a nil error.
type Store interface {
	// PutToken stores t under id if no live entry has that id, expiring at
	// expiresAt (never later). created is false and err is nil when a live
	// entry already holds id; the existing entry is left untouched.
	// A bounded store that is full returns ErrFull.
	PutToken(ctx context.Context, id string, t Token, expiresAt time.Time) (created bool, err error)

	// RedeemToken atomically compares the live entry under id with want
	// and deletes it only when both Purpose and Subject are equal. The
	// result tells which of the outcomes happened; err is nil for all of
	// them and reserved for system failures. While the token has a live
	// record (see RedeemRecord) it is taken: the result is Absent and
	// nothing changes.
	RedeemToken(ctx context.Context, id string, want Token) (RedeemResult, error)

	// RedeemRecord redeems token id for want and can open a record of the
	// execution it starts, under TokenRecordKey(id), in one atomic step:
	//
	//   - the token has a live record whose fingerprint is
	//     want.Fingerprint(): Recorded, and rec is that record,
	//     processing or completed; for another fingerprint,
	//     PurposeMismatch or SubjectMismatch as RedeemToken decides them.
	//     Nothing changes;
	//   - else the token is absent or does not match want: Absent,
	//     PurposeMismatch or SubjectMismatch, as RedeemToken. Nothing
	//     changes;
	//   - else, with an empty owner, the token is deleted as by
	//     RedeemToken: Redeemed, and rec is empty;
	//   - else the token is kept and a processing record with want's
	//     fingerprint, owned by owner and leased until leaseUntil, is
	//     opened beside it: Redeemed, and rec is the new record.
	//
	// A token with a live record is taken: RedeemToken answers Absent.
	// When the lease ends without Complete (a crash) the record is gone
	// and the token, if still live, can be redeemed again, once; Release
	// deletes the record to the same effect. Complete on the record key
	// deletes the token, so it cannot come back when the completed record
	// expires. Renew works as for any record.
	//
	// Exactly one of any number of concurrent callers gets Redeemed. A
	// leaseUntil that has already passed redeems without leaving a record,
	// as for Acquire: the token stays live. A bounded store that is full returns ErrFull when it
	// would open a record; the other outcomes are answered as usual.
	RedeemRecord(ctx context.Context, id string, want Token, owner string, leaseUntil time.Time) (res RedeemResult, rec Record, err error)

	// PutNonce records nonce within scope (a client's key ID, say) until
	// expiresAt, if no live record of it exists. fresh is false and err is
	// nil when one does: the nonce was seen before, a replay. Exactly one
	// of any number of concurrent callers sees fresh. A bounded store that
	// is full returns ErrFull. scope and nonce may hold any bytes.
	PutNonce(ctx context.Context, scope, nonce string, expiresAt time.Time) (fresh bool, err error)

	// Acquire opens a processing record under key, owned by owner and
	// leased until leaseUntil, when no live record exists: acquired is
	// true. Otherwise acquired is false and rec is the live record found,
	// processing or completed. Exactly one of any number of concurrent
	// callers acquires a key. When acquired, rec is the new record. A
	// bounded store that is full returns ErrFull, except when a live record
	// holds key: that is found as usual. Keys beginning with "\x00" are
	// reserved (see TokenRecordPrefix).
	//
	// For Acquire, Renew and Complete, an expiry time that has already
	// passed acts as if set and reached at once: the call succeeds and
	// leaves no record, so the next Acquire acquires.
	Acquire(ctx context.Context, key, fingerprint, owner string, leaseUntil time.Time) (rec Record, acquired bool, err error)

	// Renew extends the lease of owner's processing record under key to
	// leaseUntil. ok is false when the record is gone, completed or held
	// by another owner, and when owner is empty.
	Renew(ctx context.Context, key, owner string, leaseUntil time.Time) (ok bool, err error)

	// Complete turns owner's processing record under key into a completed
	// record holding response (any bytes; the store keeps its own copy),
	// kept until keepUntil, which replaces the lease's expiry. ok is false
	// when the record is gone, completed or held by another owner. When
	// key is TokenRecordKey(id), the token id is deleted too.
	//
	// For Complete and Release, an empty owner stands for any owner: the
	// live processing record is ended whoever holds it. It is for callers
	// that cannot name the execution (the HTTP API's backends that do not
	// send the lease they were given); an execution that knows its owner
	// names it, so that it never ends a later execution's record.
	Complete(ctx context.Context, key, owner string, response []byte, keepUntil time.Time) (ok bool, err error)

	// Release deletes owner's processing record under key, so that a retry
	// runs. ok is false when the record is gone, completed or held by
	// another owner (an empty owner: see Complete).
	Release(ctx context.Context, key, owner string) (ok bool, err error)

	// Ping reports whether the store can serve requests now.
	Ping(ctx context.Context) error

	// Close releases the store's resources; it stops background work and
	// waits for it. Calls after Close return ErrClosed (or the client's own
	// closed error for stores that wrap a caller's client).
	Close() error
}

// Record is an idempotency record: processing while its first execution
// runs under a lease, then completed with the outcome every duplicate
// gets.
type Record struct {
	// Completed is false while the record is processing.
	Completed bool
	// Fingerprint is the first request's fingerprint, so a reused key with
	// another request can be told apart. A token's record (RedeemRecord)
	// has the token's Fingerprint.
	Fingerprint string
	// Owner identifies the execution that holds a processing record.
	Owner string
	// Response is a completed record's stored outcome, opaque to the store.
	// It is the caller's own copy.
	Response []byte
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
	// allowed. err is for system failures only.
	Allow(ctx context.Context, key string, l Limit) (allowed bool, retryAfter time.Duration, err error)
}
