package postgres

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/store"
)

// Defaults for the options below.
const (
	DefaultTimeout         = 500 * time.Millisecond
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 1000
	// DefaultConnectTimeout is the connect_timeout Open sets when the URL
	// gives none.
	DefaultConnectTimeout = 5 * time.Second
)

// The statements the store sends, one file each; the functions they call
// are created by the migrations (migrations/*.sql).
var (
	//go:embed queries/put_token.sql
	putTokenSQL string
	//go:embed queries/put_nonce.sql
	putNonceSQL string
	//go:embed queries/redeem.sql
	redeemSQL string
	//go:embed queries/acquire.sql
	acquireSQL string
	//go:embed queries/renew.sql
	renewSQL string
	//go:embed queries/complete.sql
	completeSQL string
	//go:embed queries/release.sql
	releaseSQL string
	//go:embed queries/lookup.sql
	lookupSQL string
	//go:embed queries/allow.sql
	allowSQL string
	//go:embed queries/cleanup.sql
	cleanupSQL string
	//go:embed queries/ping.sql
	pingSQL string
)

// Results of replayguard_redeem.
const (
	resultAbsent          = 0
	resultRedeemed        = 1
	resultPurposeMismatch = 2
	resultSubjectMismatch = 3
	resultRecorded        = 4
)

// Store is the PostgreSQL store. Create it with New or Open; the zero
// value is not usable. It is safe for concurrent use.
type Store struct {
	pool     *pgxpool.Pool
	ownsPool bool

	timeout         time.Duration
	cleanupInterval time.Duration
	cleanupBatch    int
	cleanupReport   func(deleted int64, err error)

	closed    atomic.Bool
	closeOnce sync.Once
	stop      context.CancelFunc // ends the cleanup goroutine and its statement
	done      chan struct{}      // closed when the cleanup goroutine has returned
	stopCtx   context.Context
}

var (
	_ store.Store   = (*Store)(nil)
	_ store.Limiter = (*Store)(nil)
)

// Option configures a Store.
type Option func(*Store)

// WithTimeout bounds every call the store makes: each runs under
// context.WithTimeout(ctx, d), which covers waiting for a pool connection,
// dialing and the statement, so a slow or unreachable database turns into
// an error after d at most. Defaults to DefaultTimeout (500ms), as
// store/redis; raise it only for a database that is far away or heavily
// loaded, since a redemption waits this long before it fails closed.
// d <= 0 keeps the default.
func WithTimeout(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// WithCleanupInterval sets how often the store deletes expired rows.
// Expired rows are absent to every call whether or not they have been
// deleted: cleanup only gives their space back, so the interval trades
// table size against how often every instance tries the cleanup lock.
// Defaults to DefaultCleanupInterval (1m), which suits most loads; d <= 0
// keeps the default.
func WithCleanupInterval(d time.Duration) Option {
	return func(s *Store) {
		if d > 0 {
			s.cleanupInterval = d
		}
	}
}

// WithCleanupBatch sets the most rows one cleanup statement deletes from
// each table; a sweep runs batches until one comes back short. Smaller
// batches hold row locks and write WAL in smaller steps. Defaults to
// DefaultCleanupBatch (1000), recommended unless replication lag shows
// the batches; n <= 0 keeps the default.
func WithCleanupBatch(n int) Option {
	return func(s *Store) {
		if n > 0 {
			s.cleanupBatch = n
		}
	}
}

// WithCleanupReport calls f after every background sweep with the number
// of rows it deleted and the error that ended it, if any (the next sweep
// retries), for logs and metrics. A sweep that found another instance
// cleaning reports (0, nil). f runs on the cleanup goroutine and must not
// block for long. Defaults to nil: nothing is reported.
func WithCleanupReport(f func(deleted int64, err error)) Option {
	return func(s *Store) { s.cleanupReport = f }
}

// New returns a Store that keeps its entries in the database behind pool,
// in the tables Migrate creates (found through the connections'
// search_path), and starts its cleanup goroutine. Call Close to stop it.
//
// The store does not own pool: Close leaves it open, and the caller closes
// it after the store. Use Open for a store that owns its pool.
func New(pool *pgxpool.Pool, opts ...Option) *Store {
	s := &Store{
		pool:            pool,
		timeout:         DefaultTimeout,
		cleanupInterval: DefaultCleanupInterval,
		cleanupBatch:    DefaultCleanupBatch,
		done:            make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	go s.cleanupLoop()
	return s
}

// Open parses url with pgxpool.ParseConfig (a postgres:// URL or a
// key=value DSN; sslmode, pool_max_conns and the other pgx and libpq
// settings apply), creates a pool and returns a Store on it that owns the
// pool: Close closes it. The pool connects lazily: Open fails only on a
// configuration it cannot parse, and an unreachable database shows in the
// first call (or Ping) as an error. Without a connect_timeout in url (or
// with connect_timeout=0), Open sets DefaultConnectTimeout (5s), so that an
// attempt to reach a server that never answers gives its pool slot back.
// Open does not migrate; see Migrate.
func Open(ctx context.Context, url string, opts ...Option) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	if cfg.ConnConfig.ConnectTimeout <= 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: open: %w", err)
	}
	s := New(pool, opts...)
	s.ownsPool = true
	return s, nil
}

