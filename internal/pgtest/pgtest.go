// Package pgtest gives tests a PostgreSQL schema of their own on the test
// database (REPLAYGUARD_TEST_POSTGRES_URL): created empty, or with
// store/postgres's migrations applied, and dropped with everything in it
// when the test ends. Without the variable a test skips, or fails under
// REPLAYGUARD_TEST_REQUIRE=1 or CI=true.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store/postgres"
)

// URLVar names the test database's URL.
const URLVar = "REPLAYGUARD_TEST_POSTGRES_URL"

// DatabaseURL returns the test database's URL, or skips (or fails) t.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	return testenv.Var(t, URLVar)
}

// Exec runs sql on its own connection to the test database.
func Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, DatabaseURL(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// NewSchema creates an empty schema that no other test uses and drops it,
// with everything in it, when the test ends.
func NewSchema(t testing.TB) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	name := "rgtest_" + hex.EncodeToString(b)
	ident := pgx.Identifier{name}.Sanitize()
	Exec(t, "CREATE SCHEMA "+ident)
	t.Cleanup(func() { Exec(t, "DROP SCHEMA "+ident+" CASCADE") })
	return name
}

// SchemaURL is the test database's URL with schema as its search_path:
// pgx sends settings it does not know itself to the server.
func SchemaURL(t testing.TB, schema string) string {
	t.Helper()
	u, err := url.Parse(DatabaseURL(t))
	if err != nil {
		t.Fatalf("%s: %v", URLVar, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Pool returns a pool of up to maxConns connections whose search_path is
// schema, closed when the test ends (after what was registered later).
func Pool(t testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(DatabaseURL(t))
	if err != nil {
		t.Fatalf("%s: %v", URLVar, err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Migrated returns a fresh schema that store/postgres's Migrate has set
// up, and a pool of 16 connections on it.
func Migrated(t testing.TB) (schema string, pool *pgxpool.Pool) {
	t.Helper()
	schema = NewSchema(t)
	pool = Pool(t, schema, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return schema, pool
}
