package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/postgres"
	"github.com/replayguard/replayguard/store/storetest"
)

var tokenP = store.Token{Purpose: "p"}

// secret is a response whose bytes must never appear in an error.
const secret = "Set-Cookie: session=SECRET-7f3a"

// call is one store call, by name.
type call struct {
	name string
	do   func(ctx context.Context, s *postgres.Store) error
}

// calls are one of each store call.
var calls = []call{
	{"Put", func(ctx context.Context, s *postgres.Store) error {
		_, err := s.Put(ctx, "x", tokenP, time.Minute)
		return err
	}},
	{"Put nonce", func(ctx context.Context, s *postgres.Store) error {
		_, err := s.Put(ctx, store.NonceKey("k", "x"), store.Token{}, time.Minute)
		return err
	}},
	{"Redeem", func(ctx context.Context, s *postgres.Store) error {
		_, _, err := s.Redeem(ctx, "x", tokenP, "", 0)
		return err
	}},
	{"Redeem with a record", func(ctx context.Context, s *postgres.Store) error {
		_, _, err := s.Redeem(ctx, "x", tokenP, "o", time.Minute)
		return err
	}},
	{"Acquire", func(ctx context.Context, s *postgres.Store) error {
		_, _, err := s.Acquire(ctx, "x", "fp", "o", time.Minute)
		return err
	}},
	{"Renew", func(ctx context.Context, s *postgres.Store) error {
		_, err := s.Renew(ctx, "x", "o", time.Minute)
		return err
	}},
	{"Complete", func(ctx context.Context, s *postgres.Store) error {
		_, err := s.Complete(ctx, "x", "o", []byte(secret), time.Minute)
		return err
	}},
	{"Release", func(ctx context.Context, s *postgres.Store) error {
		_, err := s.Release(ctx, "x", "o")
		return err
	}},
	{"Lookup", func(ctx context.Context, s *postgres.Store) error {
		_, _, err := s.Lookup(ctx, "x")
		return err
	}},
	{"Ping", func(ctx context.Context, s *postgres.Store) error { return s.Ping(ctx) }},
	{"Allow", func(ctx context.Context, s *postgres.Store) error {
		_, _, err := s.Allow(ctx, "x", store.Limit{Rate: 1, Burst: 1, Period: time.Second})
		return err
	}},
}

// expectUnavailable makes every call and checks that each fails with an
// error wrapping store.ErrUnavailable (and is, when not nil) within limit,
// and that no error's text holds the response.
func expectUnavailable(t *testing.T, ctx context.Context, s *postgres.Store, is error, limit time.Duration) {
	t.Helper()
	for _, c := range calls {
		start := time.Now()
		err := c.do(ctx, s)
		d := time.Since(start)
		switch {
		case !errors.Is(err, store.ErrUnavailable):
			t.Errorf("%s = %v; want an error wrapping store.ErrUnavailable", c.name, err)
		case is != nil && !errors.Is(err, is):
			t.Errorf("%s = %v; want an error wrapping %v", c.name, err, is)
		case strings.Contains(err.Error(), "SECRET"):
			t.Errorf("%s: the error's text holds the response: %v", c.name, err)
		case d > limit:
			t.Errorf("%s took %v; want at most %v", c.name, d, limit)
		}
	}
}

// poolAt returns a pool on addr that connects lazily, with no connect
// timeout of its own: only the store's timeout can end a call in time.
func poolAt(t *testing.T, addr string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@" + addr + "/test?sslmode=disable&connect_timeout=0")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentServer listens on a loopback port, accepts connections and never
// writes a byte. It stops when the test ends.
func silentServer(t *testing.T) string {
	p := startProxy(t, "")
	p.freeze()
	return p.addr()
}

// TestUnreachableDatabase checks that every call fails, rather than hanging
// or succeeding, when the database cannot answer. It needs no database.
func TestUnreachableDatabase(t *testing.T) {
	for name, addr := range map[string]func(t *testing.T) string{
		"closed port":                           closedPort,
		"server that accepts and never answers": silentServer,
	} {
		t.Run(name, func(t *testing.T) {
			const timeout = 100 * time.Millisecond
			s := postgres.New(poolAt(t, addr(t)), postgres.WithTimeout(timeout), postgres.WithCleanupInterval(time.Hour))
			defer s.Close()
			// Each call bounded by the timeout; the margin is for a loaded
			// machine, and still far below what would end a call without
			// it (nothing: no connect timeout, a silent server).
			expectUnavailable(t, context.Background(), s, nil, timeout+loadedTimeout)
		})
	}
}

// TestCanceledContext checks, without a database, that a call with a
// context already done fails at once, before it waits for a connection.
func TestCanceledContext(t *testing.T) {
	s := postgres.New(poolAt(t, silentServer(t)), postgres.WithTimeout(time.Hour))
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// At once: well inside loadedTimeout, which allows for a loaded
	// machine, and far from the hour a call that waited would take.
	expectUnavailable(t, ctx, s, context.Canceled, loadedTimeout)
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	expectUnavailable(t, ctx, s, context.DeadlineExceeded, loadedTimeout)
}

// TestClosedStoreRefusesCalls needs no database: calls after Close never
// reach the pool.
func TestClosedStoreRefusesCalls(t *testing.T) {
	s := postgres.New(poolAt(t, closedPort(t)))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	expectUnavailable(t, context.Background(), s, store.ErrClosed, loadedTimeout)
}

// TestCloseLeavesNoGoroutines runs the cleanup goroutine against a
// database that refuses connections, then checks that Close and the
// pool's Close leave nothing running.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	pool := poolAt(t, closedPort(t))
	var sweeps atomic.Int64
	s := postgres.New(pool, postgres.WithCleanupInterval(time.Millisecond), postgres.WithCleanupReport(func(_ int64, err error) {
		if err != nil {
			sweeps.Add(1)
		}
	}))
	for sweeps.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	s.Close()
	pool.Close()
}

