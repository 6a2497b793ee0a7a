package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/store/storetest"
)

// Environment variables naming the real servers the tests run against.
const (
	envURL     = "REPLAYGUARD_TEST_REDIS_URL"           // redis://host:port/db
	envCluster = "REPLAYGUARD_TEST_REDIS_CLUSTER_ADDRS" // host:port,host:port,...
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server returns the value of the environment variable name. When it is
// unset the test is skipped, or fails when REPLAYGUARD_TEST_REQUIRE=1 or
// CI=true: CI must run against real servers.
func server(t testing.TB, name string) string {
	t.Helper()
	return testenv.Var(t, name)
}

// uniquePrefix returns a key prefix no other test run uses, so that runs
// sharing a server never see each other's keys. Keys left behind expire
// within an hour.
func uniquePrefix(t testing.TB) string {
	t.Helper()
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "rgtest:" + hex.EncodeToString(b) + ":"
}

func newClock() *storetest.Clock { return storetest.NewClock(time.Unix(1_700_000_000, 0)) }

// pttl reads the remaining lifetime of the Redis key that key(name) names
// with PTTL, for storetest: pass s.TokenKey for tokens, s.RecordKey for
// idempotency records.
func pttl(t *testing.T, c goredis.Cmdable, key func(string) string) func(name string) (time.Duration, bool) {
	return func(name string) (time.Duration, bool) {
		t.Helper()
		d, err := c.PTTL(context.Background(), key(name)).Result()
		if err != nil {
			t.Fatalf("PTTL %s: %v", key(name), err)
		}
		switch d {
		case -2: // no such key
			return 0, false
		case -1: // no expiry: longer than any lifetime a test expects
			return math.MaxInt64, true
		}
		return d, true
	}
}

// newMiniredis returns a store on a fresh miniredis whose clock the
// instance controls. miniredis keeps TTLs relative: Advance moves its clock
// (for TIME) and fast-forwards the TTLs it holds.
func newMiniredis(t *testing.T, opts ...redis.Option) (*redis.Store, *miniredis.Miniredis, storetest.Instance) {
	t.Helper()
	mr := miniredis.RunT(t)
	c := newClock()
	mr.SetTime(c.Now())
	client := goredis.NewClient(&goredis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true,
		ReadTimeout: contextOnly, WriteTimeout: contextOnly})
	s := redis.New(client, opts...)
	advance := func(d time.Duration) {
		c.Advance(d)
		mr.SetTime(c.Now())
		mr.FastForward(d)
	}
	return s, mr, storetest.Instance{
		Store: s, Limiter: s, Now: c.Now, Advance: advance,
		TTL: pttl(t, client, s.TokenKey), RecordTTL: pttl(t, client, s.RecordKey),
	}
}

// contextOnly, as a go-redis client's ReadTimeout and WriteTimeout, sets
// no timeout of the client's own: the store's deadline alone bounds a
// call. With the default (3s), a call the suites give loadedTimeout would
// time out after 3s all the same on a loaded machine.
const contextOnly = -1

// loadedTimeout is the store timeout of the suites on real servers: the
// concurrency cases queue a thousand calls on a 20-connection pool, under
// -race, beside every other package's tests. The timeout mechanism itself
// is tested with short timeouts in TestUnreachableRedis.
const loadedTimeout = 5 * time.Second

// realInstance wraps a store on a real server. The server's clock is the
// real one: Now is time.Now and Advance sleeps. opts come after the
// prefix and timeout.
func realInstance(t *testing.T, client goredis.UniversalClient, opts ...redis.Option) (*redis.Store, storetest.Instance) {
	s := redis.New(client, append([]redis.Option{redis.WithPrefix(uniquePrefix(t)), redis.WithTimeout(loadedTimeout)}, opts...)...)
	return s, storetest.Instance{
		Store: s, Limiter: s, Now: time.Now, Advance: time.Sleep,
		TTL: pttl(t, client, s.TokenKey), RecordTTL: pttl(t, client, s.RecordKey),
	}
}

func newRedisClient(t testing.TB) *goredis.Client {
	t.Helper()
	opt, err := goredis.ParseURL(server(t, envURL))
	if err != nil {
		t.Fatalf("%s: %v", envURL, err)
	}
	opt.ContextTimeoutEnabled = true
	opt.ReadTimeout, opt.WriteTimeout = contextOnly, contextOnly
	return goredis.NewClient(opt)
}

