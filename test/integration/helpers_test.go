package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/internal/pgtest"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	postgresstore "github.com/replayguard/replayguard/store/postgres"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/store/storetest"
	"github.com/replayguard/replayguard/token"
)

// Environment variables that point the suite at real servers.
const (
	envRedisURL     = "REPLAYGUARD_TEST_REDIS_URL"           // redis://host:port/db
	envClusterAddrs = "REPLAYGUARD_TEST_REDIS_CLUSTER_ADDRS" // host:port,host:port,...
	envRedisServer  = "REPLAYGUARD_TEST_REDIS_SERVER"        // path to a redis-server binary
)

// apiKey is the API key of every test server configured with one.
const apiKey = "integration-test-api-key"

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	gin.DefaultWriter, gin.DefaultErrorWriter = io.Discard, io.Discard
	goredis.SetLogger(quietRedis{}) // expected dial errors while Redis is down
	goleak.VerifyTestMain(m)
}

// quietRedis discards go-redis's internal log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// required reports whether a missing server must fail the test instead of
// skipping it.
func required() bool { return testenv.Required() }

// requireEnv returns the value of the environment variable name, skipping
// (or, in CI, failing) the test when it is unset.
func requireEnv(t testing.TB, name string) string {
	t.Helper()
	return testenv.Var(t, name)
}

// uniquePrefix returns a Redis key prefix no other test run uses. Keys
// left behind expire with their tokens.
func uniquePrefix(t testing.TB) string {
	t.Helper()
	return "rgit:" + randomHex(t, 8) + ":"
}

func randomHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// newKeys returns a one-key ring with a fresh random secret under kid.
func newKeys(t testing.TB, kid string) []token.Key {
	t.Helper()
	secret := make([]byte, token.MinKeyLen)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	return []token.Key{{ID: kid, Secret: secret}}
}

// machineIDs hands every service in this process its own sonyflake
// machine ID, as every instance sharing a store must have.
var machineIDs atomic.Uint32

func nextMachineID() uint16 { return uint16(1000 + machineIDs.Add(1)) }

func newFakeClock() *storetest.Clock { return storetest.NewClock(time.Now()) }

// brokenStore fails every call, like a store whose backend is down. Its
// error names an address that must never reach a client.
type brokenStore struct{}

var _ store.Store = brokenStore{}

var errBroken = store.Unavailable("redis", errors.New("dial tcp 10.9.8.7:6379: connect: connection refused"))

func (brokenStore) Put(context.Context, string, store.Token, time.Duration) (bool, error) {
	return false, errBroken
}

func (brokenStore) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, errBroken
}

func (brokenStore) Acquire(context.Context, string, string, string, time.Duration) (store.Record, bool, error) {
	return store.Record{}, false, errBroken
}

func (brokenStore) Renew(context.Context, string, string, time.Duration) (bool, error) {
	return false, errBroken
}

func (brokenStore) Complete(context.Context, string, string, []byte, time.Duration) (bool, error) {
	return false, errBroken
}

func (brokenStore) Release(context.Context, string, string) (bool, error) {
	return false, errBroken
}

func (brokenStore) Lookup(context.Context, string) (store.Record, bool, error) {
	return store.Record{}, false, errBroken
}

func (brokenStore) Ping(context.Context) error { return errBroken }
func (brokenStore) Close() error               { return nil }

// serverConfig describes one Replayguard instance.
type serverConfig struct {
	// keys is the signing key ring; nil means a fresh one-key ring.
	keys []token.Key
	// machineID is the sonyflake machine ID; 0 means a fresh one.
	machineID uint16
	// tokenOpts and apiOpts are passed to token.New and handlers.New.
	tokenOpts []token.Option
	apiOpts   []handlers.Option
	// conns sizes the client's connection pool for that many concurrent
	// requests; 0 means a small pool.
	conns int
}

