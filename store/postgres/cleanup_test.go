package postgres_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/postgres"
)

// expiredRows inserts n rows whose expiry has passed into each table, as
// rows left behind by calls look.
func expiredRows(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO replayguard_tokens (id, purpose, subject, expires_at)
			SELECT convert_to('expired-' || g, 'UTF8'), 'p', '', clock_timestamp() - interval '1 second' FROM generate_series(1, $1) g`,
		`INSERT INTO replayguard_nonces (key, expires_at)
			SELECT convert_to('expired-' || g, 'UTF8'), clock_timestamp() - interval '1 second' FROM generate_series(1, $1) g`,
		`INSERT INTO replayguard_records (key, completed, fingerprint, owner, expires_at)
			SELECT convert_to('expired-' || g, 'UTF8'), false, '', '', clock_timestamp() - interval '1 second' FROM generate_series(1, $1) g`,
		`INSERT INTO replayguard_rate_limits (key, tat)
			SELECT convert_to('idle-' || g, 'UTF8'), clock_timestamp() - interval '1 second' FROM generate_series(1, $1) g`,
	} {
		if _, err := pool.Exec(ctx, sql, n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

// liveRows stores one live entry of each kind through s.
func liveRows(t *testing.T, s *postgres.Store) {
	t.Helper()
	ctx := context.Background()
	if ok, err := s.Put(ctx, "live", store.Token{Purpose: "p"}, time.Hour); err != nil || !ok {
		t.Fatalf("Put = %v, %v", ok, err)
	}
	if ok, err := s.Put(ctx, store.NonceKey("s", "live"), store.Token{}, time.Hour); err != nil || !ok {
		t.Fatalf("Put nonce = %v, %v", ok, err)
	}
	if _, ok, err := s.Acquire(ctx, "live", "fp", "o", time.Hour); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	if ok, _, err := s.Allow(ctx, "live", store.Limit{Rate: 1, Burst: 1, Period: time.Hour}); err != nil || !ok {
		t.Fatalf("Allow = %v, %v", ok, err)
	}
}

// rowCounts returns how many rows each table holds, live or expired.
func rowCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"replayguard_tokens", "replayguard_nonces", "replayguard_records", "replayguard_rate_limits"} {
		var n int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[table] = n
	}
	return out
}

func TestCleanupDeletesExpiredRowsInBatches(t *testing.T) {
	pool := migrated(t)
	const batch = 10
	s := postgres.New(pool, postgres.WithCleanupBatch(batch), postgres.WithCleanupInterval(time.Hour))
	defer s.Close()
	expiredRows(t, pool, 25)
	liveRows(t, s)

	perTable := map[string]int64{}
	deleted, busy, err := s.Sweep(context.Background(), func(table string, n int64) {
		if n > batch {
			t.Errorf("a batch deleted %d rows from %s; want at most %d", n, table, batch)
		}
		perTable[table] += n
	})
	if err != nil || busy {
		t.Fatalf("Sweep = %d, busy %v, %v", deleted, busy, err)
	}
	if deleted != 4*25 {
		t.Fatalf("Sweep deleted %d rows, want %d: %v", deleted, 4*25, perTable)
	}
	for table, n := range perTable {
		if n != 25 {
			t.Errorf("%s: %d rows deleted, want 25", table, n)
		}
	}
	for table, n := range rowCounts(t, pool) {
		if n != 1 {
			t.Errorf("%s holds %d rows after the sweep; want only the live one", table, n)
		}
	}
	if _, ok, err := s.Acquire(context.Background(), "live", "fp2", "o2", time.Hour); err != nil || ok {
		t.Fatalf("the live record was lost: Acquire = %v, %v", ok, err)
	}
}

// TestCleanupOneInstanceAtATime holds the cleanup lock in another session,
// as a second instance in the middle of a sweep does: the store's sweep
// does nothing until the lock is free.
func TestCleanupOneInstanceAtATime(t *testing.T) {
	pool := migrated(t)
	s := postgres.New(pool, postgres.WithCleanupBatch(10), postgres.WithCleanupInterval(time.Hour))
	defer s.Close()
	ctx := context.Background()
	expiredRows(t, pool, 25)

	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var held int
	if err := other.QueryRow(ctx, "SELECT count(*) FROM replayguard_cleanup(1)").Scan(&held); err != nil || held == 0 {
		t.Fatalf("the other session's cleanup = %d rows, %v; want it to hold the lock", held, err)
	}
	if deleted, busy, err := s.Sweep(ctx, nil); err != nil || !busy || deleted != 0 {
		t.Fatalf("Sweep while another session cleans = %d, busy %v, %v; want 0, busy", deleted, busy, err)
	}
	if err := other.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if deleted, busy, err := s.Sweep(ctx, nil); err != nil || busy || deleted != 100 {
		t.Fatalf("Sweep after the lock was freed = %d, busy %v, %v; want 100", deleted, busy, err)
	}
}

// TestCleanupConcurrentInstances sweeps from four instances at once:
// every expired row is deleted exactly once and no sweep fails.
func TestCleanupConcurrentInstances(t *testing.T) {
	pool := migrated(t)
	expiredRows(t, pool, 500)
	var (
		mu      sync.Mutex
		total   int64
		wg      sync.WaitGroup
		errs    []error
		stores  []*postgres.Store
		ctx     = context.Background()
		rounds  = 5
		workers = 4
	)
	for range workers {
		s := postgres.New(pool, postgres.WithCleanupBatch(7), postgres.WithCleanupInterval(time.Hour))
		defer s.Close()
		stores = append(stores, s)
	}
	for _, s := range stores {
		wg.Go(func() {
			for range rounds {
				n, _, err := s.Sweep(ctx, nil)
				mu.Lock()
				total += n
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d sweeps failed, first: %v", len(errs), errs[0])
	}
	// Sweeps that found the lock held did nothing; one more sweeps the rest.
	n, busy, err := stores[0].Sweep(ctx, nil)
	if err != nil || busy {
		t.Fatalf("final Sweep = %d, busy %v, %v", n, busy, err)
	}
	if total+n != 4*500 {
		t.Fatalf("deleted %d rows in all; want %d", total+n, 4*500)
	}
}

// TestCleanupRunsInBackground checks that New starts the sweeps and
// WithCleanupReport hears of them.
func TestCleanupRunsInBackground(t *testing.T) {
	pool := migrated(t)
	expiredRows(t, pool, 30)
	reports := make(chan int64, 100)
	s := postgres.New(pool, postgres.WithCleanupInterval(10*time.Millisecond), postgres.WithCleanupBatch(7),
		postgres.WithCleanupReport(func(n int64, err error) {
			if err != nil {
				t.Errorf("background sweep: %v", err)
			}
			select {
			case reports <- n:
			default:
			}
		}))
	defer s.Close()
	var swept int64
	deadline := time.After(10 * time.Second)
	for swept < 4*30 {
		select {
		case n := <-reports:
			swept += n
		case <-deadline:
			t.Fatalf("background sweeps deleted %d rows in 10s; want %d", swept, 4*30)
		}
	}
	for table, n := range rowCounts(t, pool) {
		if n != 0 {
			t.Errorf("%s holds %d rows; want none", table, n)
		}
	}
}
