package pgtx_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/idempotency/pgtx"
	"github.com/replayguard/replayguard/store/postgres"
)

// ExampleDo charges a card once per queue message, however often the
// message is redelivered: the charge and its record commit together.
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
