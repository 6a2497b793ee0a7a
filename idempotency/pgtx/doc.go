// Package pgtx runs a request or a message at most once per key inside
// the application's own PostgreSQL transaction: the key is claimed as the
// transaction's first statement, the business writes follow on the same
// transaction, and the outcome every duplicate gets is recorded by it too.
// Commit makes the writes and the record visible at once; a rollback
// leaves no trace. A crash at any point therefore leaves both or neither,
// with no lease to wait for: the database, not a lease, knows whether the
// work happened.
//
// It keeps its records in the tables of store/postgres (run
// postgres.Migrate once on the application's database) and claims a key
// with the same function the store's Acquire uses, replayguard_acquire:
// INSERT … ON CONFLICT on the records' primary key. A concurrent duplicate
// waits on the first transaction's claim (bounded by WithLockTimeout, 5 s
// by default, then idempotency.ErrInProgress) and then reads its committed
// outcome, or claims the key when the first rolled back.
//
// # HTTP
//
// Idempotent is net/http middleware (and Gin middleware through
// guard.Gin) with the rules of guard.Idempotent for keys, scopes and
// fingerprints: it opens the transaction, claims the request's key, gives
// the handler the transaction in the request context, and records the
// response before it commits (ExampleIdempotent):
//
//	orders := pgtx.Idempotent(pgtx.Pool(pool))
//	mux.Handle("POST /orders", orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx, _ := pgtx.PgxFrom(r.Context())
//		var id int64
//		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ($1) RETURNING id`, "book").Scan(&id); err != nil {
//			http.Error(w, "internal error", http.StatusInternalServerError) // rolls everything back
//			return
//		}
//		w.WriteHeader(http.StatusCreated) // commits the order and this answer together
//		fmt.Fprintf(w, `{"id":%d}`, id)
//	})))
//
// A 2xx or 3xx commits; a 4xx rolls the handler's writes back to a
// savepoint taken after the claim and commits the answer alone, so a
// retry gets the same refusal; a 5xx or a panic rolls everything back,
// claim included, so a retry runs as a first request.
//
// # Queues and other callers
//
// Do is the same for a function: a queue consumer passes the message ID
// as the key, and a redelivered message commits nothing new. Its function
// returns an error wrapping Undo to record a refusal and undo its writes
// (ExampleDo).
//
// The examples need a PostgreSQL database, so they have no Output line:
// go test compiles them without running them. The package's tests run the
// same code against a real server (REPLAYGUARD_TEST_POSTGRES_URL).
//
// # Tokens
//
// RedeemToken spends a single-use token (issued on store/postgres in the
// same database) inside the transaction, so the order and the spent token
// commit together.
//
// Transactions come from a pgx pool (Pool) or a database/sql *sql.DB
// (SQLDB, with pgx's stdlib driver); the handler gets its own type back
// with PgxFrom or SQLFrom. Run them at the default READ COMMITTED level.
package pgtx
