package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"

	"github.com/replayguard/replayguard/store"

	"github.com/jackc/pgx/v5"
)

// The migrations, applied in order of their number.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// The statements of the migration runner.
var (
	//go:embed queries/migrate_lock.sql
	migrateLockSQL string
	//go:embed queries/migrate_table.sql
	migrateTableSQL string
	//go:embed queries/migrate_applied.sql
	migrateAppliedSQL string
	//go:embed queries/migrate_record.sql
	migrateRecordSQL string
)

// migration is one file of migrations/: NNN_name.sql.
type migration struct {
	version int
	name    string // the file's name
	sql     string
}

// migrationName is the form of a migration's file name.
var migrationName = regexp.MustCompile(`^([0-9]{3})_[a-z0-9_]+\.sql$`)

// loadMigrations returns the embedded migrations in order. Their numbers
// run from 1 without a gap.
func loadMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %q is not named NNN_name.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		b, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: want number %03d", m.name, i+1)
		}
	}
	return ms, nil
}

// Beginner starts transactions: *pgxpool.Pool, *pgx.Conn and pgx.Tx (a
// savepoint) all are one.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migrate creates or updates the store's tables and functions: it applies
// the embedded migrations (migrations/NNN_name.sql) that the database has
// not applied yet, in order, each in its own transaction together with its
// row in replayguard_schema_migrations. Every transaction first takes the
// advisory lock pg_advisory_xact_lock(1919382116, 0), so instances that
// start at once on an empty database apply each migration exactly once:
// the others wait, then find it applied. Applying twice is a no-op.
//
// Objects are created in the first schema of the connections' search_path,
// which must be the one the store's connections use. The role needs CREATE
// on that schema; the store itself needs only the privileges listed in the
// package documentation. Migrate is not bounded by a store timeout: give
// ctx a deadline.
func Migrate(ctx context.Context, db Beginner) error {
	ms, err := loadMigrations()
	if err != nil {
		return fmt.Errorf("postgres: migrate: %w", err)
	}
	for _, m := range ms {
		if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return apply(ctx, tx, m) }); err != nil {
			return fmt.Errorf("postgres: migrate %s: %w", m.name, err)
		}
	}
	return nil
}

// apply applies m in tx unless it has been applied, under the migration
// lock.
func apply(ctx context.Context, tx pgx.Tx, m migration) error {
	if _, err := tx.Exec(ctx, migrateLockSQL); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, migrateTableSQL); err != nil {
		return err
	}
	var applied bool
	if err := tx.QueryRow(ctx, migrateAppliedSQL, m.version).Scan(&applied); err != nil {
		return err
	}
	if applied {
		return nil
	}
	// Without arguments, pgx sends the file with the simple protocol:
	// several statements, dollar-quoted function bodies and all.
	if _, err := tx.Exec(ctx, m.sql); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, migrateRecordSQL, m.version, m.name)
	return err
}

// Migrate applies the migrations on the store's own pool (see the
// package function Migrate): for a Store from Open, which holds its pool.
func (s *Store) Migrate(ctx context.Context) error {
	if s.closed.Load() {
		return store.ErrClosed
	}
	return Migrate(ctx, s.pool)
}
