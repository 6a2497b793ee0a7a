package pgtx

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store"
)

// Defaults of the options below.
const (
	// DefaultLockTimeout bounds how long a duplicate waits for the first
	// request's transaction before it is answered 409
	// request_in_progress.
	DefaultLockTimeout = 5 * time.Second
)

// Option configures pgtx's runs.
type Option func(*settings)

type settings struct {
	lockTimeout time.Duration
	retention   time.Duration
	maxBody     int
	guard       []guard.Option
}

func newSettings(opts []Option) *settings {
	s := &settings{lockTimeout: DefaultLockTimeout, retention: idempotency.DefaultRetention, maxBody: idempotency.DefaultMaxBody}
	for _, o := range opts {
		o(s)
	}
	return s
}

// WithLockTimeout bounds how long a duplicate waits on the row lock of
// the first request's transaction, to get its committed outcome; past it
// the duplicate gets idempotency.ErrInProgress (409 request_in_progress
// with Retry-After). It is the transaction's lock_timeout, so it bounds
// every lock wait of the application's statements in it too. Defaults to
// DefaultLockTimeout (5s); d <= 0 keeps the default.
func WithLockTimeout(d time.Duration) Option {
	return func(s *settings) {
		if d > 0 {
			s.lockTimeout = d
		}
	}
}

// WithRetention sets how long a recorded outcome is kept, from the
// commit. Defaults to idempotency.DefaultRetention (24h); d <= 0 keeps the
// default.
func WithRetention(d time.Duration) Option {
	return func(s *settings) {
		if d > 0 {
			s.retention = d
		}
	}
}

// WithMaxBody caps the body of a recorded outcome at n bytes; a longer one
// is recorded without it, and duplicates get idempotency.ErrNotStored.
// Defaults to idempotency.DefaultMaxBody (1 MiB); n <= 0 keeps the
// default.
func WithMaxBody(n int) Option {
	return func(s *settings) {
		if n > 0 {
			s.maxBody = n
		}
	}
}

// WithGuard passes options to the HTTP middleware's rules (Idempotent):
// the scope, methods, ignored fields, release statuses, body limit,
// logger and error handler of package guard.
func WithGuard(opts ...guard.Option) Option {
	return func(s *settings) { s.guard = append(s.guard, opts...) }
}

// Undo, wrapped in the error Do's function returns, rolls the function's
// writes back but records its outcome, so every retry gets the same
// answer: a refusal that depends on the request, not on the moment (the
// HTTP middleware does this for a 4xx).
var Undo = errors.New("pgtx: undo the writes, record the outcome")

// savepoint is where an outcome that undoes the work rolls back to: right
// after the claim.
const savepoint = "replayguard_claimed"

// run is one execution in a transaction that holds its key's claim.
type run struct {
	s     *settings
	tx    Tx
	key   string
	owner []byte
}

// begin opens a transaction on db with the lock timeout set.
func (s *settings) begin(ctx context.Context, db DB) (Tx, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fail("begin", err)
	}
	// SET LOCAL takes no parameters; the value is an integer we format.
	if err := tx.Exec(ctx, "SET LOCAL lock_timeout = "+strconv.FormatInt(s.lockTimeout.Milliseconds(), 10)); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fail("begin", err)
	}
	return tx, nil
}

// claim claims key for a request with fingerprint in tx, with
// replayguard_acquire (store/postgres's migrations): the claim is a row
// of replayguard_records that no other transaction sees until tx commits.
// A concurrent claim of the same key waits on it, up to the lock timeout;
// once it commits, the duplicate reads its outcome; if it rolls back, the
// duplicate claims. claimed false comes with the stored outcome or the
// reason (idempotency.ErrFingerprintMismatch, ErrInProgress, ErrNotStored,
// a failure wrapping store.ErrUnavailable).
func (s *settings) claim(ctx context.Context, tx Tx, key, fingerprint string) (*run, idempotency.Outcome, error) {
	if key == "" || store.Reserved(key) {
		return nil, idempotency.Outcome{}, fmt.Errorf("%w: the key is empty or reserved", idempotency.ErrInvalidKey)
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, idempotency.Outcome{}, fail("claim", err)
	}
	owner := []byte(hex.EncodeToString(b[:]))
	var (
		acquired, completed bool
		fp, recOwner, resp  []byte
	)
	err := tx.QueryRow(ctx, `SELECT acquired, completed, fingerprint, owner, response FROM replayguard_acquire($1, $2, $3, $4)`,
		[]byte(key), []byte(fingerprint), owner, s.retention.Microseconds()).Scan(&acquired, &completed, &fp, &recOwner, &resp)
	switch {
	case err != nil:
		return nil, idempotency.Outcome{}, fail("claim", err)
	case !acquired && !bytes.Equal(fp, []byte(fingerprint)):
		return nil, idempotency.Outcome{}, idempotency.ErrFingerprintMismatch
	case !acquired && !completed:
		return nil, idempotency.Outcome{}, idempotency.ErrInProgress
	case !acquired:
		var out idempotency.Outcome
		if err := out.UnmarshalBinary(resp); err != nil {
			return nil, idempotency.Outcome{}, err
		}
		if out.BodyOmitted {
			return nil, out, idempotency.ErrNotStored
		}
		return nil, out, nil
	}
	if err := tx.Exec(ctx, "SAVEPOINT "+savepoint); err != nil {
		return nil, idempotency.Outcome{}, fail("claim", err)
	}
	return &run{s: s, tx: tx, key: key, owner: owner}, idempotency.Outcome{}, nil
}

