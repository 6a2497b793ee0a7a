package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/internal/pgtest"
)

// TestLoad measures what the run-once claim costs an order: POST /orders
// through the app (pgtx.Idempotent, a fresh key per request) against the
// same handler without pgtx (the same INSERT in a plain transaction:
// BEGIN, INSERT, COMMIT), on the same database, with synchronous_commit
// on and off, in alternating rounds. It is a measurement, not a test:
// it runs only when ORDERS_LOAD names a round's duration, and prints a
// table. Settings:
//
//	ORDERS_LOAD=5s         each variant's round
//	ORDERS_LOAD_ROUNDS=3   rounds of every variant, alternating
//	ORDERS_LOAD_CLIENTS=32 concurrent clients, and the pool's connections
//
// on the database of REPLAYGUARD_TEST_POSTGRES_URL, in a schema of its
// own:
//
//	ORDERS_LOAD=5s REPLAYGUARD_TEST_POSTGRES_URL=postgres://… go test -run TestLoad -v ./examples/orders
func TestLoad(t *testing.T) {
	round := os.Getenv("ORDERS_LOAD")
	if round == "" {
		t.Skip("a measurement: set ORDERS_LOAD=5s (a round's duration) to run it")
	}
	d, err := time.ParseDuration(round)
	if err != nil || d <= 0 {
		t.Fatalf("ORDERS_LOAD=%q: want a duration", round)
	}
	rounds, clients := envInt(t, "ORDERS_LOAD_ROUNDS", 3), envInt(t, "ORDERS_LOAD_CLIENTS", 32)
	schema := pgtest.NewSchema(t)
	ctx := context.Background()
	if err := setup(ctx, pgtest.Pool(t, schema, 2)); err != nil {
		t.Fatal(err)
	}
	monitor := pgtest.Pool(t, schema, 1)
	var fsync, walSync string
	if err := monitor.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('wal_sync_method')`).Scan(&fsync, &walSync); err != nil {
		t.Fatal(err)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("fsync=%s wal_sync_method=%s, %d clients, %d rounds of %v, load average before: %s\n", fsync, walSync, clients, rounds, d, load)

	variants := []loadVariant{
		{name: "pgtx claim", claim: true, syncCommit: "on"},
		{name: "plain transaction", claim: false, syncCommit: "on"},
		{name: "pgtx claim", claim: true, syncCommit: "off"},
		{name: "plain transaction", claim: false, syncCommit: "off"},
	}
	results := make([]loadResult, len(variants))
	for r := range rounds {
		for i, v := range variants {
			res := measure(t, schema, monitor, v, clients, d, fmt.Sprintf("orders-load-%d-%d", r, i))
			fmt.Printf("round %d  %-17s sync_commit=%-3s %8.0f req/s  p50 %6.2f ms  p99 %6.2f ms  errors %d\n",
				r+1, v.name, v.syncCommit, res.throughput(), ms(res.percentile(0.50)), ms(res.percentile(0.99)), res.errors)
			results[i].add(res)
		}
	}
	fmt.Printf("\n| variant | synchronous_commit | req/s | p50 | p99 | statements/request | WAL bytes/request | WAL fsyncs/request | backend CPU/request | Go CPU/request | errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, v := range variants {
		res := results[i]
		fmt.Printf("| %s | %s | %.0f | %.2f ms | %.2f ms | %.2f | %.0f | %.3f | %.0f µs | %.0f µs | %d |\n", v.name, v.syncCommit, res.throughput(),
			ms(res.percentile(0.50)), ms(res.percentile(0.99)), res.perRequest(res.statements), res.perRequest(res.walBytes), res.perRequest(res.walSyncs),
			res.cpuPerRequest(res.backendCPU), res.cpuPerRequest(res.processCPU), res.errors)
	}
	for _, sync := range []int{0, 2} {
		claim, plain := results[sync], results[sync+1]
		fmt.Printf("synchronous_commit=%s: throughput ratio pgtx/plain %.2f, p99 %.2f ms vs %.2f ms\n",
			variants[sync].syncCommit, claim.throughput()/plain.throughput(), ms(claim.percentile(0.99)), ms(plain.percentile(0.99)))
	}
	for i := range results {
		if results[i].errors > 0 {
			t.Errorf("%s (synchronous_commit=%s): %d requests failed", variants[i].name, variants[i].syncCommit, results[i].errors)
		}
	}
}

// loadVariant is one way of serving POST /orders.
type loadVariant struct {
	name       string
	claim      bool   // through pgtx.Idempotent, else the handler alone in a plain transaction
	syncCommit string // synchronous_commit of the app's sessions
}

// loadResult is what rounds of one variant measured.
type loadResult struct {
	elapsed   time.Duration
	latencies []time.Duration // of the measured requests
	errors    int
	// Over every request of the pool's life (warm-up included): requests,
	// the statements the app sent, the WAL it wrote and the WAL fsyncs
	// the server made meanwhile (the whole server's, so other sessions'
	// work counts too).
	requests, statements, walBytes, walSyncs int64
	// CPU time, over the same span: of the pool's PostgreSQL backends,
	// and of this process (the app and the load's clients).
	backendCPU, processCPU time.Duration
}

func (r *loadResult) add(o loadResult) {
	r.elapsed += o.elapsed
	r.latencies = append(r.latencies, o.latencies...)
	r.errors += o.errors
	r.requests += o.requests
	r.statements += o.statements
	r.walBytes += o.walBytes
	r.walSyncs += o.walSyncs
	r.backendCPU += o.backendCPU
	r.processCPU += o.processCPU
}

func (r *loadResult) throughput() float64 {
	return float64(len(r.latencies)) / r.elapsed.Seconds()
}

func (r *loadResult) percentile(p float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	slices.Sort(r.latencies)
	return r.latencies[min(len(r.latencies)-1, int(p*float64(len(r.latencies))))]
}

func (r *loadResult) perRequest(n int64) float64 { return float64(n) / float64(r.requests) }

// cpuPerRequest is d per request, in µs.
func (r *loadResult) cpuPerRequest(d time.Duration) float64 {
	return float64(d) / float64(time.Microsecond) / float64(r.requests)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// countingTracer counts the statements a pool sends: each is one round
// trip.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// measure serves POST /orders as v says, on a pool of its own whose
// sessions are named name, and sends it orders from clients for d after
// a warm-up of a second.
func measure(t *testing.T, schema string, monitor *pgxpool.Pool, v loadVariant, clients int, d time.Duration, name string) loadResult {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	tracer := &countingTracer{}
	cfg.MaxConns = int32(clients)
	cfg.ConnConfig.Tracer = tracer
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = v.syncCommit
	var lsn string
	var syncs0 int64
	if err := monitor.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, (SELECT wal_sync FROM pg_stat_wal)`).Scan(&lsn, &syncs0); err != nil {
		t.Fatal(err)
	}
	cpu0 := processCPU(t)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler
	if v.claim {
		h = newApp(pool, Options{})
	} else {
		a := &app{pool: pool, log: slog.New(slog.DiscardHandler)}
		r := gin.New()
		r.POST("/orders", a.handle(a.createOrder))
		h = r
	}
	srv := httptest.NewServer(h)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}

	var (
		requests atomic.Int64
		seq      atomic.Int64
	)
	// drive sends orders from clients until the deadline; it returns the
	// latencies of the successes and the number of failures.
	drive := func(until time.Time) ([]time.Duration, int) {
		lat := make([][]time.Duration, clients)
		errs := make([]int, clients)
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				for time.Now().Before(until) {
					key := `"` + name + "-" + strconv.FormatInt(seq.Add(1), 10) + `"`
					start := time.Now()
					a := post(client, srv.URL, "/orders", key, `{"item":"load","qty":1}`)
					requests.Add(1)
					if a.err != nil || a.status != http.StatusCreated {
						errs[c]++
						continue
					}
					lat[c] = append(lat[c], time.Since(start))
				}
			})
		}
		wg.Wait()
		var all []time.Duration
		n := 0
		for c := range clients {
			all = append(all, lat[c]...)
			n += errs[c]
		}
		return all, n
	}
	drive(time.Now().Add(time.Second)) // warm-up: connections, prepared statements
	start := time.Now()
	lat, errs := drive(start.Add(d))
	elapsed := time.Since(start)

	// The CPU time of the pool's backends, from /proc while they live
	// (the server runs on this machine).
	var backends time.Duration
	rows, err := monitor.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, name)
	if err != nil {
		t.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		backends += threadCPU(t, int(pid))
	}
	cpu1 := processCPU(t)

	srv.Close()
	client.CloseIdleConnections()
	pool.Close()
	// A session adds its WAL counters to pg_stat_wal when it exits.
	waitFor(t, monitor, "the load's sessions to end", `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, name, 0)
	var walBytes, syncs1 int64
	if err := monitor.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint, (SELECT wal_sync FROM pg_stat_wal)`, lsn).Scan(&walBytes, &syncs1); err != nil {
		t.Fatal(err)
	}
	return loadResult{
		elapsed: elapsed, latencies: lat, errors: errs,
		requests: requests.Load(), statements: tracer.n.Load(), walBytes: walBytes, walSyncs: syncs1 - syncs0,
		backendCPU: backends, processCPU: cpu1 - cpu0,
	}
}

// processCPU is the CPU time this process has used.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// threadCPU is the CPU time (user and system) process pid has used, from
// /proc/pid/stat, or 0 when it cannot be read.
func threadCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command, which is in parentheses: state is
	// field 3, utime and stime fields 14 and 15.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/pid/stat's times
// (100 on Linux on every common architecture).
const clockTicks = 100

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
