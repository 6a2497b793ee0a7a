package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/postgres"
	"github.com/replayguard/replayguard/store/storetest"
)

// TestMigrationFiles checks the embedded migrations without a database:
// numbered from 001 without a gap, named NNN_name.sql.
func TestMigrationFiles(t *testing.T) {
	vs, err := postgres.MigrationVersions()
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) == 0 {
		t.Fatal("no migrations embedded")
	}
	for v := 1; v <= len(vs); v++ {
		if _, ok := vs[v]; !ok {
			t.Fatalf("migration %03d missing from %v", v, vs)
		}
	}
}

// applied returns the versions recorded in the schema's migration table.
func applied(t *testing.T, pool *pgxpool.Pool) []int {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT version FROM replayguard_schema_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// wantApplied checks that every embedded migration is recorded once.
func wantApplied(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	want, err := postgres.MigrationVersions()
	if err != nil {
		t.Fatal(err)
	}
	got := applied(t, pool)
	if len(got) != len(want) {
		t.Fatalf("applied versions %v; want each of %v once", got, want)
	}
	for i, v := range got {
		if v != i+1 {
			t.Fatalf("applied versions %v; want 1 to %d", got, len(want))
		}
	}
}

func TestMigrateTwiceIsANoOp(t *testing.T) {
	pool := newPool(t, newSchema(t), 2)
	ctx := context.Background()
	for i := range 2 {
		if err := postgres.Migrate(ctx, pool); err != nil {
			t.Fatalf("Migrate #%d: %v", i+1, err)
		}
	}
	wantApplied(t, pool)
	// The schema works after the second run.
	s := postgres.New(pool)
	defer s.Close()
	if _, ok, err := s.Acquire(ctx, "k", "fp", "o", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
}

// TestMigrateConcurrently starts eight instances at once on an empty
// schema: each Migrate succeeds and every migration is applied once (a
// second application would fail, as its CREATE TABLE has no IF NOT
// EXISTS).
func TestMigrateConcurrently(t *testing.T) {
	schema := newSchema(t)
	const instances = 8
	pools := make([]*pgxpool.Pool, instances)
	for i := range pools {
		pools[i] = newPool(t, schema, 1)
		if err := pools[i].Ping(context.Background()); err != nil { // connect before the race
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make(chan error, instances)
	start := make(chan struct{})
	for _, p := range pools {
		go func() {
			<-start
			errs <- postgres.Migrate(ctx, p)
		}()
	}
	close(start)
	for range instances {
		if err := <-errs; err != nil {
			t.Errorf("Migrate: %v", err)
		}
	}
	wantApplied(t, pools[0])
}

// TestMigrateNames checks that everything the migrations create in the
// schema is named replayguard_*: tables, indexes, constraints, functions
// and types (an array type's name is its element's with a leading "_").
func TestMigrateNames(t *testing.T) {
	schema := newSchema(t)
	pool := newPool(t, schema, 2)
	ctx := context.Background()
	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `
		SELECT 'relation', c.relname::text FROM pg_class c WHERE c.relnamespace = $1::regnamespace
		UNION ALL SELECT 'function', p.proname::text FROM pg_proc p WHERE p.pronamespace = $1::regnamespace
		UNION ALL SELECT 'constraint', k.conname::text FROM pg_constraint k WHERE k.connamespace = $1::regnamespace
		UNION ALL SELECT 'type', ltrim(y.typname::text, '_') FROM pg_type y WHERE y.typnamespace = $1::regnamespace`, schema)
	if err != nil {
		t.Fatal(err)
	}
	type object struct{ Kind, Name string }
	objs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[object])
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.Kind]++
		if !strings.HasPrefix(o.Name, "replayguard_") {
			t.Errorf("%s %q is not named replayguard_*", o.Kind, o.Name)
		}
	}
	// 5 tables with their primary keys, 4 expiry indexes.
	if kinds["relation"] != 14 || kinds["function"] != 5 {
		t.Errorf("objects per kind = %v; want 14 relations and 5 functions", kinds)
	}
}

