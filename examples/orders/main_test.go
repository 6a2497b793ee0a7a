package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/pgtest"
	"github.com/replayguard/replayguard/problem"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	os.Exit(m.Run())
}

// fixture is the app on a loopback server, over a fresh schema of the
// test database.
type fixture struct {
	pool   *pgxpool.Pool
	base   string // the app's URL
	client *http.Client
}

func newFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.NewSchema(t), 24)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newApp(pool, opts))
	t.Cleanup(srv.Close)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)
	return &fixture{pool: pool, base: srv.URL, client: client}
}

// answer is one response of the app's.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error // the request failed
}

func (a answer) replayed() bool { return a.header.Get(idempotency.ReplayedHeader) == "true" }

// code is the problem code of a problem+json answer, else "".
func (a answer) code() string {
	if a.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p problem.Problem
	_ = json.Unmarshal(a.body, &p)
	return p.Code
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s (replayed %v)", a.status, bytes.TrimSpace(a.body), a.replayed())
}

// post sends POST path with an Idempotency-Key header (none when key is
// "") and body as JSON. It is safe to call from any goroutine: a failed
// request is answer.err.
func post(client *http.Client, base, path, key, body string) answer {
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.KeyHeader, key)
	}
	res, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, header: res.Header, body: b, err: err}
}

func (f *fixture) post(path, key, body string) answer { return post(f.client, f.base, path, key, body) }

