package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/internal/pgtest"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/postgres"
	"github.com/replayguard/replayguard/store/storetest"
)

// loadedTimeout is the store timeout of the suites on the real database:
// the concurrency cases queue a thousand calls on the pool, under -race,
// beside every other package's tests. The timeout mechanism itself is
// tested with short timeouts in failure_test.go.
const loadedTimeout = 5 * time.Second

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tests run on the database in REPLAYGUARD_TEST_POSTGRES_URL (e.g.
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable), each in a
// schema of its own that internal/pgtest drops when it ends.
var (
	databaseURL = pgtest.DatabaseURL
	admin       = pgtest.Exec
	newSchema   = pgtest.NewSchema
	schemaURL   = pgtest.SchemaURL
	newPool     = pgtest.Pool
)

// migrated returns a pool on a fresh schema that Migrate has set up.
func migrated(t testing.TB) *pgxpool.Pool {
	t.Helper()
	_, pool := pgtest.Migrated(t)
	return pool
}

// The remaining lifetime of a live row, read from the database on its own
// clock.
const (
	tokenTTLSQL = `SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint
		FROM replayguard_tokens WHERE id = $1 AND expires_at > clock_timestamp()`
	recordTTLSQL = `SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint
		FROM replayguard_records WHERE key = $1 AND expires_at > clock_timestamp()`
)

// ttl returns a storetest TTL reader that runs query for a key.
func ttl(t *testing.T, pool *pgxpool.Pool, query string) func(key string) (time.Duration, bool) {
	return func(key string) (time.Duration, bool) {
		t.Helper()
		var us int64
		err := pool.QueryRow(context.Background(), query, []byte(key)).Scan(&us)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return 0, false
		case err != nil:
			t.Fatalf("TTL of %q: %v", key, err)
		}
		return time.Duration(us) * time.Microsecond, true
	}
}

// instance is a store on a fresh migrated schema, for storetest. The
// database's clock is the real one: Now is time.Now and Advance sleeps.
func instance(t *testing.T, opts ...postgres.Option) storetest.Instance {
	pool := migrated(t)
	s := postgres.New(pool, append([]postgres.Option{postgres.WithTimeout(loadedTimeout)}, opts...)...)
	return storetest.Instance{
		Store: s, Limiter: s, Now: time.Now, Advance: time.Sleep,
		TTL: ttl(t, pool, tokenTTLSQL), RecordTTL: ttl(t, pool, recordTTLSQL),
	}
}

// TestConformance runs the suite with the cleanup sweeping every 20ms, so
// that it races the suite's calls: deleting expired rows must never change
// an answer.
func TestConformance(t *testing.T) {
	databaseURL(t)
	storetest.Run(t, func(t *testing.T) storetest.Instance {
		return instance(t, postgres.WithCleanupInterval(20*time.Millisecond), postgres.WithCleanupBatch(3))
	})
}

// TestBinaryKeys checks that every string reaches the database and comes
// back unchanged, whatever bytes it holds: keys, purposes, subjects,
// fingerprints and owners are bytea.
func TestBinaryKeys(t *testing.T) {
	in := instance(t)
	defer in.Store.Close()
	ctx := context.Background()
	odd := []string{"\x00", "\x00\x00t", "a\x00b", "\xff\xfe", "\x00n1:a:b", "\\x00", "'; DROP TABLE replayguard_tokens; --"}
	for i, v := range odd {
		id := fmt.Sprintf("%d%s", i, v)
		tok := store.Token{Purpose: "p" + v, Subject: v}
		if ok, err := in.Store.Put(ctx, id, tok, time.Minute); err != nil || !ok {
			t.Fatalf("Put(%q) = %v, %v", id, ok, err)
		}
		if res, rec, err := in.Store.Redeem(ctx, id, tok, "owner"+v, time.Minute); err != nil || res != store.Redeemed || rec.Owner != "owner"+v || rec.Fingerprint != tok.Fingerprint() {
			t.Fatalf("Redeem(%q) = %v, %+v, %v", id, res, rec, err)
		}
		if fresh, err := in.Store.Put(ctx, store.NonceKey(v, v), store.Token{}, time.Minute); err != nil || !fresh {
			t.Fatalf("nonce %q = %v, %v", v, fresh, err)
		}
		if fresh, err := in.Store.Put(ctx, store.NonceKey(v, v), store.Token{}, time.Minute); err != nil || fresh {
			t.Fatalf("nonce %q again = %v, %v", v, fresh, err)
		}
		key := "k" + v
		if _, ok, err := in.Store.Acquire(ctx, key, "fp"+v, "o"+v, time.Minute); err != nil || !ok {
			t.Fatalf("Acquire(%q) = %v, %v", key, ok, err)
		}
		if ok, err := in.Store.Complete(ctx, key, "o"+v, []byte(v), time.Minute); err != nil || !ok {
			t.Fatalf("Complete(%q) = %v, %v", key, ok, err)
		}
		rec, ok, err := in.Store.Acquire(ctx, key, "other", "other", time.Minute)
		if err != nil || ok || rec.Fingerprint != "fp"+v || string(rec.Response) != v || !rec.Completed {
			t.Fatalf("Acquire(%q) again = %+v, %v, %v", key, rec, ok, err)
		}
		if allowed, _, err := in.Limiter.Allow(ctx, v, store.Limit{Rate: 1, Burst: 1, Period: time.Hour}); err != nil || !allowed {
			t.Fatalf("Allow(%q) = %v, %v", v, allowed, err)
		}
	}
}

