package pgtx_test

import (
	"context"
	"fmt"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/idempotency/pgtx"
	"github.com/replayguard/replayguard/store/postgres"
)

// ExampleDo charges a card once per queue message, however often the
// message is redelivered: the charge and its record commit together.
// It has no Output line, so go test compiles it without running it: it
// needs a PostgreSQL database (DATABASE_URL) with a charges table.
func ExampleDo() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil { // once, at start
		fmt.Println(err)
		return
	}
	charge := func(ctx context.Context, tx pgtx.Tx) (idempotency.Outcome, error) {
		if err := tx.Exec(ctx, `INSERT INTO charges (message, cents) VALUES ($1, $2)`, "msg-42", 1999); err != nil {
			return idempotency.Outcome{}, err // rolled back: the redelivery retries
		}
		return idempotency.Outcome{Body: []byte("charged 19.99")}, nil
	}
	out, replayed, err := pgtx.Do(ctx, pgtx.Pool(pool), "msg-42", "charge", charge)
	fmt.Println(string(out.Body), replayed, err)
}

// ExampleIdempotent creates an order once per Idempotency-Key: the order,
// the key's claim and the answer every retry gets commit in one
// transaction. It has no Output line, so go test compiles it without
// running it: it needs a PostgreSQL database (DATABASE_URL) with an
// orders table.
func ExampleIdempotent() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := postgres.Migrate(ctx, pool); err != nil { // once, at start
		fmt.Println(err)
		return
	}

	orders := pgtx.Idempotent(pgtx.Pool(pool))
	mux := http.NewServeMux()
	mux.Handle("POST /orders", orders(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := pgtx.PgxFrom(r.Context())
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO orders (item) VALUES ($1) RETURNING id`, "book").Scan(&id); err != nil {
			http.Error(w, "internal error", http.StatusInternalServerError) // rolls everything back
			return
		}
		w.WriteHeader(http.StatusCreated) // commits the order and this answer together
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
	fmt.Println(http.ListenAndServe(":8080", mux))
}
