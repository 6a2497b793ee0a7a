package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency/pgtx"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/postgres"
)

//go:embed schema.sql
var schema string

// setup creates the example's tables (schema.sql) and Replayguard's
// (postgres.Migrate) when they are missing, in the first schema of the
// pool's search_path.
func setup(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, schema)
		return err
	}); err != nil {
		return fmt.Errorf("creating the tables orders and payments: %w", err)
	}
	if err := postgres.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("creating Replayguard's tables: %w", err)
	}
	return nil
}

// Options configures the app. The zero value is a working app.
type Options struct {
	// Delay is how long the supplier takes to confirm an order's stock:
	// the handler waits for it after inserting the order, inside the
	// order's transaction. Defaults to 0 (ORDERS_DELAY).
	Delay time.Duration
	// Logger gets a line for every request answered 5xx, with its error.
	// Defaults to discarding them.
	Logger *slog.Logger
}

// Errors of the example's supplier. errOutOfStock is a refusal that
// depends on the request: 409 out_of_stock, recorded for retries.
// errSupplier is a failure: 500 internal_error, and a retry runs again.
var (
	errOutOfStock = errors.New("out of stock")
	errSupplier   = errors.New("the supplier failed")
)

// app is the orders API on a pool.
type app struct {
	pool *pgxpool.Pool
	opts Options
	log  *slog.Logger
}

// newApp returns the orders API on pool, whose database setup has
// prepared:
//
//	POST /orders           {"item": "book", "qty": 2}: 201 with the order; an Idempotency-Key is required
//	POST /orders/{id}/pay  200 with the order's state; an Idempotency-Key is optional
//
// Both run once per Idempotency-Key with pgtx.Idempotent: the key's claim,
// the business writes and the recorded answer commit in one transaction.
func newApp(pool *pgxpool.Pool, opts Options) http.Handler {
	a := &app{pool: pool, opts: opts, log: opts.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	db := pgtx.Pool(pool)
	logs := guard.WithLogger(a.log)

	r := gin.New()
	_ = r.SetTrustedProxies(nil) // the caller's IP scopes keys of requests without credentials: the peer's
	r.Use(gin.CustomRecovery(func(c *gin.Context, v any) {
		a.log.LogAttrs(c.Request.Context(), slog.LevelError, "panic", slog.String("path", c.Request.URL.Path), slog.Any("panic", v))
		problem.Write(c.Writer, problem.ErrInternal)
		c.Abort()
	}))
	r.NoRoute(func(c *gin.Context) {
		problem.Write(c.Writer, fmt.Errorf("%w: no route %s %s", problem.ErrNotFound, c.Request.Method, c.Request.URL.Path))
	})
	r.POST("/orders", guard.Gin(pgtx.Idempotent(db, pgtx.WithGuard(logs))), a.handle(a.createOrder))
	r.POST("/orders/:id/pay", guard.Gin(pgtx.Idempotent(db, pgtx.WithGuard(logs, guard.WithKeyRequired(false)))), a.handle(a.pay))
	return r
}

// handle turns a handler that returns an error into a Gin handler: the
// one place where the app's errors become answers (answer).
func (a *app) handle(h func(*gin.Context) error) gin.HandlerFunc {
	return func(c *gin.Context) {
		if err := h(c); err != nil {
			a.answer(c, err)
		}
	}
}

// answer writes err as problem+json: the app's own out_of_stock, else
// package problem's table (problem.ErrBadRequest is 400 invalid_request,
// problem.ErrNotFound 404 not_found, store.ErrUnavailable 503
// store_unavailable, anything else 500 internal_error).
func (a *app) answer(c *gin.Context, err error) {
	var p problem.Problem
	if errors.Is(err, errOutOfStock) {
		p = problem.Problem{
			Type:   problem.TypePrefix + "out_of_stock",
			Title:  "Out of stock",
			Status: http.StatusConflict,
			Detail: "the supplier has no stock of this item; the order was not placed", // as package problem writes its details
			Code:   "out_of_stock",
		}
	} else {
		p = problem.For(err)
	}
	if p.Status >= 500 {
		a.log.LogAttrs(c.Request.Context(), slog.LevelError, "request failed",
			slog.String("method", c.Request.Method), slog.String("path", c.Request.URL.Path),
			slog.Int("status", p.Status), slog.String("error", err.Error()))
	}
	p.Write(c.Writer)
}

// order is an order as the API shows it.
type order struct {
	ID      int64  `json:"id"`
	Item    string `json:"item"`
	Qty     int    `json:"qty"`
	State   string `json:"state"`
	Version int    `json:"version"`
}

// orderRequest is the body of POST /orders.
type orderRequest struct {
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

// maxRequest bounds the body of POST /orders.
const maxRequest = 64 << 10

// decodeOrder reads the body of POST /orders: one JSON object with a
// non-empty item and a qty of at least 1.
func decodeOrder(r *http.Request) (orderRequest, error) {
	var req orderRequest
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxRequest))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return req, problem.ErrTooLarge
	case err != nil:
		return req, fmt.Errorf("%w: reading the body: %v", problem.ErrBadRequest, err)
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return req, fmt.Errorf("%w: the body must be a JSON object such as {\"item\": \"book\", \"qty\": 2}: %v", problem.ErrBadRequest, err)
	}
	switch {
	case req.Item == "" || strings.ContainsRune(req.Item, 0):
		return req, fmt.Errorf("%w: item must be a non-empty string", problem.ErrBadRequest)
	case req.Qty < 1:
		return req, fmt.Errorf("%w: qty must be at least 1", problem.ErrBadRequest)
	}
	return req, nil
}