// TestPurposeWithNewline checks, as for store/redis, that a purpose
// containing the fingerprint's separator is refused when stored and never
// matches when presented, also against a token's record.
func TestPurposeWithNewline(t *testing.T) {
	in := instance(t)
	defer in.Store.Close()
	ctx := context.Background()
	if _, err := in.Store.Put(ctx, "bad", store.Token{Purpose: "a\nb"}, time.Minute); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Put with a newline in the purpose: err = %v, want an error", err)
	}
	stored := store.Token{Purpose: "a", Subject: "b\nc"}
	same := store.Token{Purpose: "a\nb", Subject: "c"} // the same fingerprint
	for _, owner := range []string{"", "o"} {
		id := storetest.ID()
		if _, err := in.Store.Put(ctx, id, stored, time.Minute); err != nil {
			t.Fatal(err)
		}
		if res, _, err := in.Store.Redeem(ctx, id, same, owner, time.Minute); err != nil || res != store.PurposeMismatch {
			t.Fatalf("owner %q: Redeem with the same fingerprint = %v, %v; want PurposeMismatch", owner, res, err)
		}
	}
	id := storetest.ID()
	if _, err := in.Store.Put(ctx, id, stored, time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, _, err := in.Store.Redeem(ctx, id, stored, "o", time.Minute); err != nil || res != store.Redeemed {
		t.Fatalf("Redeem = %v, %v", res, err)
	}
	if res, _, err := in.Store.Redeem(ctx, id, same, "o2", time.Minute); err != nil || res != store.PurposeMismatch {
		t.Fatalf("Redeem against the record with the same fingerprint = %v, %v; want PurposeMismatch", res, err)
	}
}

// TestLimiter checks the GCRA beyond the suite's case: refill, a burst
// below 1, and the zero limit.
func TestLimiter(t *testing.T) {
	in := instance(t)
	defer in.Store.Close()
	ctx := context.Background()
	allow := func(key string, l store.Limit) (bool, time.Duration) {
		t.Helper()
		ok, retry, err := in.Limiter.Allow(ctx, key, l)
		if err != nil {
			t.Fatal(err)
		}
		return ok, retry
	}
	fast := store.Limit{Rate: 10, Burst: 2, Period: time.Second} // one every 100ms
	key := storetest.ID()
	for i := range 2 {
		if ok, _ := allow(key, fast); !ok {
			t.Fatalf("event %d of the burst refused", i+1)
		}
	}
	ok, retry := allow(key, fast)
	if ok || retry <= 0 || retry > 100*time.Millisecond {
		t.Fatalf("third event = %v, retry %v; want refused, retry in (0, 100ms]", ok, retry)
	}
	time.Sleep(retry)
	if ok, _ := allow(key, fast); !ok {
		t.Fatalf("event after retryAfter (%v) refused", retry)
	}

	one := store.Limit{Rate: 1, Burst: 0, Period: time.Hour}
	key = storetest.ID()
	if ok, _ := allow(key, one); !ok {
		t.Fatal("first event with Burst 0 refused; want Burst 0 to count as 1")
	}
	if ok, retry := allow(key, one); ok || retry < 59*time.Minute || retry > time.Hour {
		t.Fatalf("second event with Burst 0 = %v, retry %v; want refused for about an hour", ok, retry)
	}
	for range 3 {
		if ok, _ := allow(key, store.Limit{}); !ok {
			t.Fatal("zero limit refused an event")
		}
	}
}

