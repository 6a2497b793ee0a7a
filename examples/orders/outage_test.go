package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/internal/testenv"
)

// TestDatabaseOutage stops a private PostgreSQL server while clients send
// orders and starts it again. Clients retry each key until it is
// answered, as a client should. During the outage every answer is 503
// store_unavailable (problem+json), never a 500 or a 409; after the
// restart the app works again within 15 seconds without a restart of its
// own; and no key ran twice: every key made exactly one order.
func TestDatabaseOutage(t *testing.T) {
	pg := testenv.StartPostgres(t)
	cfg, err := pgxpool.ParseConfig(pg.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.ConnectTimeout = 2 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// A supplier call of 5ms keeps transactions open when the server stops:
	// their commits fail, and their keys must run once after the restart.
	srv := httptest.NewServer(newApp(pool, Options{Delay: 5 * time.Millisecond}))
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(client.CloseIdleConnections)

	// Each client sends its keys one after another, each until it is
	// answered with something other than 503, and reports every answer.
	type report struct {
		key string
		a   answer
	}
	const clients = 8
	reports := make(chan report, 1024)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := 0; ; i++ {
				key := fmt.Sprintf("c%d-%d", c, i)
				for {
					a := post(client, srv.URL, "/orders", `"`+key+`"`, `{"item":"`+key+`","qty":1}`)
					reports <- report{key, a}
					if a.err == nil && a.status != http.StatusServiceUnavailable {
						break
					}
					select {
					case <-stop:
						return // the key stays unanswered: checked below
					default:
					}
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	go func() { wg.Wait(); close(reports) }()

	var (
		answered   = map[string]answer{} // keys answered 201
		pending    = map[string]bool{}   // keys last answered 503
		created    atomic.Int64
		unavail    int
		unexpected []string
	)
	// read takes reports until until says stop or the clients finish.
	read := func(until func(r report) bool) {
		for r := range reports {
			switch {
			case r.a.err != nil:
				unexpected = append(unexpected, fmt.Sprintf("%s: %v", r.key, r.a.err))
			case r.a.status == http.StatusCreated:
				answered[r.key] = r.a
				delete(pending, r.key)
				created.Add(1)
			case r.a.status == http.StatusServiceUnavailable && r.a.code() == "store_unavailable" &&
				r.a.header.Get("Content-Type") == "application/problem+json":
				unavail++
				pending[r.key] = true
			default:
				unexpected = append(unexpected, fmt.Sprintf("%s: %v, code %q", r.key, r.a, r.a.code()))
			}
			if until != nil && until(r) {
				return
			}
		}
	}

	read(func(report) bool { return created.Load() >= 100 }) // traffic flows
	pg.Stop()
	read(func(report) bool { return unavail >= 50 }) // and is refused during the outage
	pg.Start()
	restarted := time.Now()
	read(func(r report) bool { return r.a.status == http.StatusCreated })
	recovered := time.Since(restarted)
	after := created.Load()
	read(func(report) bool { return created.Load() >= after+100 }) // and flows again
	close(stop)
	read(nil)

	if recovered > 15*time.Second {
		t.Errorf("the first order after the restart took %v, want at most 15s", recovered)
	}
	if len(unexpected) > 0 {
		t.Errorf("%d answers other than 201 or 503 store_unavailable, such as %q", len(unexpected), unexpected[0])
	}
	// A client stopped in the middle of retrying leaves its key pending:
	// send those once more, now that the database is up.
	for key := range pending {
		a := post(client, srv.URL, "/orders", `"`+key+`"`, `{"item":"`+key+`","qty":1}`)
		if a.status != http.StatusCreated {
			t.Errorf("%s after the outage: %v", key, a)
		}
		answered[key] = a
	}
	var rows, keys, most int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT item), coalesce(max(n), 0) FROM (SELECT item, count(*) OVER (PARTITION BY item) AS n FROM orders) o`).
		Scan(&rows, &keys, &most); err != nil {
		t.Fatal(err)
	}
	if rows != len(answered) || keys != len(answered) || most != 1 {
		t.Errorf("%d orders for %d items (at most %d for one); want one order for each of the %d keys answered", rows, keys, most, len(answered))
	}
	t.Logf("%d keys, %d answers 503 during the outage, first order %v after the restart", len(answered), unavail, recovered.Round(time.Millisecond))
}