// count returns the number of rows in table.
func (f *fixture) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestContract walks the API request by request, checking each answer's
// status, body and headers (replays byte for byte) and the rows that
// follow: orders, payments, and Replayguard's records.
func TestContract(t *testing.T) {
	f := newFixture(t, Options{})
	const book = `{"item":"book","qty":2}`
	steps := []struct {
		name, path, key, body string
		status                int
		code                  string // the problem code; "" for a JSON answer
		want                  string // the exact body of a JSON answer
		replayed              bool
		sameAs                string // an earlier step whose answer this one repeats byte for byte
		orders, payments      int
		records               int // rows of replayguard_records: answers kept for retries
	}{
		{name: "an order is created", path: "/orders", key: `"k-1"`, body: book,
			status: 201, want: `{"id":1,"item":"book","qty":2,"state":"pending","version":1}`, orders: 1, records: 1},
		{name: "its retry gets the same answer, marked replayed", path: "/orders", key: `"k-1"`, body: book,
			status: 201, replayed: true, sameAs: "an order is created", orders: 1, records: 1},
		{name: "the same JSON spelt another way is the same request", path: "/orders", key: `"k-1"`, body: `{ "qty": 2, "item": "book" }`,
			status: 201, replayed: true, sameAs: "an order is created", orders: 1, records: 1},
		{name: "the key with another body is refused", path: "/orders", key: `"k-1"`, body: `{"item":"book","qty":3}`,
			status: 422, code: "idempotency_key_reused", orders: 1, records: 1},
		{name: "a bare key is accepted", path: "/orders", key: `k-2`, body: `{"item":"pen","qty":1}`,
			status: 201, want: `{"id":2,"item":"pen","qty":1,"state":"pending","version":1}`, orders: 2, records: 2},
		{name: "a request without a key is refused before the handler", path: "/orders", body: book,
			status: 400, code: "idempotency_key_missing", orders: 2, records: 2},
		{name: "malformed JSON is 400", path: "/orders", key: `"k-3"`, body: `{"item":`,
			status: 400, code: "invalid_request", orders: 2, records: 3},
		{name: "and that 400 is kept: its retry gets it again", path: "/orders", key: `"k-3"`, body: `{"item":`,
			status: 400, code: "invalid_request", replayed: true, sameAs: "malformed JSON is 400", orders: 2, records: 3},
		{name: "a qty below 1 is 400", path: "/orders", key: `"k-4"`, body: `{"item":"book","qty":0}`,
			status: 400, code: "invalid_request", orders: 2, records: 4},
		{name: "out of stock is 409 and leaves no order", path: "/orders", key: `"k-5"`, body: `{"item":"out-of-stock","qty":1}`,
			status: 409, code: "out_of_stock", orders: 2, records: 5},
		{name: "its retry gets the same 409", path: "/orders", key: `"k-5"`, body: `{"item":"out-of-stock","qty":1}`,
			status: 409, code: "out_of_stock", replayed: true, sameAs: "out of stock is 409 and leaves no order", orders: 2, records: 5},
		{name: "a failure is 500 and leaves nothing", path: "/orders", key: `"k-6"`, body: `{"item":"fail","qty":1}`,
			status: 500, code: "internal_error", orders: 2, records: 5},
		{name: "its retry runs again and fails again", path: "/orders", key: `"k-6"`, body: `{"item":"fail","qty":1}`,
			status: 500, code: "internal_error", orders: 2, records: 5},
		{name: "a pending order is paid without a key", path: "/orders/1/pay",
			status: 200, want: `{"id":1,"state":"paid","version":2}`, orders: 2, payments: 1, records: 5},
		{name: "paying it again answers its state and pays nothing", path: "/orders/1/pay",
			status: 200, want: `{"id":1,"state":"paid","version":2}`, orders: 2, payments: 1, records: 5},
		{name: "a pay with a key runs once for it", path: "/orders/2/pay", key: `"p-1"`,
			status: 200, want: `{"id":2,"state":"paid","version":2}`, orders: 2, payments: 2, records: 6},
		{name: "and its retry is replayed", path: "/orders/2/pay", key: `"p-1"`,
			status: 200, replayed: true, sameAs: "a pay with a key runs once for it", orders: 2, payments: 2, records: 6},
		{name: "paying an unknown order is 404", path: "/orders/99/pay",
			status: 404, code: "not_found", orders: 2, payments: 2, records: 6},
		{name: "paying a malformed order id is 404", path: "/orders/first/pay",
			status: 404, code: "not_found", orders: 2, payments: 2, records: 6},
		{name: "an unknown route is 404", path: "/refunds", key: `"r-1"`, body: book,
			status: 404, code: "not_found", orders: 2, payments: 2, records: 6},
	}
	seen := map[string]answer{}
	for _, s := range steps {
		a := f.post(s.path, s.key, s.body)
		if a.err != nil {
			t.Fatalf("%s: %v", s.name, a.err)
		}
		seen[s.name] = a
		if a.status != s.status || a.code() != s.code || a.replayed() != s.replayed {
			t.Fatalf("%s: %v, code %q; want %d, code %q, replayed %v", s.name, a, a.code(), s.status, s.code, s.replayed)
		}
		if s.want != "" && string(a.body) != s.want {
			t.Errorf("%s: body %s, want %s", s.name, a.body, s.want)
		}
		if s.code == "out_of_stock" && !bytes.Contains(a.body, []byte(`"type":"urn:replayguard:problem:out_of_stock"`)) {
			t.Errorf("%s: body %s lacks the problem type", s.name, a.body)
		}
		if s.sameAs != "" {
			first := seen[s.sameAs]
			for _, h := range []string{"Content-Type", "Cache-Control", "Content-Length"} {
				if a.header.Get(h) != first.header.Get(h) {
					t.Errorf("%s: %s %q, want %q as in %q", s.name, h, a.header.Get(h), first.header.Get(h), s.sameAs)
				}
			}
			if a.status != first.status || !bytes.Equal(a.body, first.body) {
				t.Errorf("%s: %v, want the answer of %q byte for byte: %v", s.name, a, s.sameAs, first)
			}
		}
		if o, p, r := f.count(t, "orders"), f.count(t, "payments"), f.count(t, "replayguard_records"); o != s.orders || p != s.payments || r != s.records {
			t.Fatalf("%s: %d orders, %d payments, %d records; want %d, %d, %d", s.name, o, p, r, s.orders, s.payments, s.records)
		}
	}
}

// TestConcurrentDuplicatesMakeOneOrder: 50 requests with one key at once
// (the supplier takes 300ms, so most of them wait for the first one's
// transaction) make one order; the first is answered 201, the others
// replay that 201 byte for byte, and none is told 409 request_in_progress
// (they wait up to the 5s lock timeout).
func TestConcurrentDuplicatesMakeOneOrder(t *testing.T) {
	f := newFixture(t, Options{Delay: 300 * time.Millisecond})
	const n = 50
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i] = f.post("/orders", `"same-key"`, `{"item":"book","qty":1}`)
		})
	}
	close(start)
	wg.Wait()
	firsts, replays := 0, 0
	var body []byte
	for _, a := range answers {
		switch {
		case a.err != nil:
			t.Errorf("request failed: %v", a.err)
		case a.status != http.StatusCreated:
			t.Errorf("answer %v, code %q; want 201", a, a.code())
		case a.replayed():
			replays++
		default:
			firsts++
		}
		if a.status == http.StatusCreated {
			if body == nil {
				body = a.body
			} else if !bytes.Equal(a.body, body) {
				t.Errorf("answers differ: %s and %s", a.body, body)
			}
		}
	}
	if firsts != 1 || replays != n-1 {
		t.Errorf("%d first answers and %d replays, want 1 and %d", firsts, replays, n-1)
	}
	if o := f.count(t, "orders"); o != 1 {
		t.Errorf("%d orders, want 1", o)
	}
}

