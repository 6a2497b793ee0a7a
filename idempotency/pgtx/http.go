package pgtx

import (
	"context"
	"net/http"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
)

// Idempotent is HTTP middleware for net/http (and Gin, through
// guard.Gin) that runs a handler once per Idempotency-Key inside a
// transaction of db's: it opens the transaction, claims the key as its
// first statement, hands the transaction to the handler in the request
// context (PgxFrom, SQLFrom, From), and records the response in the same
// transaction before it commits. The handler's writes and the record
// become visible together, or neither does.
//
// The rules for keys, scopes, fingerprints and answers are guard's
// Idempotent's (pass its options with WithGuard): a missing or malformed
// key is 400, a reused key with another request 422
// idempotency_key_reused, and a duplicate gets the committed response,
// byte for byte, with Idempotent-Replayed: true. A duplicate that arrives
// while the first request's transaction is open waits for it (up to
// WithLockTimeout, then 409 request_in_progress with Retry-After) and
// then gets its response, or runs, when the first one rolled back. What
// the handler's status decides:
//
//   - a 2xx or 3xx commits the handler's writes and the response;
//   - a 4xx rolls the handler's writes back (to a savepoint taken after
//     the claim) and commits the response alone: every retry gets the same
//     refusal;
//   - a 5xx (guard.WithReleaseStatus changes which), an error the handler
//     swallowed into a 5xx, or a panic rolls everything back, the claim
//     included: the next request with the key runs as a first request.
//
// When the commit fails, nothing happened and the client gets 503
// store_unavailable instead of the handler's response. The handler must
// finish its writes before its response grows past the body cap or it
// flushes: the transaction commits then, and the rest streams.
func Idempotent(db DB, opts ...Option) func(http.Handler) http.Handler {
	s := newSettings(opts)
	return guard.IdempotentIn(records{s: s, db: db}, s.guard...)
}

// records keeps guard's records in transactions of db's.
type records struct {
	s  *settings
	db DB
}

func (rs records) MaxBody() int { return rs.s.maxBody }

func (rs records) Start(r *http.Request, key, fingerprint string) (guard.Run, idempotency.Outcome, error) {
	ctx := r.Context()
	tx, err := rs.s.begin(ctx, rs.db)
	if err != nil {
		return nil, idempotency.Outcome{}, err
	}
	run, stored, err := rs.s.claim(ctx, tx, key, fingerprint)
	if run == nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, stored, err
	}
	return httpRun{run, r.WithContext(withTx(ctx, tx))}, idempotency.Outcome{}, nil
}

// httpRun is a run as guard's Run: 4xx outcomes undo the handler's
// writes, and abandoning rolls back like releasing, since work inside the
// transaction is never of unknown outcome.
type httpRun struct {
	*run
	r *http.Request
}

func (h httpRun) Request() *http.Request { return h.r }

func (h httpRun) Complete(ctx context.Context, out idempotency.Outcome) error {
	return h.complete(ctx, out, out.Status >= 400)
}

func (h httpRun) Release(ctx context.Context) error { return h.rollback(ctx) }

func (h httpRun) Abandon() { _ = h.rollback(context.Background()) }
