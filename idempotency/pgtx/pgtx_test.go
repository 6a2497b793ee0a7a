package pgtx_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/idempotency/pgtx"
	"github.com/replayguard/replayguard/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a migrated schema with a business table, reached through
// pgx (pool) and database/sql (sqlDB).
type fixture struct {
	pool, monitor *pgxpool.Pool
	sqlDB         *sql.DB
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	schema, _ := pgtest.Migrated(t)
	pool := pgtest.Pool(t, schema, 64)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("pgx", pgtest.SchemaURL(t, schema))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return fixture{pool: pool, sqlDB: db, monitor: pgtest.Pool(t, schema, 2)}
}

// dbs are the two ways to open transactions, tested alike.
func (f fixture) dbs() map[string]pgtx.DB {
	return map[string]pgtx.DB{"pgx": pgtx.Pool(f.pool), "database/sql": pgtx.SQLDB(f.sqlDB)}
}

func (f fixture) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

var errBusiness = errors.New("out of stock")

func TestDo(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for name, db := range f.dbs() {
		t.Run(name, func(t *testing.T) {
			var runs atomic.Int32
			fn := func(status int, end error) func(context.Context, pgtx.Tx) (idempotency.Outcome, error) {
				return func(ctx context.Context, tx pgtx.Tx) (idempotency.Outcome, error) {
					runs.Add(1)
					if err := tx.Exec(ctx, `INSERT INTO orders (item) VALUES ($1)`, name); err != nil {
						return idempotency.Outcome{}, err
					}
					return idempotency.Outcome{Status: status, Body: []byte("run " + strconv.Itoa(int(runs.Load())))}, end
				}
			}
			before := f.orders(t)
			key := func(s string) string { return name + ":" + s }
			steps := []struct {
				name         string
				key, fp      string
				fn           func(context.Context, pgtx.Tx) (idempotency.Outcome, error)
				wantErr      error
				wantReplayed bool
				wantRuns     int32
				wantOrders   int
				wantBody     string
			}{
				{"a first run commits its write and its outcome", key("a"), "fp", fn(201, nil), nil, false, 1, 1, "run 1"},
				{"a duplicate gets the outcome and runs nothing", key("a"), "fp", fn(201, nil), nil, true, 1, 1, "run 1"},
				{"another request with the key is refused", key("a"), "other", fn(201, nil), idempotency.ErrFingerprintMismatch, false, 1, 1, ""},
				{"an outcome that undoes its writes is recorded alone", key("b"), "fp", fn(409, errors.Join(errBusiness, pgtx.Undo)), nil, false, 2, 1, "run 2"},
				{"and replayed", key("b"), "fp", fn(201, nil), nil, true, 2, 1, "run 2"},
				{"an error rolls everything back", key("c"), "fp", fn(500, errBusiness), errBusiness, false, 3, 1, "run 3"},
				{"so the retry runs as a first run", key("c"), "fp", fn(201, nil), nil, false, 4, 2, "run 4"},
			}
			for _, s := range steps {
				out, replayed, err := pgtx.Do(ctx, db, s.key, s.fp, s.fn)
				if !errors.Is(err, s.wantErr) || (err == nil) != (s.wantErr == nil) || replayed != s.wantReplayed ||
					runs.Load() != s.wantRuns || f.orders(t)-before != s.wantOrders || (s.wantBody != "" && string(out.Body) != s.wantBody) {
					t.Fatalf("%s: %q, replayed %v, %v; %d runs, %d orders; want %q, %v, %v, %d runs, %d orders",
						s.name, out.Body, replayed, err, runs.Load(), f.orders(t)-before, s.wantBody, s.wantReplayed, s.wantErr, s.wantRuns, s.wantOrders)
				}
			}
		})
	}
}