// begin checks that the store is open and ctx is live, and returns ctx
// bounded by the store's timeout.
func (s *Store) begin(ctx context.Context, op string) (context.Context, context.CancelFunc, error) {
	if s.closed.Load() {
		return nil, nil, store.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fail(op, err)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	return ctx, cancel, nil
}

// fail is the error of a call that did not complete: it wraps
// store.ErrUnavailable. A missing table, function or column says how to
// fix it.
// The error text never holds an argument: pgx errors carry the server's
// message and SQLSTATE, not the row (a PgError's Detail, which may quote
// one, is not part of its text).
func fail(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883" || pgErr.Code == "42703") {
		err = fmt.Errorf("%w (run postgres.Migrate on this database, with the store's search_path)", err)
	}
	return store.Unavailable("postgres: "+op, err)
}

// noncePrefix begins every store.NonceKey; replayguard_nonces keeps the
// rest.
const noncePrefix = "\x00n"

// errReservedKey refuses a caller's key that begins with "\x00".
var errReservedKey = errors.New("the key is reserved for the store")

// maxMicros caps durations at 2^53 microseconds (about 285 years), which
// the database adds to clock_timestamp() exactly and without overflow.
const maxMicros = 1 << 53

// micros is d as the store's SQL takes durations: whole microseconds,
// rounded up so that an entry never lives shorter than asked, capped at
// maxMicros; 0 for d <= 0 (an expiry that is reached at once).
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return min((int64(d)+999)/1000, maxMicros)
}

// bytea returns s as a bytea argument: never nil, which pgx would send as
// NULL.
func bytea(s string) []byte {
	if s == "" {
		return []byte{}
	}
	return []byte(s)
}