// TestServerStopsAnswering runs a store through a proxy to the real
// database, then has the proxy stop forwarding: every call fails within
// the store's timeout, and a redemption that never reached the database
// leaves the token redeemable once.
func TestServerStopsAnswering(t *testing.T) {
	pool := migrated(t)
	schema := pool.Config().ConnConfig.RuntimeParams["search_path"]
	direct := postgres.New(pool, postgres.WithCleanupInterval(time.Hour))
	defer direct.Close()

	target := fmt.Sprintf("%s:%d", pool.Config().ConnConfig.Host, pool.Config().ConnConfig.Port)
	p := startProxy(t, target)
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(p.port())
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	proxied, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer proxied.Close()
	// The timeout that must run out, while the database is silent; calls
	// that must succeed, or end by their caller's cancel, go through
	// patient, whose timeout a loaded machine cannot reach.
	const timeout = 200 * time.Millisecond
	s := postgres.New(proxied, postgres.WithTimeout(timeout), postgres.WithCleanupInterval(time.Hour))
	defer s.Close()
	patient := postgres.New(proxied, postgres.WithTimeout(loadedTimeout), postgres.WithCleanupInterval(time.Hour))
	defer patient.Close()

	ctx := context.Background()
	id := storetest.ID()
	if ok, err := patient.Put(ctx, id, tokenP, time.Minute); err != nil || !ok {
		t.Fatalf("Put through the proxy = %v, %v", ok, err)
	}
	p.freeze()

	// A redemption canceled by its caller while the database is silent:
	// the cancel, not the store's timeout, ends it.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	if res, _, err := patient.Redeem(cctx, id, tokenP, "", 0); !errors.Is(err, store.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Redeem = %v, %v; want an error wrapping store.ErrUnavailable and context.Canceled", res, err)
	}

	// Each call bounded by the timeout; the margin is for a loaded
	// machine, and still far below pgx's 15s of draining.
	expectUnavailable(t, ctx, s, context.DeadlineExceeded, timeout+loadedTimeout)

	// The token is still there, once.
	for _, want := range []store.RedeemResult{store.Redeemed, store.Absent} {
		if res, _, err := direct.Redeem(ctx, id, tokenP, "", 0); err != nil || res != want {
			t.Fatalf("Redeem on the database = %v, %v; want %v", res, err, want)
		}
	}

	// pgx closes a connection whose call was interrupted by sending the
	// server a cancel request and draining the socket, for up to 15s each,
	// and closing the pool waits for that: close the proxy first, which
	// ends them at once.
	p.close()
}

// proxy forwards TCP connections to a target until frozen; from then on it
// forwards nothing, in either direction, and keeps every connection open:
// a server that has stopped answering. With no target it only accepts.
type proxy struct {
	ln     net.Listener
	target string
	frozen atomic.Bool
	mu     sync.Mutex
	once   sync.Once
	closed bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }
func (p *proxy) port() int    { return p.ln.Addr().(*net.TCPAddr).Port }
func (p *proxy) freeze()      { p.frozen.Store(true) }

// track remembers c, to close it with the proxy; once the proxy is
// closed it closes c and reports false.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) || p.target == "" {
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(server) {
			continue
		}
		p.wg.Go(func() { p.pipe(server, client) })
		p.wg.Go(func() { p.pipe(client, server) })
	}
}

// pipe copies src to dst, dropping what it reads while frozen. When
// either side closes, it closes both.
func (p *proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.frozen.Load() {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// close stops the proxy and closes every connection. It is safe to call
// more than once.
func (p *proxy) close() {
	p.once.Do(func() {
		p.ln.Close()
		p.mu.Lock()
		p.closed = true
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
}
