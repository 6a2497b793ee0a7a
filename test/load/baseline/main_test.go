package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	goredis "github.com/redis/go-redis/v9"
)

func post(h http.Handler, path, tok string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, nil)
	if tok != "" {
		req.Header.Set("Idempotency-Token", tok)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func TestRoutes(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	h := newRouter(rdb)

	w := post(h, "/v1/tokens", "")
	if w.Code != http.StatusCreated {
		t.Fatalf("issue = %d %s, want 201", w.Code, w.Body)
	}
	var got issued
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || len(got.Token) != 32 {
		t.Fatalf("issue body %s: want {\"token\": 32 hex digits}", w.Body)
	}
	if ttl := mr.TTL(keyPrefix + got.Token); ttl != tokenTTL {
		t.Fatalf("stored TTL = %v, want %v", ttl, tokenTTL)
	}

	tests := []struct {
		name, path, tok string
		want            int
	}{
		{"first redeem succeeds", "/v1/tokens/redeem", got.Token, http.StatusOK},
		{"second redeem is refused", "/v1/tokens/redeem", got.Token, http.StatusConflict},
		{"unknown token is refused", "/v1/tokens/redeem", "00", http.StatusConflict},
		{"missing header is a bad request", "/v1/tokens/redeem", "", http.StatusBadRequest},
		{"noop answers 204", "/noop", "", http.StatusNoContent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if w := post(h, tt.path, tt.tok); w.Code != tt.want {
				t.Fatalf("POST %s = %d %s, want %d", tt.path, w.Code, w.Body, tt.want)
			}
		})
	}
}

func TestStoreDownIs503(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: mr.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	h := newRouter(rdb)
	mr.Close()
	for _, path := range []string{"/v1/tokens", "/v1/tokens/redeem"} {
		if w := post(h, path, "ab"); w.Code != http.StatusServiceUnavailable {
			t.Errorf("POST %s with Redis down = %d, want 503", path, w.Code)
		}
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	mr := miniredis.RunT(t)
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, "127.0.0.1:0", mr.Addr(), func(a string) { addrs <- a }) }()
	var addr string
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	}
	resp, err := http.Post("http://"+addr+"/noop", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /noop = %d, want 204", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel = %v, want nil", err)
	}
}

func TestRedisOptions(t *testing.T) {
	tests := []struct {
		name, in, addr string
		db             int
		ok             bool
	}{
		{"URL with a database", "redis://127.0.0.1:6380/2", "127.0.0.1:6380", 2, true},
		{"bare host:port", "127.0.0.1:6381", "127.0.0.1:6381", 0, true},
		{"bare host without a port", "localhost", "", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := redisOptions(tt.in)
			if (err == nil) != tt.ok {
				t.Fatalf("redisOptions(%q) error = %v, want ok=%v", tt.in, err, tt.ok)
			}
			if tt.ok && (o.Addr != tt.addr || o.DB != tt.db) {
				t.Fatalf("redisOptions(%q) = %s db %d, want %s db %d", tt.in, o.Addr, o.DB, tt.addr, tt.db)
			}
		})
	}
}

// BenchmarkPair prices one issue plus one redeem through the router, in
// process, on the Redis at REPLAYGUARD_TEST_REDIS_URL (skipped when it is
// unset), for comparison with test/load's BenchmarkEnginePair.
func BenchmarkPair(b *testing.B) {
	url := os.Getenv("REPLAYGUARD_TEST_REDIS_URL")
	if url == "" {
		b.Skip("REPLAYGUARD_TEST_REDIS_URL is not set")
	}
	o, err := goredis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	rdb := goredis.NewClient(o)
	defer rdb.Close()
	h := newRouter(rdb)
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w := post(h, "/v1/tokens", "")
			var got issued
			if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &got) != nil {
				b.Errorf("issue: %d %s", w.Code, w.Body)
				return
			}
			if w := post(h, "/v1/tokens/redeem", got.Token); w.Code != http.StatusOK {
				b.Errorf("redeem: %d %s", w.Code, w.Body)
				return
			}
		}
	})
}

// BenchmarkRedeem prices one GETDEL redeem through the router, in process,
// on the Redis at REPLAYGUARD_TEST_REDIS_URL (skipped when it is unset),
// for comparison with test/load's BenchmarkEngineVerify. The tokens are
// all issued before the timer starts.
func BenchmarkRedeem(b *testing.B) {
	url := os.Getenv("REPLAYGUARD_TEST_REDIS_URL")
	if url == "" {
		b.Skip("REPLAYGUARD_TEST_REDIS_URL is not set")
	}
	o, err := goredis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	rdb := goredis.NewClient(o)
	defer rdb.Close()
	h := newRouter(rdb)
	toks := make([]string, b.N)
	for i := range toks {
		w := post(h, "/v1/tokens", "")
		var got issued
		if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &got) != nil {
			b.Fatalf("issue: %d %s", w.Code, w.Body)
		}
		toks[i] = got.Token
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if w := post(h, "/v1/tokens/redeem", toks[next.Add(1)-1]); w.Code != http.StatusOK {
				b.Errorf("redeem: %d %s", w.Code, w.Body)
				return
			}
		}
	})
}