// Put implements store.Store with one INSERT … ON CONFLICT DO UPDATE …
// WHERE expired (queries/put_token.sql, or put_nonce.sql for a
// store.NonceKey), whose expiry runs on the database's clock. A ttl <= 0
// stores nothing and created is true, as if the entry had been stored and
// had expired at once. A purpose containing a newline is refused with an
// error, as store/redis does: it would make the fingerprint of the
// token's record ambiguous. PostgreSQL keeps no entry bound: Put never
// returns store.ErrFull.
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
		return false, fail("put", errReservedKey)
	case ttl <= 0:
		return true, nil
	}
	var tag pgconn.CommandTag
	if store.IsNonceKey(key) {
		tag, err = s.pool.Exec(ctx, putNonceSQL, bytea(key[len(noncePrefix):]), micros(ttl))
	} else {
		tag, err = s.pool.Exec(ctx, putTokenSQL, bytea(key), bytea(t.Purpose), bytea(t.Subject), micros(ttl))
	}
	if err != nil {
		return false, fail("put", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Redeem implements store.Store with one call of replayguard_redeem
// (queries/redeem.sql), which answers from the token's live record, or
// compares the token and deletes it (no owner) or opens a processing
// record beside it, so exactly one of any number of concurrent callers
// gets Redeemed; see the function's comment in the migrations for how.
//
// The lease runs on the database's clock; a lease <= 0 redeems without
// leaving a record, and the token stays. Redeem never returns
// store.ErrFull.
func (s *Store) Redeem(ctx context.Context, id string, want store.Token, owner string, lease time.Duration) (store.RedeemResult, store.Record, error) {
	ctx, cancel, err := s.begin(ctx, "redeem")
	if err != nil {
		return 0, store.Record{}, err
	}
	defer cancel()
	if store.Reserved(id) {
		return store.Absent, store.Record{}, nil
	}
	var (
		code int32
		rec  record
	)
	err = s.pool.QueryRow(ctx, redeemSQL, bytea(id), bytea(want.Purpose), bytea(want.Subject), bytea(owner), micros(lease)).
		Scan(&code, &rec.completed, &rec.fingerprint, &rec.owner, &rec.response)
	if err != nil {
		return 0, store.Record{}, fail("redeem", err)
	}
	switch code {
	case resultRecorded:
		return store.Recorded, rec.export(), nil
	case resultRedeemed:
		if owner == "" {
			return store.Redeemed, store.Record{}, nil
		}
		return store.Redeemed, rec.export(), nil
	case resultAbsent:
		return store.Absent, store.Record{}, nil
	case resultPurposeMismatch:
		return store.PurposeMismatch, store.Record{}, nil
	case resultSubjectMismatch:
		return store.SubjectMismatch, store.Record{}, nil
	}
	return 0, store.Record{}, fail("redeem", fmt.Errorf("unexpected result %d", code))
}

// record is a row of replayguard_records as the functions return it.
type record struct {
	completed                    bool
	fingerprint, owner, response []byte
}

// export returns r as a store.Record. The response is the caller's own:
// pgx copies what it scans into a []byte.
func (r record) export() store.Record {
	rec := store.Record{Completed: r.completed, Fingerprint: string(r.fingerprint), Owner: string(r.owner)}
	if r.completed {
		rec.Response = r.response
	}
	return rec
}

// Acquire implements store.Store with one call of replayguard_acquire
// (queries/acquire.sql): it returns the live record under key or, when
// there is none, claims the key with one INSERT … ON CONFLICT DO UPDATE …
// WHERE expired, so exactly one of any number of concurrent callers
// acquires and the others get the record found. When acquired, rec is the
// new processing record.
//
// The lease runs on the database's clock. A lease <= 0 acquires without
// leaving a record, as if it had expired at once: a later Renew, Complete
// or Release reports false. Acquire never returns store.ErrFull.
func (s *Store) Acquire(ctx context.Context, key, fingerprint, owner string, lease time.Duration) (store.Record, bool, error) {
	ctx, cancel, err := s.begin(ctx, "acquire")
	if err != nil {
		return store.Record{}, false, err
	}
	defer cancel()
	if store.Reserved(key) {
		return store.Record{}, false, fail("acquire", errReservedKey)
	}
	var (
		acquired bool
		rec      record
	)
	err = s.pool.QueryRow(ctx, acquireSQL, bytea(key), bytea(fingerprint), bytea(owner), micros(lease)).
		Scan(&acquired, &rec.completed, &rec.fingerprint, &rec.owner, &rec.response)
	if err != nil {
		return store.Record{}, false, fail("acquire", err)
	}
	return rec.export(), acquired, nil
}

// Renew implements store.Store with one UPDATE (queries/renew.sql) that
// checks the owner, state and expiry and sets the expiry to lease from
// now on the database's clock. A lease <= 0 ends the record at once: ok is
// true and the next Acquire acquires.
func (s *Store) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	ctx, cancel, err := s.begin(ctx, "renew")
	if err != nil {
		return false, err
	}
	defer cancel()
	if owner == "" { // only Complete and Release take "" for any owner
		return false, nil
	}
	tag, err := s.pool.Exec(ctx, renewSQL, bytea(key), bytea(owner), micros(lease))
	if err != nil {
		return false, fail("renew", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Complete implements store.Store with one call of replayguard_complete
// (queries/complete.sql), which checks the owner and state, stores
// response (any bytes) and replaces the lease with keep, and for a token's
// record deletes the token in the same transaction. A keep <= 0 completes
// and ends the record at once: ok is true and the next Acquire acquires.
func (s *Store) Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (bool, error) {
	ctx, cancel, err := s.begin(ctx, "complete")
	if err != nil {
		return false, err
	}
	defer cancel()
	if response == nil {
		response = []byte{} // an empty response, not NULL
	}
	var ok bool
	if err := s.pool.QueryRow(ctx, completeSQL, bytea(key), bytea(owner), response, micros(keep)).Scan(&ok); err != nil {
		return false, fail("complete", err)
	}
	return ok, nil
}

// Release implements store.Store with one DELETE (queries/release.sql)
// that checks the owner, state and expiry.
func (s *Store) Release(ctx context.Context, key, owner string) (bool, error) {
	ctx, cancel, err := s.begin(ctx, "release")
	if err != nil {
		return false, err
	}
	defer cancel()
	tag, err := s.pool.Exec(ctx, releaseSQL, bytea(key), bytea(owner))
	if err != nil {
		return false, fail("release", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Lookup implements store.Store with one SELECT (queries/lookup.sql) of
// the live row under key, which locks nothing. Created and Expires are
// the row's created_at and expires_at, on the database's clock; a row
// opened before migration 002 has no created_at: a zero Created.
func (s *Store) Lookup(ctx context.Context, key string) (store.Record, bool, error) {
	ctx, cancel, err := s.begin(ctx, "lookup")
	if err != nil {
		return store.Record{}, false, err
	}
	defer cancel()
	if _, ok := store.TokenOfRecord(key); store.Reserved(key) && !ok {
		return store.Record{}, false, nil
	}
	var (
		rec     record
		created *time.Time
		expires time.Time
	)
	err = s.pool.QueryRow(ctx, lookupSQL, bytea(key)).
		Scan(&rec.completed, &rec.fingerprint, &rec.owner, &rec.response, &created, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return store.Record{}, false, nil
	case err != nil:
		return store.Record{}, false, fail("lookup", err)
	}
	out := rec.export()
	if created != nil {
		out.Created = *created
	}
	out.Expires = expires
	return out, true, nil
}

// Allow implements store.Limiter with GCRA in one call of
// replayguard_allow (queries/allow.sql), on the database's clock, as
// store/redis does with go-redis/redis_rate: l.Burst events at once,
// refilled at l.Rate per l.Period. A zero limit or a Period <= 0 allows
// everything, and a Burst below 1 counts as 1. Keys are kept in
// replayguard_rate_limits until their bucket is full again, then cleaned
// up.
func (s *Store) Allow(ctx context.Context, key string, l store.Limit) (bool, time.Duration, error) {
	ctx, cancel, err := s.begin(ctx, "allow")
	if err != nil {
		return false, 0, err
	}
	defer cancel()
	if l.IsZero() || l.Period <= 0 {
		return true, 0, nil
	}
	interval := (time.Duration(int64(l.Period) / int64(l.Rate))).Round(time.Microsecond)
	var retry int64
	err = s.pool.QueryRow(ctx, allowSQL, bytea(key), int64(interval/time.Microsecond), int64(max(l.Burst, 1))).Scan(&retry)
	if err != nil {
		return false, 0, fail("allow", err)
	}
	if retry <= 0 {
		return true, 0, nil
	}
	return false, time.Duration(retry) * time.Microsecond, nil
}

// Ping implements store.Store with one statement (queries/ping.sql) that
// reads no row but fails unless the database answers, Migrate has created
// the tables in the connections' search_path and the store may read them:
// a readiness probe on Ping catches all three.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel, err := s.begin(ctx, "ping")
	if err != nil {
		return err
	}
	defer cancel()
	if _, err := s.pool.Exec(ctx, pingSQL); err != nil {
		return fail("ping", err)
	}
	return nil
}

// Close stops the cleanup goroutine (canceling a sweep in progress) and
// waits for it, then closes the pool if the store owns it (Open); a pool
// given to New stays open. Closing a pool waits for its connections: pgx
// closes one whose call was interrupted by sending the server a cancel
// request, which a server that has stopped answering can hold up for 15s.
// Calls after Close return store.ErrClosed. It is safe to call more than
// once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.stop()
		<-s.done
		if s.ownsPool {
			s.pool.Close()
		}
	})
	return nil
}
