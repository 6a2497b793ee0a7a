package postgres_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/postgres"
)

// Example migrates the database, opens a store on it and redeems a token.
// It has no Output line, so go test compiles it without running it: it
// needs a database (REPLAYGUARD_TEST_POSTGRES_URL) it may create tables in.
func Example() {
	url := os.Getenv("REPLAYGUARD_TEST_POSTGRES_URL") // e.g. postgres://rg@db:5432/rg?sslmode=verify-full
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Once per deploy, as a role that may create tables.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = postgres.Migrate(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}

	// In each instance.
	s, err := postgres.Open(ctx, url, postgres.WithTimeout(time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close() // closes the pool Open made

	tok := store.Token{Purpose: "checkout", Subject: "alice"}
	created, err := s.Put(ctx, "42", tok, time.Minute)
	fmt.Println(created, err)
	for _, want := range []store.Token{{Purpose: "login", Subject: "alice"}, tok, tok} {
		res, _, err := s.Redeem(ctx, "42", want, "", 0)
		fmt.Println(res, err)
	}
	// Prints:
	// true <nil>
	// purpose_mismatch <nil>
	// redeemed <nil>
	// absent <nil>
}
