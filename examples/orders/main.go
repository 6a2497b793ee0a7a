// Command orders is a small Gin API on PostgreSQL whose writes run once
// per Idempotency-Key with package idempotency/pgtx: the key is claimed
// inside the order's own transaction, so the order, the key and the
// answer every retry gets commit together, or not at all. A crash, a
// failed supplier call or a lost connection leaves no order behind and no
// key to wait for; a retry then runs as a first request.
//
// Run it with
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable go run ./examples/orders
//
// It creates its tables (orders, payments, and Replayguard's) when they
// are missing, and listens on ADDR (default 127.0.0.1:8090). ORDERS_DELAY
// (a Go duration, default 0) makes the supplier call that every order
// waits for, inside its transaction, that slow. Routes:
//
//	POST /orders           {"item": "book", "qty": 2} → 201 {"id": 1, "item": "book", "qty": 2, "state": "pending", "version": 1}
//	                       Idempotency-Key required; item "out-of-stock" → 409 out_of_stock, "fail" → 500 internal_error
//	POST /orders/{id}/pay  → 200 {"id": 1, "state": "paid", "version": 2}; Idempotency-Key optional
//
// The pool takes pgx's settings from DATABASE_URL (pool_max_conns, say);
// application_name defaults to replayguard-orders.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"
)

// defaultAddr is where the app listens without ADDR.
const defaultAddr = "127.0.0.1:8090"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	gin.SetMode(gin.ReleaseMode)
	if err := run(ctx, os.Getenv, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// config is the app's configuration, from its environment.
type config struct {
	dsn   string        // DATABASE_URL, required
	addr  string        // ADDR, default defaultAddr
	delay time.Duration // ORDERS_DELAY, default 0
}

// loadConfig reads the configuration through getenv and applies the
// defaults.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{dsn: getenv("DATABASE_URL"), addr: getenv("ADDR")}
	if c.dsn == "" {
		return config{}, errors.New("DATABASE_URL is not set: set it to the PostgreSQL database to keep the orders in, " +
			"such as postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	}
	if c.addr == "" {
		c.addr = defaultAddr
	}
	if v := getenv("ORDERS_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return config{}, fmt.Errorf("ORDERS_DELAY=%q: want a duration such as 2s", v)
		}
		c.delay = d
	}
	return c, nil
}

// run sets the database up and serves the app until ctx ends. getenv
// reads the configuration; logs go to out; onListen, when set, receives
// the bound address.
func run(ctx context.Context, getenv func(string) string, out io.Writer, onListen func(addr string)) error {
	c, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(c.dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "replayguard-orders"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	setupCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = setup(setupCtx, pool)
	cancel()
	if err != nil {
		return err
	}

	log := slog.New(slog.NewTextHandler(out, nil))
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newApp(pool, Options{Delay: c.delay, Logger: log}), ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(out, "orders: listening on http://%s\n", ln.Addr())
	if onListen != nil {
		onListen(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancelShutdown := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelShutdown()
	return srv.Shutdown(shutdown)
}