func newClusterClient(t testing.TB) *goredis.ClusterClient {
	t.Helper()
	addrs := strings.Split(server(t, envCluster), ",")
	return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
		ReadTimeout: contextOnly, WriteTimeout: contextOnly})
}

func TestConformanceMiniredis(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Instance {
		// miniredis serialises every command and builds a Lua VM per script:
		// the suite's 1,000 concurrent redemptions take about a second under
		// -race on two idle CPUs, and several times that on loaded ones, so
		// the default 500ms timeout is raised here.
		_, _, in := newMiniredis(t, redis.WithTimeout(30*time.Second))
		return in
	})
}

func TestConformanceRedis(t *testing.T) {
	server(t, envURL)
	storetest.Run(t, func(t *testing.T) storetest.Instance {
		_, in := realInstance(t, newRedisClient(t))
		return in
	})
}

func TestConformanceCluster(t *testing.T) {
	server(t, envCluster)
	storetest.Run(t, func(t *testing.T) storetest.Instance {
		_, in := realInstance(t, newClusterClient(t))
		return in
	})
}

// TestClusterHashTags checks, with the cluster's own CLUSTER KEYSLOT, that
// every key kept for one token ID shares a slot (so one script may touch
// them all) while different IDs still spread over the cluster.
func TestClusterHashTags(t *testing.T) {
	client := newClusterClient(t)
	prefix := uniquePrefix(t)
	s := redis.New(client, redis.WithPrefix(prefix))
	defer s.Close()
	ctx := context.Background()
	slot := func(key string) int64 {
		t.Helper()
		n, err := client.ClusterKeySlot(ctx, key).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
		}
		return n
	}
	for _, id := range []string{"1", storetest.ID(), "with{braces}inside", "ünïcødé", "a:b/c"} {
		t.Run(id, func(t *testing.T) {
			tk := s.TokenKey(id)
			for _, rk := range []string{s.RecordKey(id), s.RecordKey(store.TokenRecordKey(id))} {
				if a, b := slot(tk), slot(rk); a != b {
					t.Fatalf("slot(%q) = %d, slot(%q) = %d; want one slot", tk, a, rk, b)
				}
			}
		})
	}
	slots := map[int64]bool{}
	for range 20 {
		slots[slot(s.TokenKey(storetest.ID()))] = true
	}
	if len(slots) < 2 {
		t.Fatalf("20 token IDs all hash to one slot: the prefix must not pin keys to a slot")
	}
}

// TestKeys pins the key layout and value encoding the docs describe, which
// operators rely on for ACL patterns and debugging.
func TestKeys(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		opts   []redis.Option
		prefix string
	}{
		{"default prefix", nil, "rg:"},
		{"empty prefix keeps the default", []redis.Option{redis.WithPrefix("")}, "rg:"},
		{"custom prefix", []redis.Option{redis.WithPrefix("app:")}, "app:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, mr, _ := newMiniredis(t, tc.opts...)
			defer s.Close()
			if got, want := s.TokenKey("42"), tc.prefix+"t:{42}"; got != want {
				t.Fatalf("TokenKey = %q, want %q", got, want)
			}
			tok := store.Token{Purpose: "checkout", Subject: "a\nb"}
			if _, err := s.Put(ctx, "42", tok, time.Minute); err != nil {
				t.Fatal(err)
			}
			if got, err := mr.Get(tc.prefix + "t:{42}"); err != nil || got != "checkout\na\nb" {
				t.Fatalf("stored value = %q, %v; want %q", got, err, "checkout\na\nb")
			}
			if _, _, err := s.Allow(ctx, "ip:1.2.3.4", store.Limit{Rate: 1, Burst: 1, Period: time.Minute}); err != nil {
				t.Fatal(err)
			}
			if key := "rate:" + tc.prefix + "ip:1.2.3.4"; !mr.Exists(key) {
				t.Fatalf("limiter key %q missing; keys: %q", key, mr.Keys())
			}
		})
	}
}

