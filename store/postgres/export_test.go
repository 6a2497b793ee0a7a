package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// Sweep runs one cleanup sweep now, as the background goroutine does, and
// tells onBatch the size of every table's batch.
func (s *Store) Sweep(ctx context.Context, onBatch func(table string, n int64)) (deleted int64, busy bool, err error) {
	return s.sweep(ctx, onBatch)
}

// MigrationVersions returns the numbers and file names of the embedded
// migrations.
func MigrationVersions() (map[int]string, error) {
	ms, err := loadMigrations()
	if err != nil {
		return nil, err
	}
	out := make(map[int]string, len(ms))
	for _, m := range ms {
		out[m.version] = m.name
	}
	return out, nil
}

// MigrateTo applies the embedded migrations up to version only, as
// Migrate does: a database as an earlier release left it.
func MigrateTo(ctx context.Context, db Beginner, version int) error {
	ms, err := loadMigrations()
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.version > version {
			break
		}
		if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return apply(ctx, tx, m) }); err != nil {
			return err
		}
	}
	return nil
}