// TestConcurrentPaysMakeOnePayment: 20 pays of one order at once, half
// with keys of their own and half without, all answer 200 with the paid
// order; the optimistic lock lets exactly one of them pay.
func TestConcurrentPaysMakeOnePayment(t *testing.T) {
	f := newFixture(t, Options{})
	if a := f.post("/orders", `"order"`, `{"item":"book","qty":1}`); a.status != http.StatusCreated {
		t.Fatalf("creating the order: %v", a)
	}
	const n = 20
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		key := ""
		if i%2 == 0 {
			key = fmt.Sprintf(`"pay-%d"`, i)
		}
		wg.Go(func() {
			<-start
			answers[i] = f.post("/orders/1/pay", key, "")
		})
	}
	close(start)
	wg.Wait()
	for i, a := range answers {
		if a.err != nil || a.status != http.StatusOK || string(a.body) != `{"id":1,"state":"paid","version":2}` {
			t.Errorf("pay %d: %v (%v); want 200 with the paid order", i, a, a.err)
		}
	}
	if p := f.count(t, "payments"); p != 1 {
		t.Errorf("%d payments, want 1", p)
	}
}

func TestLoadConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		want config
	}{
		{"ADDR defaults to 127.0.0.1:8090 and ORDERS_DELAY to 0", map[string]string{"DATABASE_URL": "postgres://db/orders"},
			config{dsn: "postgres://db/orders", addr: "127.0.0.1:8090"}},
		{"ADDR and ORDERS_DELAY are read", map[string]string{"DATABASE_URL": "postgres://db/orders", "ADDR": ":9000", "ORDERS_DELAY": "2s"},
			config{dsn: "postgres://db/orders", addr: ":9000", delay: 2 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := loadConfig(func(k string) string { return c.env[k] })
			if err != nil || got != c.want {
				t.Errorf("loadConfig = %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
	for _, c := range []struct {
		name, want string
		env        map[string]string
	}{
		{"DATABASE_URL is required", "DATABASE_URL is not set", map[string]string{"ADDR": ":9000"}},
		{"a negative ORDERS_DELAY is refused", "ORDERS_DELAY", map[string]string{"DATABASE_URL": "postgres://db/orders", "ORDERS_DELAY": "-1s"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := loadConfig(func(k string) string { return c.env[k] }); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("loadConfig = %v, want an error naming %s", err, c.want)
			}
		})
	}
}

// TestRun runs the command in-process: it refuses a missing or malformed
// configuration, and otherwise sets the database up, serves, and stops
// when its context ends.
func TestRun(t *testing.T) {
	t.Run("without DATABASE_URL it says what to set", func(t *testing.T) {
		err := run(context.Background(), func(string) string { return "" }, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "DATABASE_URL is not set") {
			t.Errorf("run = %v, want an error naming DATABASE_URL", err)
		}
	})
	t.Run("a malformed ORDERS_DELAY is an error", func(t *testing.T) {
		env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/none", "ORDERS_DELAY": "soon"}
		err := run(context.Background(), func(k string) string { return env[k] }, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "ORDERS_DELAY") {
			t.Errorf("run = %v, want an error naming ORDERS_DELAY", err)
		}
	})
	t.Run("it creates its tables, serves, and stops", func(t *testing.T) {
		schema := pgtest.NewSchema(t)
		env := map[string]string{"DATABASE_URL": pgtest.SchemaURL(t, schema), "ADDR": "127.0.0.1:0"}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		addrc, done := make(chan string, 1), make(chan error, 1)
		var out bytes.Buffer
		go func() { done <- run(ctx, func(k string) string { return env[k] }, &out, func(a string) { addrc <- a }) }()
		var addr string
		select {
		case addr = <-addrc:
		case err := <-done:
			t.Fatalf("run returned before listening: %v", err)
		}
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{}}
		defer client.CloseIdleConnections()
		if a := post(client, "http://"+addr, "/orders", `"k"`, `{"item":"book","qty":1}`); a.status != http.StatusCreated {
			t.Errorf("POST /orders: %v (%v)", a, a.err)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run after cancel = %v, want nil", err)
		}
		if !strings.Contains(out.String(), "listening on http://"+addr) {
			t.Errorf("output %q does not say where it listens", out.String())
		}
	})
}
