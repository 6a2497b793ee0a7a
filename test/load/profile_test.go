package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/internal/logjson"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/token"
)

// The benchmarks below drive Replayguard's request path in process,
// without the network, wired as cmd/server wires it, so that a CPU
// profile shows where a request's time goes:
//
//	go test -run XXX -bench Engine -cpuprofile cpu.out ./test/load/
//	go tool pprof -top -cum test/load/load.test cpu.out
//
// Each benchmark has three stacks, to price the layers:
//
//	engine        (*API).Engine: request IDs, a JSON log line per request
//	              written to a file, panic recovery, metrics
//	engine-nolog  the same with the log level above info, so the request
//	              line is dropped before it is formatted
//	bare          the handlers alone on gin.New(), without metrics
//
// Pairs run on the memory store, and on the Redis at
// REPLAYGUARD_TEST_REDIS_URL when it is set.

// benchKey is a fixed test signing key (32 zero bytes would do as well).
var benchKey = token.Key{ID: "load", Secret: []byte("0123456789abcdef0123456789abcdef")}

// newStack returns a handler for stack over st. Its signature verifier
// holds the keys of "load clientkeys", as the server run.sh starts does.
func newStack(tb testing.TB, stack string, st store.Store) http.Handler {
	tb.Helper()
	gin.SetMode(gin.ReleaseMode)
	var m *metrics.Metrics
	if stack != "bare" {
		m = metrics.New()
		st = m.Instrument(st)
	}
	svc, err := token.New(st, []token.Key{benchKey}, token.WithMachineID(1))
	if err != nil {
		tb.Fatal(err)
	}
	level := slog.LevelInfo
	if stack == "engine-nolog" {
		level = slog.LevelWarn
	}
	f, err := os.Create(tb.TempDir() + "/server.log")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	logs := logjson.NewWriter(f, 100*time.Millisecond) // batched, as the server's
	tb.Cleanup(func() { logs.Close() })
	log := slog.New(logjson.NewHandler(logs, level)) // the server's own handler
	file, err := clientKeysFile()
	if err != nil {
		tb.Fatal(err)
	}
	keys, err := replay.ParseKeys(file)
	if err != nil {
		tb.Fatal(err)
	}
	opts := []handlers.Option{handlers.WithMetrics(m), handlers.WithLogger(log), handlers.WithVerifier(replay.NewVerifier(keys, st))}
	if lim, ok := st.(store.Limiter); ok {
		opts = append(opts, handlers.WithIssueRate(lim, store.Limit{}))
	}
	api := handlers.New(svc, opts...)
	if stack == "bare" {
		e := gin.New()
		api.Register(e)
		return e
	}
	e, err := api.Engine()
	if err != nil {
		tb.Fatal(err)
	}
	return e
}

// serve sends one POST with no body through h and returns the status and
// body.
func serve(h http.Handler, path, tok string) (int, []byte) {
	req, _ := http.NewRequest(http.MethodPost, path, nil)
	req.RemoteAddr = "127.0.0.1:40000"
	if tok != "" {
		req.Header.Set("Idempotency-Token", tok)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Code, w.Body.Bytes()
}

// serveJSON sends one POST with a JSON body through h and returns the
// status and body.
func serveJSON(h http.Handler, path string, body []byte) (int, []byte) {
	req, _ := http.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	req.RemoteAddr = "127.0.0.1:40000"
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Code, w.Body.Bytes()
}

// benchStores returns the stores pairs run on.
func benchStores(b *testing.B) map[string]func() store.Store {
	stores := map[string]func() store.Store{
		"memory": func() store.Store { return memory.New() },
	}
	if url := os.Getenv("REPLAYGUARD_TEST_REDIS_URL"); url != "" {
		stores["redis"] = func() store.Store {
			o, err := goredis.ParseURL(url)
			if err != nil {
				b.Fatal(err)
			}
			o.ContextTimeoutEnabled = true
			return redisstore.New(goredis.NewClient(o), redisstore.WithPrefix("loadbench:"))
		}
	}
	return stores
}

var stacks = []string{"engine", "engine-nolog", "bare"}

// reportCPU starts counting the process's CPU time (user and system);
// the function it returns reports it per iteration as cpu-µs/op. In
// process, a pair's ns/op is bound by sonyflake's 25,600 IDs a second
// per machine ID (39µs an ID), not by its work: CPU per pair is what the
// load runs pay.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(b.N), "cpu-µs/op")
	}
}

