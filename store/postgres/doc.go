// Package postgres is the shared store on PostgreSQL: tokens, nonces,
// records of executions and rate-limit counters kept in tables, so that
// any number of Replayguard instances can serve one set of tokens from a
// database they already run. It uses pgx v5 (pgxpool) and imports nothing
// of Replayguard but the store contract.
//
// # Schema
//
// Migrate creates everything the store uses, from the numbered files in
// migrations/ (embedded; DBAs can read and apply them by hand), recorded
// in replayguard_schema_migrations: 001_initial.sql creates the schema,
// 002_record_created.sql adds replayguard_records.created_at and replaces
// replayguard_acquire and replayguard_redeem to set it. A database an
// earlier release set up gets the migrations it lacks when Migrate next
// runs (the server runs it at start). 002's ALTER TABLE takes the
// records table's ACCESS EXCLUSIVE lock, briefly, but only once every
// transaction that has touched the table has ended, and the store's
// statements wait behind it: see the file for the case of long
// idempotency/pgtx transactions. Every name begins with replayguard_:
//
//   - replayguard_tokens (id, purpose, subject, expires_at): issued,
//     unredeemed tokens;
//   - replayguard_nonces (key, expires_at): nonces seen, under
//     store.NonceKey without its "\x00n" prefix;
//   - replayguard_records (key, completed, fingerprint, owner, response,
//     expires_at, created_at): records of executions, under the caller's
//     key or, for a token's own record, store.TokenRecordKey(id) ("\x00t"
//     || id); created_at is NULL for a row opened before migration 002;
//   - replayguard_rate_limits (key, tat): GCRA state per rate-limit key;
//   - the functions replayguard_redeem, replayguard_acquire,
//     replayguard_complete, replayguard_allow and replayguard_cleanup.
//
// Keys and every other string are bytea: they may hold any bytes, NUL
// included, which text cannot.
//
// Each operation is one statement, atomic on the server (the statements
// are in queries/, the functions in migrations/):
//
//   - Put is one INSERT … ON CONFLICT DO UPDATE … WHERE expires_at <= now:
//     of concurrent callers exactly one inserts or replaces an expired row;
//   - Redeem is replayguard_redeem: it answers from the token's live
//     record without a lock, else takes the token's row lock (SELECT … FOR
//     UPDATE) and, with a snapshot taken after it, reads the record again,
//     compares the token and deletes it or opens the record beside it;
//   - Acquire is replayguard_acquire: a read of the live record, else one
//     INSERT … ON CONFLICT DO UPDATE … WHERE expired that claims the key;
//   - Renew and Release are one UPDATE and one DELETE that check owner,
//     state and expiry on the row's latest version;
//   - Complete is replayguard_complete: it locks the token (for a token's
//     record), updates the record and deletes the token;
//   - Lookup is one SELECT of the live row, which locks nothing;
//   - Allow is replayguard_allow, GCRA as go-redis/redis_rate computes it.
//
// Locks are only ever taken token first, record second, so concurrent
// calls never deadlock.
//
// # Clock
//
// Every expiry is a duration from the moment the database carries the call
// out, added to its clock_timestamp(), and compared with its clock: the
// application's clock never decides how long anything lives. A row whose
// expiry has passed is absent to every statement at once; a background
// goroutine deletes such rows later (WithCleanupInterval), in batches of
// at most WithCleanupBatch rows per table and statement, one instance at
// a time: replayguard_cleanup takes pg_try_advisory_xact_lock(1919382116,
// <oid of replayguard_tokens>) and does nothing when another session
// holds it. A duration <= 0 acts as if the entry had been set and had
// expired at once. Durations are sent in whole microseconds, rounded up,
// and capped at about 285 years. The instants Lookup reports, a record's
// created_at and expires_at, are the database's clock's too.
//
// # Failure
//
// Every call runs under the store's timeout (WithTimeout, 500ms by
// default), which covers waiting for a pooled connection, connecting and
// the statement; pgx closes a connection whose call's context ends. Any
// failure — an unreachable or silent server, a timeout, a canceled
// context, a missing table, a closed store — is an error wrapping
// store.ErrUnavailable, never a success: redemption fails closed. An
// error's text never holds a stored response. PostgreSQL keeps no entry
// bound, so no call returns store.ErrFull. Ping fails, too, until Migrate
// has created tables the store can read: point a readiness probe at it.
//
// A statement that failed may still have committed (the connection broke
// after the server ran it): the outcome is unknown, as the contract says.
// Durability is the database's: a token redeemed on a primary that fails
// over before its commit reached a replica can be redeemed once more.
// Where that matters, use synchronous replication (synchronous_commit =
// on with synchronous_standby_names) for the store's role.
//
// Set connect_timeout in the URL (Open sets 5s when none is given): a
// connection attempt to a server that never answers holds one of the
// pool's slots until it ends.
//
// # Privileges
//
// Migrate needs CREATE on the schema it creates the objects in, the first
// of the connections' search_path. The store needs only SELECT, INSERT,
// UPDATE and DELETE on the four tables and EXECUTE on the five functions
// (PostgreSQL grants EXECUTE to PUBLIC by default); the functions run
// with the caller's privileges. The store's connections must have the
// same schema in their search_path as Migrate's had (set search_path in
// the URL, or on the role).
//
// The store prepares and caches its statements on each connection (pgx's
// default). Behind a pooler in transaction mode (PgBouncer), add
// default_query_exec_mode=exec to the URL.
//
// # Example
//
//	// Once per deploy, as a role that may create tables:
//	conn, err := pgx.Connect(ctx, url)
//	...
//	err = postgres.Migrate(ctx, conn)
//
//	// In each instance:
//	s, err := postgres.Open(ctx, url, postgres.WithTimeout(time.Second))
//	...
//	defer s.Close() // closes the pool Open made
//
// or, on a pool the application already has:
//
//	s := postgres.New(pool)
//	defer s.Close() // leaves pool open
package postgres