// createOrder is POST /orders: it inserts a pending order, asks the
// supplier for the stock, and answers 201 with the order. The insert and
// the supplier's answer share one transaction: out of stock (409) or a
// failure (5xx) leaves no order.
func (a *app) createOrder(c *gin.Context) error {
	req, err := decodeOrder(c.Request)
	if err != nil {
		return err
	}
	var o order
	err = a.inTx(c.Request.Context(), func(ctx context.Context, tx pgx.Tx) error {
		if err := tx.QueryRow(ctx,
			`INSERT INTO orders (item, qty, state, version) VALUES ($1, $2, 'pending', 1) RETURNING id, item, qty, state, version`,
			req.Item, req.Qty).Scan(&o.ID, &o.Item, &o.Qty, &o.State, &o.Version); err != nil {
			return dbError(err)
		}
		return a.reserve(ctx, req.Item)
	})
	if err != nil {
		return err
	}
	c.JSON(http.StatusCreated, o)
	return nil
}

// reserve asks the supplier for stock of item: a slow call (Options.Delay)
// made inside the order's transaction. This example's supplier has no
// stock of "out-of-stock" and fails on "fail".
func (a *app) reserve(ctx context.Context, item string) error {
	if a.opts.Delay > 0 {
		t := time.NewTimer(a.opts.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err() // the client left: undo
		}
	}
	switch item {
	case "out-of-stock":
		return fmt.Errorf("%w: %s", errOutOfStock, item)
	case "fail":
		return errSupplier
	}
	return nil
}

// payment is the answer of POST /orders/{id}/pay.
type payment struct {
	ID      int64  `json:"id"`
	State   string `json:"state"`
	Version int    `json:"version"`
}

// pay is POST /orders/{id}/pay: a pending order becomes paid, with one
// payment, under an optimistic lock on its version. A pay that finds the
// order paid already, or loses the race to a concurrent pay, answers 200
// with the order's current state and pays nothing: a retry, with or
// without an Idempotency-Key, is safe, and pay never answers 409.
func (a *app) pay(c *gin.Context) error {
	id, err := strconv.ParseInt(c.Param("id"), 10, 64)
	if err != nil || id < 1 {
		return fmt.Errorf("%w: no order %q", problem.ErrNotFound, c.Param("id"))
	}
	var p payment
	err = a.inTx(c.Request.Context(), func(ctx context.Context, tx pgx.Tx) error {
		p.ID = id
		err := tx.QueryRow(ctx, `SELECT state, version FROM orders WHERE id = $1`, id).Scan(&p.State, &p.Version)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: no order %d", problem.ErrNotFound, id)
		case err != nil:
			return dbError(err)
		case p.State != "pending":
			return nil
		}
		tag, err := tx.Exec(ctx,
			`UPDATE orders SET state = 'paid', version = version + 1 WHERE id = $1 AND state = 'pending' AND version = $2`,
			id, p.Version)
		if err != nil {
			return dbError(err)
		}
		if tag.RowsAffected() == 0 {
			// Another pay changed the order since we read it (the UPDATE
			// waited for it, then found its WHERE false): answer with
			// what it made of the order, read with a new snapshot.
			if err := tx.QueryRow(ctx, `SELECT state, version FROM orders WHERE id = $1`, id).Scan(&p.State, &p.Version); err != nil {
				return dbError(err)
			}
			return nil
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id) VALUES ($1)`, id); err != nil {
			return dbError(err)
		}
		p.State, p.Version = "paid", p.Version+1
		return nil
	})
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, p)
	return nil
}

// inTx runs fn in the request's transaction. When the request carried an
// Idempotency-Key, that is the one pgtx.Idempotent opened and claimed the
// key in, and pgtx commits or rolls it back by the answer: fn's error is
// answered, and undoes fn's writes. Otherwise inTx opens a transaction of
// its own and commits it when fn returns nil.
func (a *app) inTx(ctx context.Context, fn func(context.Context, pgx.Tx) error) error {
	if tx, ok := pgtx.PgxFrom(ctx); ok {
		return fn(ctx, tx)
	}
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return dbError(err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return dbError(err)
	}
	return nil
}

// dbError is the error of a statement the app ran. When it says the
// database cannot be reached or went away (a failed connection, a server
// that is shutting down or starting, a lock or statement timeout, a
// serialization failure), it wraps store.ErrUnavailable: the answer is 503
// store_unavailable with Retry-After, as when pgtx's own statements fail,
// the transaction is undone, and a retry runs. Any other error of the
// database is a bug: 500 internal_error.
func dbError(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return store.Unavailable("orders", err) // no answer from the server: the connection failed
	}
	switch code := pe.Code; {
	case strings.HasPrefix(code, "08"), // connection exception
		strings.HasPrefix(code, "53"), // insufficient resources
		strings.HasPrefix(code, "57"), // operator intervention: shutdown, query canceled
		code == "40001",               // serialization failure
		code == "40P01",               // deadlock detected
		code == "55P03":               // lock not available (lock_timeout)
		return store.Unavailable("orders", err)
	}
	return err
}