// cpuTime is the CPU time this process has used so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEnginePair prices one issue plus one redeem.
func BenchmarkEnginePair(b *testing.B) {
	for name, open := range benchStores(b) {
		for _, stack := range stacks {
			b.Run(name+"/"+stack, func(b *testing.B) {
				st := open()
				defer st.Close()
				h := newStack(b, stack, st)
				b.ReportAllocs()
				b.SetParallelism(16)
				defer reportCPU(b)()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						code, body := serve(h, "/v1/tokens", "")
						if code != http.StatusCreated {
							b.Errorf("issue: %d %s", code, body)
							return
						}
						if code, body = serve(h, "/v1/tokens/redeem", tokenFrom(body, "token")); code != http.StatusOK {
							b.Errorf("redeem: %d %s", code, body)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkEngineVerify prices POST /v1/signatures/verify with a freshly
// signed request, nonce recorded, per algorithm, store and stack. The
// requests are all signed before the timer starts.
func BenchmarkEngineVerify(b *testing.B) {
	for name, open := range benchStores(b) {
		for _, alg := range []string{"hmac", "ed25519"} {
			for _, stack := range stacks {
				b.Run(name+"/"+alg+"/"+stack, func(b *testing.B) {
					signer, err := newSigner(alg, "")
					if err != nil {
						b.Fatal(err)
					}
					bodies, err := signedBodies(context.Background(), signer, "https://api.example.com/v1/orders?id=7", b.N)
					if err != nil {
						b.Fatal(err)
					}
					st := open()
					defer st.Close()
					h := newStack(b, stack, st)
					var next atomic.Int64
					b.ReportAllocs()
					b.SetParallelism(16)
					b.ResetTimer()
					defer reportCPU(b)()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							body := bodies[next.Add(1)-1]
							if code, answer := serveJSON(h, "/v1/signatures/verify", body); code != http.StatusOK || !bytes.Contains(answer, verifiedStatus) {
								b.Errorf("verify: %d %s", code, answer)
								return
							}
						}
					})
				})
			}
		}
	}
}

// BenchmarkEngineForged prices refusing one forged token (the store is
// never touched).
func BenchmarkEngineForged(b *testing.B) {
	forged, err := forgeTokens(benchKey.ID, 1024, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	for _, stack := range stacks {
		b.Run(stack, func(b *testing.B) {
			st := memory.New()
			defer st.Close()
			h := newStack(b, stack, st)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				code, body := serve(h, "/v1/tokens/redeem", forged[i%len(forged)])
				if code != http.StatusUnauthorized || !bytes.Contains(body, invalidCode) {
					b.Fatalf("forged: %d %s", code, body)
				}
				i++
			}
		})
	}
}

// TestStacksServePairs checks that every stack the benchmarks price
// answers a pair and a forged token as the contract says.
func TestStacksServePairs(t *testing.T) {
	forged, err := forgeTokens(benchKey.ID, 1, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, stack := range stacks {
		t.Run(stack, func(t *testing.T) {
			st := memory.New()
			defer st.Close()
			h := newStack(t, stack, st)
			code, body := serve(h, "/v1/tokens", "")
			if code != http.StatusCreated {
				t.Fatalf("issue = %d %s, want 201", code, body)
			}
			tok := tokenFrom(body, "token")
			if code, body := serve(h, "/v1/tokens/redeem", tok); code != http.StatusOK {
				t.Fatalf("redeem = %d %s, want 200", code, body)
			}
			if code, body := serve(h, "/v1/tokens/redeem", tok); code != http.StatusConflict {
				t.Fatalf("second redeem = %d %s, want 409", code, body)
			}
			if code, body := serve(h, "/v1/tokens/redeem", forged[0]); code != http.StatusUnauthorized || !bytes.Contains(body, invalidCode) {
				t.Fatalf("forged redeem = %d %s, want 401 token_invalid", code, body)
			}
		})
	}
}