// TestMigrateInTransaction runs Migrate inside a caller's transaction
// (pgx.Tx is a Beginner: each migration is a savepoint): rolled back, it
// leaves nothing.
func TestMigrateInTransaction(t *testing.T) {
	pool := newPool(t, newSchema(t), 2)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := postgres.Migrate(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d relations left after rolling back", n)
	}
}

// TestUnmigratedSchema checks that a store on a schema Migrate has not set
// up fails every call, Ping included, with an error that says what to do
// and does not quote the response.
func TestUnmigratedSchema(t *testing.T) {
	pool := newPool(t, newSchema(t), 2)
	s := postgres.New(pool)
	defer s.Close()
	ctx := context.Background()
	expectUnavailable(t, ctx, s, nil, postgres.DefaultTimeout)
	_, err := s.Put(ctx, storetest.ID(), tokenP, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Put on an unmigrated schema: err = %v; want one naming Migrate", err)
	}
}

// TestMigrateFromVersion1 upgrades a database that an earlier release
// set up and holds records in: Lookup fails, naming Migrate, until
// migration 002 is applied; then the records opened before it are found
// with a zero Created, which Renew and Complete leave zero, and records
// opened after it have theirs.
func TestMigrateFromVersion1(t *testing.T) {
	pool := newPool(t, newSchema(t), 4)
	ctx := context.Background()
	if err := postgres.MigrateTo(ctx, pool, 1); err != nil {
		t.Fatal(err)
	}
	s := postgres.New(pool, postgres.WithTimeout(loadedTimeout))
	defer s.Close()
	tok := store.Token{Purpose: "checkout", Subject: "alice"}
	id := storetest.ID()
	if ok, err := s.Put(ctx, id, tok, time.Hour); err != nil || !ok {
		t.Fatalf("Put = %v, %v", ok, err)
	}
	if res, _, err := s.Redeem(ctx, id, tok, "o", time.Minute); err != nil || res != store.Redeemed {
		t.Fatalf("Redeem = %v, %v", res, err)
	}
	for _, k := range []string{"processing", "completed"} {
		if _, ok, err := s.Acquire(ctx, k, "fp", "o", time.Minute); err != nil || !ok {
			t.Fatalf("Acquire(%s) = %v, %v", k, ok, err)
		}
	}
	if ok, err := s.Complete(ctx, "completed", "o", []byte("done"), time.Hour); err != nil || !ok {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	if _, _, err := s.Lookup(ctx, "processing"); !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Lookup before migration 002: err = %v; want one naming Migrate", err)
	}

	if err := postgres.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	wantApplied(t, pool)
	if ok, err := s.Renew(ctx, "processing", "o", time.Hour); err != nil || !ok {
		t.Fatalf("Renew after the migration = %v, %v", ok, err)
	}
	for _, k := range []string{"processing", "completed", store.TokenRecordKey(id)} {
		rec, found, err := s.Lookup(ctx, k)
		if err != nil || !found || !rec.Created.IsZero() || rec.Expires.IsZero() {
			t.Fatalf("Lookup(%q) of a record opened before 002 = %+v, %v, %v; want it found with a zero Created", k, rec, found, err)
		}
	}
	if ok, err := s.Complete(ctx, store.TokenRecordKey(id), "o", []byte("done"), time.Hour); err != nil || !ok {
		t.Fatalf("Complete of the token's record = %v, %v", ok, err)
	}
	if rec, found, err := s.Lookup(ctx, store.TokenRecordKey(id)); err != nil || !found || !rec.Completed || !rec.Created.IsZero() {
		t.Fatalf("Lookup of the completed token's record = %+v, %v, %v; want it completed, Created still zero", rec, found, err)
	}

	before := time.Now()
	if _, ok, err := s.Acquire(ctx, "new", "fp", "o", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire after the migration = %v, %v", ok, err)
	}
	if rec, found, err := s.Lookup(ctx, "new"); err != nil || !found || rec.Created.Before(before.Add(-time.Second)) {
		t.Fatalf("Lookup of a record opened after 002 = %+v, %v, %v; want its Created", rec, found, err)
	}
}