// server is one Replayguard instance behind a real HTTP listener, wired
// as cmd/server wires it: an instrumented store, a token.Service, and
// (*handlers.API).Engine with metrics.
type server struct {
	URL     string
	Client  *http.Client
	Tokens  *token.Service
	Metrics *metrics.Metrics
}

// startServer serves st over HTTP until the test ends. It takes ownership
// of st: the store is closed after the listener.
func startServer(t testing.TB, st store.Store, cfg serverConfig) *server {
	t.Helper()
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	keys := cfg.keys
	if keys == nil {
		keys = newKeys(t, "k1")
	}
	id := cfg.machineID
	if id == 0 {
		id = nextMachineID()
	}
	m := metrics.New()
	svc, err := token.New(m.Instrument(st), keys, append([]token.Option{token.WithMachineID(id)}, cfg.tokenOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	api := handlers.New(svc, append([]handlers.Option{handlers.WithMetrics(m), handlers.WithLogger(quiet)}, cfg.apiOpts...)...)
	engine, err := api.Engine()
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(engine)
	t.Cleanup(ts.Close)
	return &server{URL: ts.URL, Client: newClient(t, cfg.conns), Tokens: svc, Metrics: m}
}

// newClient returns an HTTP client whose pool keeps conns idle connections
// per host, so that conns concurrent requests reuse their connections
// instead of dialling anew.
func newClient(t testing.TB, conns int) *http.Client {
	conns = max(conns, 4)
	tr := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// openRedis returns a Redis store on the server at url under a fresh
// prefix, with a pool and timeout sized for concurrent tests.
func openRedis(t testing.TB, url, prefix string) *redisstore.Store {
	t.Helper()
	opt, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatalf("%s: %v", envRedisURL, err)
	}
	opt.ContextTimeoutEnabled = true
	opt.ReadTimeout, opt.WriteTimeout = -1, -1 // the store's timeout alone bounds a call, not go-redis's 3s
	opt.PoolSize = 64
	return redisstore.New(goredis.NewClient(opt), redisstore.WithPrefix(prefix), redisstore.WithTimeout(5*time.Second))
}

// openCluster is openRedis for a Redis Cluster given by its seed addresses.
func openCluster(t testing.TB, addrs, prefix string) *redisstore.Store {
	t.Helper()
	client := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs:                 strings.Split(addrs, ","),
		ContextTimeoutEnabled: true,
		ReadTimeout:           -1, // the store's timeout alone bounds a call, not go-redis's 3s
		WriteTimeout:          -1,
		PoolSize:              64,
	})
	return redisstore.New(client, redisstore.WithPrefix(prefix), redisstore.WithTimeout(5*time.Second))
}

