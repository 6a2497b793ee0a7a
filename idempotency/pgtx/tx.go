package pgtx

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tx is a transaction of the application's: a pgx.Tx (FromPgx) or a
// database/sql *sql.Tx on a PostgreSQL driver such as pgx's stdlib
// (FromSQL). pgtx runs its own statements on it, between the
// application's.
type Tx interface {
	// Exec runs a statement that returns no rows.
	Exec(ctx context.Context, sql string, args ...any) error
	// QueryRow runs a query that returns at most one row.
	QueryRow(ctx context.Context, sql string, args ...any) Row
	// Commit and Rollback end the transaction.
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Row is a row QueryRow returned.
type Row interface{ Scan(dest ...any) error }

// DB opens transactions: a pgx pool (Pool) or a *sql.DB (SQLDB).
type DB interface {
	Begin(ctx context.Context) (Tx, error)
}

// FromPgx returns tx as a Tx.
func FromPgx(tx pgx.Tx) Tx { return pgxTx{tx} }

// FromSQL returns tx as a Tx.
func FromSQL(tx *sql.Tx) Tx { return sqlTx{tx} }

// Pool returns a DB that opens pgx transactions on pool.
func Pool(pool *pgxpool.Pool) DB { return pgxDB{pool} }

// SQLDB returns a DB that opens database/sql transactions on db.
func SQLDB(db *sql.DB) DB { return sqlDB{db} }

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := t.tx.Exec(ctx, sql, args...)
	return err
}
func (t pgxTx) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return t.tx.QueryRow(ctx, sql, args...)
}
func (t pgxTx) Commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) Exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, query, args...)
	return err
}
func (t sqlTx) QueryRow(ctx context.Context, query string, args ...any) Row {
	return t.tx.QueryRowContext(ctx, query, args...)
}
func (t sqlTx) Commit(context.Context) error { return t.tx.Commit() }
func (t sqlTx) Rollback(context.Context) error {
	if err := t.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

type pgxDB struct{ pool *pgxpool.Pool }

func (d pgxDB) Begin(ctx context.Context) (Tx, error) {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return pgxTx{tx}, nil
}

type sqlDB struct{ db *sql.DB }

func (d sqlDB) Begin(ctx context.Context) (Tx, error) {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return sqlTx{tx}, nil
}

type txKey struct{}

// withTx returns ctx carrying tx for the handler.
func withTx(ctx context.Context, tx Tx) context.Context { return context.WithValue(ctx, txKey{}, tx) }

// From returns the transaction Idempotent opened for the request ctx
// belongs to, as a Tx.
func From(ctx context.Context) (Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(Tx)
	return tx, ok
}

// PgxFrom returns the pgx transaction Idempotent opened on a Pool for the
// request ctx belongs to: the handler's business writes go on it.
func PgxFrom(ctx context.Context) (pgx.Tx, bool) {
	t, ok := ctx.Value(txKey{}).(pgxTx)
	return t.tx, ok
}

// SQLFrom returns the database/sql transaction Idempotent opened on an
// SQLDB for the request ctx belongs to.
func SQLFrom(ctx context.Context) (*sql.Tx, bool) {
	t, ok := ctx.Value(txKey{}).(sqlTx)
	return t.tx, ok
}