// TestRecordLayout pins the record key and hash fields the docs describe:
// s, f, o, r and t, expiring with the lease and then with the retention.
func TestRecordLayout(t *testing.T) {
	s, mr, _ := newMiniredis(t, redis.WithPrefix("app:"))
	defer s.Close()
	ctx := context.Background()
	key := "42"
	if got, want := s.RecordKey(key), "app:r:{42}"; got != want {
		t.Fatalf("RecordKey = %q, want %q", got, want)
	}
	field := func(name string) string {
		t.Helper()
		return mr.HGet("app:r:{42}", name)
	}
	if _, ok, err := s.Acquire(ctx, key, "fp", "owner", time.Minute); err != nil || !ok {
		t.Fatalf("acquire = %v, %v", ok, err)
	}
	if st, fp, owner := field("s"), field("f"), field("o"); st != "p" || fp != "fp" || owner != "owner" {
		t.Fatalf("processing record: s=%q f=%q o=%q; want p, fp, owner", st, fp, owner)
	}
	if fields, err := mr.HKeys("app:r:{42}"); err != nil || len(fields) != 4 {
		t.Fatalf("processing record fields = %q, %v; want f, o, s, t", fields, err)
	}
	// t: when the record was opened, in microseconds on the server's clock.
	opened := strconv.FormatInt(newClock().Now().UnixMicro(), 10)
	if got := field("t"); got != opened {
		t.Fatalf("processing record: t=%q; want the server's TIME in microseconds, %s", got, opened)
	}
	mr.SetTime(newClock().Now().Add(time.Second)) // t is not rewritten
	if ok, err := s.Renew(ctx, key, "owner", time.Minute); err != nil || !ok {
		t.Fatalf("renew = %v, %v", ok, err)
	}
	if ttl := mr.TTL("app:r:{42}"); ttl != time.Minute {
		t.Fatalf("processing record TTL = %v, want the lease (1m)", ttl)
	}
	resp := "a\x00b"
	if ok, err := s.Complete(ctx, key, "owner", []byte(resp), time.Hour); err != nil || !ok {
		t.Fatalf("complete = %v, %v", ok, err)
	}
	if st, r, tm := field("s"), field("r"), field("t"); st != "c" || r != resp || tm != opened {
		t.Fatalf("completed record: s=%q r=%q t=%q; want c, %q, %s", st, r, tm, resp, opened)
	}
	if ttl := mr.TTL("app:r:{42}"); ttl != time.Hour {
		t.Fatalf("completed record TTL = %v, want the retention (1h)", ttl)
	}
}

// TestTokenRecordLayout pins a token's record key, beside the token and
// apart from the record under the same name, and that completing it
// deletes the token key.
func TestTokenRecordLayout(t *testing.T) {
	s, mr, _ := newMiniredis(t, redis.WithPrefix("app:"))
	defer s.Close()
	ctx := context.Background()
	if got, want := s.RecordKey(store.TokenRecordKey("42")), "app:r:{42}t"; got != want {
		t.Fatalf("RecordKey(TokenRecordKey) = %q, want %q", got, want)
	}
	tok := store.Token{Purpose: "checkout", Subject: "alice"}
	if _, err := s.Put(ctx, "42", tok, time.Hour); err != nil {
		t.Fatal(err)
	}
	if res, _, err := s.Redeem(ctx, "42", tok, "owner", time.Minute); err != nil || res != store.Redeemed {
		t.Fatalf("redeem record = %v, %v", res, err)
	}
	if st, fp, owner := mr.HGet("app:r:{42}t", "s"), mr.HGet("app:r:{42}t", "f"), mr.HGet("app:r:{42}t", "o"); st != "p" || fp != "checkout\nalice" || owner != "owner" {
		t.Fatalf("processing token record: s=%q f=%q o=%q", st, fp, owner)
	}
	if got, want := mr.HGet("app:r:{42}t", "t"), strconv.FormatInt(newClock().Now().UnixMicro(), 10); got != want {
		t.Fatalf("processing token record: t=%q, want %s", got, want)
	}
	if ttl := mr.TTL("app:r:{42}t"); ttl != time.Minute {
		t.Fatalf("token record TTL = %v, want the lease (1m)", ttl)
	}
	if !mr.Exists("app:t:{42}") || mr.Exists("app:r:{42}") {
		t.Fatalf("keys = %q; want the token kept and no plain record", mr.Keys())
	}
	if ok, err := s.Complete(ctx, store.TokenRecordKey("42"), "owner", []byte("done"), 24*time.Hour); err != nil || !ok {
		t.Fatalf("complete = %v, %v", ok, err)
	}
	if mr.Exists("app:t:{42}") || mr.HGet("app:r:{42}t", "r") != "done" {
		t.Fatalf("after complete, keys = %q; want only the completed record", mr.Keys())
	}
}