// openPostgres returns a store on a schema of its own on the test
// database (REPLAYGUARD_TEST_POSTGRES_URL; pgtest skips or fails without
// it), migrated, with as many connections as openRedis and its timeout.
// The schema is dropped, and the pool closed, after the store.
func openPostgres(t testing.TB) *postgresstore.Store {
	t.Helper()
	schema := pgtest.NewSchema(t)
	pool := pgtest.Pool(t, schema, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := postgresstore.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return postgresstore.New(pool, postgresstore.WithTimeout(5*time.Second))
}

// reply is a response read in full.
type reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// send performs req and reads the whole response. It never fails the
// test, so goroutines may call it.
func send(c *http.Client, req *http.Request) (reply, error) {
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

// request builds a request to s; header holds name, value pairs.
func (s *server) request(t testing.TB, method, path string, body io.Reader, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if len(header)%2 != 0 {
		t.Fatalf("odd header list %q", header)
	}
	for i := 0; i < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// do sends method path with a string body ("" for none) and header pairs.
func (s *server) do(t testing.TB, method, path, body string, header ...string) reply {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	rep, err := send(s.Client, s.request(t, method, path, r, header...))
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return rep
}

// issued is the body of 201 Created from POST /v1/tokens.
type issued struct {
	Token     string `json:"token"`
	ID        string `json:"id"`
	Purpose   string `json:"purpose"`
	ExpiresAt string `json:"expires_at"`
	ExpiresIn int64  `json:"expires_in"`
}

// redeemed is the body of 200 OK from POST /v1/tokens/redeem.
type redeemed struct {
	Status  string `json:"status"`
	ID      string `json:"id"`
	Purpose string `json:"purpose"`
	Subject string `json:"subject"`
}

// issue asks s for a token with body and header pairs and requires 201.
func (s *server) issue(t testing.TB, body string, header ...string) issued {
	t.Helper()
	r := s.do(t, http.MethodPost, "/v1/tokens", body, header...)
	if r.Status != http.StatusCreated {
		t.Fatalf("issue %s: status %d, want 201: %s", body, r.Status, r.Body)
	}
	var is issued
	decode(t, r, &is)
	if is.Token == "" || is.ID == "" {
		t.Fatalf("issue %s: no token or id: %s", body, r.Body)
	}
	return is
}

// redeem presents tok in the Idempotency-Token header with an optional
// JSON body and header pairs.
func (s *server) redeem(t testing.TB, tok, body string, header ...string) reply {
	t.Helper()
	return s.do(t, http.MethodPost, "/v1/tokens/redeem", body, append([]string{token.Header, tok}, header...)...)
}

// wantRedeemed requires r to be 200 OK redeeming the token with id.
func wantRedeemed(t testing.TB, r reply, id, purpose, subject string) {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("redeem: status %d, want 200: %s", r.Status, r.Body)
	}
	wantMediaType(t, r, "application/json")
	if got := r.Header.Get("Cache-Control"); got != "no-store" {
		t.Errorf("Cache-Control = %q, want no-store", got)
	}
	var got redeemed
	decode(t, r, &got)
	want := redeemed{Status: "redeemed", ID: id, Purpose: purpose, Subject: subject}
	if got != want {
		t.Errorf("redeem body = %+v, want %+v", got, want)
	}
}

func decode(t testing.TB, r reply, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decoding %s: %v", r.Body, err)
	}
}

func wantMediaType(t testing.TB, r reply, want string) {
	t.Helper()
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != want {
		t.Errorf("Content-Type = %q, want %s", r.Header.Get("Content-Type"), want)
	}
}

// wantProblem requires r to be an RFC 9457 problem with status and code:
// application/problem+json carrying type, title, status, code and an
// optional string detail, all consistent with the HTTP status.
func wantProblem(t testing.TB, r reply, status int, code string) {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d (%s): %s", r.Status, status, code, r.Body)
	}
	wantMediaType(t, r, "application/problem+json")
	var p map[string]any
	decode(t, r, &p)
	str := func(name string) string {
		v, ok := p[name].(string)
		if !ok {
			t.Errorf("problem member %q = %#v, want a string: %s", name, p[name], r.Body)
		}
		return v
	}
	if got := str("code"); got != code {
		t.Errorf("code = %q, want %q: %s", got, code, r.Body)
	}
	if got := str("type"); got != problem.TypePrefix+code {
		t.Errorf("type = %q, want %q", got, problem.TypePrefix+code)
	}
	if str("title") == "" {
		t.Errorf("title is empty: %s", r.Body)
	}
	if got, ok := p["status"].(float64); !ok || int(got) != status {
		t.Errorf("status member = %#v, want %d", p["status"], status)
	}
	if d, ok := p["detail"]; ok {
		if _, ok := d.(string); !ok {
			t.Errorf("detail = %#v, want a string", d)
		}
	}
	if id, ok := p["request_id"]; ok && id != r.Header.Get(problem.RequestIDHeader) {
		t.Errorf("request_id = %#v, want the X-Request-ID header %q", id, r.Header.Get(problem.RequestIDHeader))
	}
}

// problemCode returns the code of a problem body, or "".
func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}