// TestOpen checks that Open takes key=value DSNs and URL settings, and
// owns its pool: Close closes its connections. A pool given to New stays
// open.
func TestOpen(t *testing.T) {
	schema := newSchema(t)
	ctx := context.Background()
	{
		pool := newPool(t, schema, 2)
		if err := postgres.Migrate(ctx, pool); err != nil {
			t.Fatal(err)
		}
		s := postgres.New(pool)
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if err := pool.Ping(ctx); err != nil {
			t.Fatalf("the pool given to New was closed with the store: %v", err)
		}
	}

	cfg, err := pgx.ParseConfig(databaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	app := "rgtest-open-" + schema
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable pool_max_conns=3 application_name=%s search_path=%s",
		cfg.Host, cfg.Port, cfg.User, cfg.Database, app, schema)
	if cfg.Password != "" {
		dsn += " password=" + cfg.Password
	}
	for name, conn := range map[string]string{
		"key=value DSN": dsn,
		"URL":           schemaURL(t, schema) + "&pool_max_conns=3&application_name=" + app,
	} {
		t.Run(name, func(t *testing.T) {
			s, err := postgres.Open(ctx, conn)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			id := storetest.ID()
			tok := store.Token{Purpose: "p"}
			if ok, err := s.Put(ctx, id, tok, time.Minute); err != nil || !ok {
				t.Fatalf("Put = %v, %v", ok, err)
			}
			if res, _, err := s.Redeem(ctx, id, tok, "", 0); err != nil || res != store.Redeemed {
				t.Fatalf("Redeem = %v, %v", res, err)
			}
			backends := func() int {
				pool := newPool(t, schema, 1)
				var n int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
					t.Fatal(err)
				}
				pool.Close()
				return n
			}
			if n := backends(); n < 1 || n > 3 {
				t.Fatalf("%d connections named %s; want 1 to pool_max_conns (3)", n, app)
			}
			s.Close()
			deadline := time.Now().Add(5 * time.Second)
			for backends() != 0 {
				if time.Now().After(deadline) {
					t.Fatal("the pool Open made is still connected after Close")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	if _, err := postgres.Open(ctx, "postgres://host:notaport/db"); err == nil {
		t.Fatal("Open of a URL it cannot parse succeeded")
	}
}

// putRedeemPairs stores and redeems one token per iteration, from parallel
// goroutines: an issue and its redemption, two statements.
func BenchmarkPutRedeem(b *testing.B) {
	pool := migrated(b)
	s := postgres.New(pool)
	defer s.Close()
	ctx := context.Background()
	tok := store.Token{Purpose: "default", Subject: "bench"}
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := storetest.ID()
			if ok, err := s.Put(ctx, id, tok, time.Minute); err != nil || !ok {
				b.Errorf("put %s = %v, %v", id, ok, err)
				return
			}
			if res, _, err := s.Redeem(ctx, id, tok, "", 0); err != nil || res != store.Redeemed {
				b.Errorf("redeem %s = %v, %v", id, res, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}

// BenchmarkAcquireComplete runs one first execution's store work per
// iteration, on distinct keys from parallel goroutines: Acquire, then
// Complete with a 1 KiB response.
func BenchmarkAcquireComplete(b *testing.B) {
	pool := migrated(b)
	s := postgres.New(pool)
	defer s.Close()
	ctx := context.Background()
	resp := make([]byte, 1024)
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprint(next.Add(1))
			if _, ok, err := s.Acquire(ctx, key, "fingerprint", "owner", time.Minute); err != nil || !ok {
				b.Errorf("acquire %s = %v, %v", key, ok, err)
				return
			}
			if ok, err := s.Complete(ctx, key, "owner", resp, time.Minute); err != nil || !ok {
				b.Errorf("complete %s = %v, %v", key, ok, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "executions/s")
}