// complete records out in the claim and commits: the work and the record
// become visible at once. With undo, the work since the claim is rolled
// back first and only the record commits. An error that wraps
// idempotency.ErrRolledBack means nothing was committed.
func (r *run) complete(ctx context.Context, out idempotency.Outcome, undo bool) error {
	ctx = context.WithoutCancel(ctx) // the work is done: record it even if the client left
	if len(out.Body) > r.s.maxBody {
		out.Body, out.BodyOmitted = nil, true
	}
	data, _ := out.MarshalBinary()
	err := func() error {
		if undo {
			if err := r.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
				return err
			}
		}
		var ok bool
		if err := r.tx.QueryRow(ctx, `SELECT replayguard_complete($1, $2, $3, $4)`,
			[]byte(r.key), r.owner, data, r.s.retention.Microseconds()).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errors.New("the claim is gone")
		}
		return r.tx.Commit(ctx)
	}()
	if err != nil {
		_ = r.tx.Rollback(ctx)
		return fmt.Errorf("%w: %w", idempotency.ErrRolledBack, fail("commit", err))
	}
	return nil
}

// rollback undoes the work and the claim: the key is free again.
func (r *run) rollback(ctx context.Context) error {
	if err := r.tx.Rollback(context.WithoutCancel(ctx)); err != nil {
		return fail("rollback", err)
	}
	return nil
}

// fail is the error of a statement pgtx ran: a lock wait past the lock
// timeout is idempotency.ErrInProgress (the first transaction still holds
// the key), anything else wraps store.ErrUnavailable.
func fail(op string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" { // lock_not_available
		return fmt.Errorf("%w: the first request with this key is still running", idempotency.ErrInProgress)
	}
	return store.Unavailable("pgtx: "+op, err)
}

// Do runs fn at most once per key, inside a transaction of db's that
// claims the key as its first statement and commits fn's writes and its
// outcome together, so that a crash at any point leaves both or neither.
// A duplicate gets the committed outcome with replayed true, after waiting
// for a concurrent first run's transaction up to the lock timeout (then
// idempotency.ErrInProgress); another fingerprint is
// idempotency.ErrFingerprintMismatch. When fn returns an error wrapping
// Undo, its writes are rolled back and its outcome recorded; any other
// error, or a panic, rolls everything back, the claim included, so the
// next call with key runs fn as a first call. For a queue consumer, key is
// the message ID: a redelivered message commits nothing new.
func Do(ctx context.Context, db DB, key, fingerprint string, fn func(ctx context.Context, tx Tx) (idempotency.Outcome, error), opts ...Option) (out idempotency.Outcome, replayed bool, err error) {
	s := newSettings(opts)
	tx, err := s.begin(ctx, db)
	if err != nil {
		return idempotency.Outcome{}, false, err
	}
	r, stored, err := s.claim(ctx, tx, key, fingerprint)
	if r == nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return stored, err == nil, err
	}
	done := false
	defer func() {
		if !done {
			_ = r.rollback(ctx) // fn panicked
		}
	}()
	out, err = fn(ctx, tx)
	done = true
	switch {
	case errors.Is(err, Undo):
		return out, false, r.complete(ctx, out, true)
	case err != nil:
		if rerr := r.rollback(ctx); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return out, false, err
	}
	return out, false, r.complete(ctx, out, false)
}