func TestDoPanicRollsBack(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not go on")
			}
		}()
		_, _, _ = pgtx.Do(ctx, pgtx.Pool(f.pool), "k", "fp", func(ctx context.Context, tx pgtx.Tx) (idempotency.Outcome, error) {
			if err := tx.Exec(ctx, `INSERT INTO orders (item) VALUES ('x')`); err != nil {
				t.Error(err)
			}
			panic("boom")
		})
	}()
	if n := f.orders(t); n != 0 {
		t.Fatalf("%d orders after the panic, want 0", n)
	}
	if _, replayed, err := pgtx.Do(ctx, pgtx.Pool(f.pool), "k", "fp", func(context.Context, pgtx.Tx) (idempotency.Outcome, error) {
		return idempotency.Outcome{Status: 201}, nil
	}); err != nil || replayed {
		t.Fatalf("retry after the panic = %v, %v; want a first run", replayed, err)
	}
}

// TestConcurrentDuplicatesWaitForTheFirst: duplicates that arrive while
// the first run's transaction is open wait on its claim and then get its
// committed outcome (a bounded wait: past the lock timeout they get
// ErrInProgress); exactly one run commits one write.
func TestConcurrentDuplicatesWaitForTheFirst(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const n = 20
	for name, db := range f.dbs() {
		t.Run(name, func(t *testing.T) {
			key := name + ":k"
			started, release := make(chan struct{}), make(chan struct{})
			var runs atomic.Int32
			fn := func(ctx context.Context, tx pgtx.Tx) (idempotency.Outcome, error) {
				if runs.Add(1) == 1 {
					close(started)
					<-release // hold the transaction open
				}
				if err := tx.Exec(ctx, `INSERT INTO orders (item) VALUES ($1)`, key); err != nil {
					return idempotency.Outcome{}, err
				}
				return idempotency.Outcome{Status: 201, Body: []byte("the order")}, nil
			}
			type result struct {
				out      idempotency.Outcome
				replayed bool
				err      error
			}
			results := make(chan result, n)
			var wg sync.WaitGroup
			wg.Go(func() {
				out, replayed, err := pgtx.Do(ctx, db, key, "fp", fn)
				results <- result{out, replayed, err}
			})
			<-started
			for range n - 1 {
				wg.Go(func() {
					out, replayed, err := pgtx.Do(ctx, db, key, "fp", fn, pgtx.WithLockTimeout(time.Minute))
					results <- result{out, replayed, err}
				})
			}
			// The duplicates wait on the claim: none can finish first.
			waiting := waitForLocks(t, f.monitor, n-1)
			close(release)
			wg.Wait()
			close(results)
			firsts, replays := 0, 0
			for r := range results {
				switch {
				case r.err == nil && !r.replayed && string(r.out.Body) == "the order":
					firsts++
				case r.err == nil && r.replayed && string(r.out.Body) == "the order":
					replays++
				default:
					t.Errorf("unexpected result %+v: %v", r, r.err)
				}
			}
			if firsts != 1 || replays != n-1 || runs.Load() != 1 || !waiting {
				t.Fatalf("%d first runs, %d replays, %d runs (waiting seen: %v); want 1, %d, 1", firsts, replays, runs.Load(), waiting, n-1)
			}
			// Past the lock timeout a duplicate is told to retry.
			started2, release2 := make(chan struct{}), make(chan struct{})
			go func() {
				_, _, _ = pgtx.Do(ctx, db, key+"2", "fp", func(context.Context, pgtx.Tx) (idempotency.Outcome, error) {
					close(started2)
					<-release2
					return idempotency.Outcome{Status: 201}, nil
				})
			}()
			<-started2
			_, _, err := pgtx.Do(ctx, db, key+"2", "fp", fn, pgtx.WithLockTimeout(50*time.Millisecond))
			close(release2)
			if !errors.Is(err, idempotency.ErrInProgress) {
				t.Fatalf("past the lock timeout = %v, want ErrInProgress", err)
			}
		})
	}
}

// waitForLocks polls the database until n sessions wait on a lock, and
// reports whether they did within ten seconds.
func waitForLocks(t *testing.T, pool *pgxpool.Pool, n int) bool {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting int
		if err := pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return true
		}
		time.Sleep(10 * time.Millisecond) // polling the database's view of other sessions
	}
	return false
}