// TestRecordScriptsCacheFlushed checks the EVAL fallback of every record
// script when the server has forgotten them.
func TestRecordScriptsCacheFlushed(t *testing.T) {
	s, mr, _ := newMiniredis(t)
	defer s.Close()
	ctx := context.Background()
	admin := goredis.NewClient(&goredis.Options{Addr: mr.Addr()})
	defer admin.Close()
	flush := func() {
		t.Helper()
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		key := storetest.ID()
		if _, ok, err := s.Acquire(ctx, key, "fp", "o", time.Minute); err != nil || !ok {
			t.Fatalf("round %d: acquire = %v, %v", i, ok, err)
		}
		flush()
		if ok, err := s.Renew(ctx, key, "o", time.Minute); err != nil || !ok {
			t.Fatalf("round %d: renew = %v, %v", i, ok, err)
		}
		flush()
		if ok, err := s.Complete(ctx, key, "o", []byte("done"), time.Minute); err != nil || !ok {
			t.Fatalf("round %d: complete = %v, %v", i, ok, err)
		}
		flush()
		key = storetest.ID()
		if _, ok, err := s.Acquire(ctx, key, "fp", "o", time.Minute); err != nil || !ok {
			t.Fatalf("round %d: second acquire = %v, %v", i, ok, err)
		}
		flush()
		if ok, err := s.Release(ctx, key, "o"); err != nil || !ok {
			t.Fatalf("round %d: release = %v, %v", i, ok, err)
		}
		flush()
		tok := store.Token{Purpose: "p"}
		if _, err := s.Put(ctx, key, tok, time.Minute); err != nil {
			t.Fatal(err)
		}
		flush()
		if res, _, err := s.Redeem(ctx, key, tok, "o", time.Minute); err != nil || res != store.Redeemed {
			t.Fatalf("round %d: redeem record = %v, %v", i, res, err)
		}
		flush()
		if _, found, err := s.Lookup(ctx, store.TokenRecordKey(key)); err != nil || !found {
			t.Fatalf("round %d: lookup = %v, %v", i, found, err)
		}
		flush()
	}
}

// TestLookupOfARecordOpenedByAnEarlierRelease: a record hash without t,
// as releases before Lookup left them, is found with a zero Created and
// its Expires, and Renew and Complete leave it without one.
func TestLookupOfARecordOpenedByAnEarlierRelease(t *testing.T) {
	s, mr, in := newMiniredis(t)
	defer s.Close()
	ctx := context.Background()
	rk := s.RecordKey("old")
	mr.HSet(rk, "s", "p", "f", "fp", "o", "owner")
	mr.SetTTL(rk, time.Minute)
	rec, found, err := s.Lookup(ctx, "old")
	if err != nil || !found || rec.Owner != "owner" || !rec.Created.IsZero() || !rec.Expires.Equal(in.Now().Add(time.Minute)) {
		t.Fatalf("Lookup = %+v, %v, %v; want the record, a zero Created and Expires %v", rec, found, err, in.Now().Add(time.Minute))
	}
	if ok, err := s.Renew(ctx, "old", "owner", time.Hour); err != nil || !ok {
		t.Fatalf("Renew = %v, %v", ok, err)
	}
	if ok, err := s.Complete(ctx, "old", "owner", []byte("done"), time.Hour); err != nil || !ok {
		t.Fatalf("Complete = %v, %v", ok, err)
	}
	rec, found, err = s.Lookup(ctx, "old")
	if err != nil || !found || !rec.Completed || !rec.Created.IsZero() || !rec.Expires.Equal(in.Now().Add(time.Hour)) {
		t.Fatalf("Lookup after Complete = %+v, %v, %v; want it completed, Created still zero", rec, found, err)
	}
}

// TestPurposeWithNewline checks that the purpose/subject encoding cannot be
// confused by a purpose containing the separator.
func TestPurposeWithNewline(t *testing.T) {
	s, _, _ := newMiniredis(t)
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Put(ctx, "bad", store.Token{Purpose: "a\nb"}, time.Minute); err == nil {
		t.Fatal("put with a newline in the purpose succeeded; want an error")
	}
	stored := store.Token{Purpose: "a", Subject: "b\nc"}
	if _, err := s.Put(ctx, "1", stored, time.Minute); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		id        string
		presented store.Token
		want      store.RedeemResult
	}{
		{"same encoded value", "1", store.Token{Purpose: "a\nb", Subject: "c"}, store.PurposeMismatch},
		{"prefix of the encoded value", "1", store.Token{Purpose: "a\nb"}, store.PurposeMismatch},
		{"absent token", "2", store.Token{Purpose: "a\nb", Subject: "c"}, store.Absent},
		{"the real token", "1", stored, store.Redeemed},
	}
	for _, tc := range tests {
		if tc.want == store.Redeemed {
			break // the redemption without an owner below takes it
		}
		if got, _, err := s.Redeem(ctx, tc.id, tc.presented, "o", time.Minute); err != nil || got != tc.want {
			t.Fatalf("%s: redeem record = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	for _, tc := range tests {
		if got, _, err := s.Redeem(ctx, tc.id, tc.presented, "", 0); err != nil || got != tc.want {
			t.Fatalf("%s: redeem = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestScriptCacheFlushed checks the EVAL fallback when the server has
// forgotten the script (restart, failover, SCRIPT FLUSH).
func TestScriptCacheFlushed(t *testing.T) {
	s, mr, _ := newMiniredis(t)
	defer s.Close()
	ctx := context.Background()
	admin := goredis.NewClient(&goredis.Options{Addr: mr.Addr()})
	defer admin.Close()
	tok := store.Token{Purpose: "p"}
	for i := range 2 {
		id := storetest.ID()
		if _, err := s.Put(ctx, id, tok, time.Minute); err != nil {
			t.Fatal(err)
		}
		if res, _, err := s.Redeem(ctx, id, tok, "", 0); err != nil || res != store.Redeemed {
			t.Fatalf("redeem %d = %v, %v", i, res, err)
		}
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestClosedStoreRefusesCalls(t *testing.T) {
	s, _, _ := newMiniredis(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := context.Background()
	for name, err := range calls(ctx, s) {
		if !errors.Is(err, store.ErrClosed) || !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s after Close: err = %v, want store.ErrClosed, which wraps store.ErrUnavailable", name, err)
		}
	}
}

// calls makes one of each store call and returns their errors by name.
func calls(ctx context.Context, s *redis.Store) map[string]error {
	errs := map[string]error{}
	_, errs["Put"] = s.Put(ctx, "x", store.Token{Purpose: "p"}, time.Minute)
	_, errs["Put nonce"] = s.Put(ctx, store.NonceKey("k", "x"), store.Token{}, time.Minute)
	_, _, errs["Redeem"] = s.Redeem(ctx, "x", store.Token{Purpose: "p"}, "", 0)
	_, _, errs["Redeem with a record"] = s.Redeem(ctx, "x", store.Token{Purpose: "p"}, "o", time.Minute)
	_, _, errs["Acquire"] = s.Acquire(ctx, "x", "fp", "o", time.Minute)
	_, errs["Renew"] = s.Renew(ctx, "x", "o", time.Minute)
	_, errs["Complete"] = s.Complete(ctx, "x", "o", []byte("done"), time.Minute)
	_, errs["Release"] = s.Release(ctx, "x", "o")
	_, _, errs["Lookup"] = s.Lookup(ctx, "x")
	errs["Ping"] = s.Ping(ctx)
	_, _, errs["Allow"] = s.Allow(ctx, "x", store.Limit{Rate: 1, Burst: 1, Period: time.Second})
	return errs
}

// TestUnreachableRedis checks that every call fails, rather than hanging or
// succeeding, when Redis cannot answer. The client's own timeouts are set
// far beyond the bound checked here, so only the store's timeout can end
// the calls in time.
func TestUnreachableRedis(t *testing.T) {
	tests := []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"stopped miniredis", func(t *testing.T) string {
			mr := miniredis.RunT(t)
			addr := mr.Addr()
			mr.Close()
			return addr
		}},
		{"server that accepts and never answers", silentServer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := goredis.NewClient(&goredis.Options{
				Addr:                  tc.addr(t),
				ContextTimeoutEnabled: true,
				DialTimeout:           time.Minute,
				ReadTimeout:           time.Minute,
				WriteTimeout:          time.Minute,
			})
			const timeout = 100 * time.Millisecond
			s := redis.New(client, redis.WithTimeout(timeout))
			defer s.Close()
			start := time.Now()
			errs := calls(context.Background(), s)
			for name, err := range errs {
				if !errors.Is(err, store.ErrUnavailable) {
					t.Errorf("%s against an unreachable Redis = %v; want an error wrapping store.ErrUnavailable", name, err)
				}
			}
			// Each call bounded by the store's timeout; the margin is for a
			// loaded machine, and still far below the client's minute.
			if d, limit := time.Since(start), time.Duration(len(errs))*timeout+loadedTimeout; d > limit {
				t.Errorf("calls took %v, more than %v; the store's timeout did not bound them", d, limit)
			}
		})
	}
}

// silentServer listens on a loopback port, accepts connections and never
// writes a byte. It stops when the test ends.
func silentServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// Example shows a store on a throwaway miniredis; in production the client
// points at Redis and sets ContextTimeoutEnabled.
func Example() {
	mr, err := miniredis.Run()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mr.Close()
	client := goredis.NewClient(&goredis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	s := redis.New(client, redis.WithPrefix("example:"), redis.WithTimeout(time.Second))
	defer s.Close() // closes client

	ctx := context.Background()
	tok := store.Token{Purpose: "checkout", Subject: "alice"}
	created, err := s.Put(ctx, "42", tok, time.Minute)
	fmt.Println(created, err)
	redeem := func(want store.Token) {
		res, _, err := s.Redeem(ctx, "42", want, "", 0)
		fmt.Println(res, err)
	}
	redeem(store.Token{Purpose: "login", Subject: "alice"})
	redeem(tok)
	redeem(tok)
	// Output:
	// true <nil>
	// purpose_mismatch <nil>
	// redeemed <nil>
	// absent <nil>
}

// putAll stores tok under every id with a few concurrent writers.
func putAll(b *testing.B, s *redis.Store, ids []string, tok store.Token) {
	b.Helper()
	exp := time.Hour
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(ids)); i = next.Add(1) - 1 {
				if _, err := s.Put(context.Background(), ids[i], tok, exp); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
}

func BenchmarkRedeem(b *testing.B) {
	s := redis.New(newRedisClient(b), redis.WithPrefix(uniquePrefix(b)))
	defer s.Close()
	tok := store.Token{Purpose: "default", Subject: "bench"}
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = storetest.ID()
	}
	putAll(b, s, ids, tok)
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := ids[next.Add(1)-1]
			if res, _, err := s.Redeem(context.Background(), id, tok, "", 0); err != nil || res != store.Redeemed {
				b.Errorf("redeem %s = %v, %v", id, res, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "redeems/s")
}

// BenchmarkAcquireComplete runs one first execution's store work per
// iteration, on distinct keys from parallel goroutines: Acquire, then
// Complete with a 1 KiB response. Two round trips, one script each.
func BenchmarkAcquireComplete(b *testing.B) {
	s := redis.New(newRedisClient(b), redis.WithPrefix(uniquePrefix(b)))
	defer s.Close()
	ctx := context.Background()
	resp := make([]byte, 1024)
	exp := time.Minute
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := storetest.ID()
			if _, ok, err := s.Acquire(ctx, key, "fingerprint", "owner", exp); err != nil || !ok {
				b.Errorf("acquire %s = %v, %v", key, ok, err)
				return
			}
			if ok, err := s.Complete(ctx, key, "owner", resp, exp); err != nil || !ok {
				b.Errorf("complete %s = %v, %v", key, ok, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "executions/s")
}

// BenchmarkAcquireReplay is a duplicate's store work: one Acquire that
// finds a completed record with a 1 KiB response, from parallel goroutines.
func BenchmarkAcquireReplay(b *testing.B) {
	s := redis.New(newRedisClient(b), redis.WithPrefix(uniquePrefix(b)))
	defer s.Close()
	ctx := context.Background()
	exp := time.Minute
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = storetest.ID()
		if _, ok, err := s.Acquire(ctx, keys[i], "fingerprint", "owner", exp); err != nil || !ok {
			b.Fatal(ok, err)
		}
		if ok, err := s.Complete(ctx, keys[i], "owner", make([]byte, 1024), exp); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := keys[next.Add(1)%int64(len(keys))]
			if rec, ok, err := s.Acquire(ctx, key, "fingerprint", "other", exp); err != nil || ok || !rec.Completed {
				b.Errorf("acquire %s = %v, %v, %v", key, rec.Completed, ok, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "replays/s")
}

func BenchmarkPut(b *testing.B) {
	s := redis.New(newRedisClient(b), redis.WithPrefix(uniquePrefix(b)))
	defer s.Close()
	tok := store.Token{Purpose: "default", Subject: "bench"}
	exp := time.Minute
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := storetest.ID()
			if created, err := s.Put(context.Background(), id, tok, exp); err != nil || !created {
				b.Errorf("put %s = %v, %v", id, created, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "puts/s")
}

// BenchmarkPipelining runs issue-and-redeem pairs (a Put, then a Redeem
// of the token it stored) from 1 and from 64 goroutines, with the
// commands of concurrent calls sent one by one (pipelines=0) or
// coalesced into pipelines (WithPipelining). At 1 goroutine it shows
// what coalescing costs a lone call; at 64, what it saves.
func BenchmarkPipelining(b *testing.B) {
	for _, conns := range []int{1, 64} {
		for _, n := range []int{0, 1, 2, 4} {
			b.Run(fmt.Sprintf("goroutines=%d/pipelines=%d", conns, n), func(b *testing.B) {
				s := redis.New(newRedisClient(b), redis.WithPrefix(uniquePrefix(b)), redis.WithPipelining(n))
				defer s.Close()
				benchPairs(b, s, conns, func() (context.Context, context.CancelFunc) { return context.Background(), func() {} })
			})
		}
	}
}

// BenchmarkRequestContext runs issue-and-redeem pairs as a server does:
// each pair under a context of its own, cancelable and carrying values,
// as net/http gives each request (BenchmarkPipelining's calls run under
// context.Background, which no child context registers with). From 1
// and 64 goroutines, with the default pipelining.
func BenchmarkRequestContext(b *testing.B) {
	type key int
	base := context.WithValue(context.Background(), key(0), "server")
	base = context.WithValue(base, key(1), "local address")
	for _, conns := range []int{1, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", conns), func(b *testing.B) {
			s := redis.New(newRedisClient(b), redis.WithPrefix(uniquePrefix(b)))
			defer s.Close()
			benchPairs(b, s, conns, func() (context.Context, context.CancelFunc) {
				return context.WithCancel(context.WithValue(base, key(2), "request"))
			})
		})
	}
}

// benchPairs runs b.N issue-and-redeem pairs on s from conns goroutines,
// each pair under a context from newCtx, and reports pairs/s.
func benchPairs(b *testing.B, s *redis.Store, conns int, newCtx func() (context.Context, context.CancelFunc)) {
	tok := store.Token{Purpose: "default", Subject: "bench"}
	pair := func() bool {
		ctx, cancel := newCtx()
		defer cancel()
		id := storetest.ID()
		if created, err := s.Put(ctx, id, tok, time.Minute); err != nil || !created {
			b.Errorf("put %s = %v, %v", id, created, err)
			return false
		}
		if res, _, err := s.Redeem(ctx, id, tok, "", 0); err != nil || res != store.Redeemed {
			b.Errorf("redeem %s = %v, %v", id, res, err)
			return false
		}
		return true
	}
	b.ResetTimer()
	if conns == 1 {
		for range b.N {
			if !pair() {
				return
			}
		}
	} else {
		b.SetParallelism(max(conns/runtime.GOMAXPROCS(0), 1))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() && pair() {
			}
		})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pairs/s")
}
