package gateway_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/replayguard/replayguard/gateway"
)

// benchRoutes are test/load/gateway-routes.yaml's routes and a subtree,
// so that the mux holds a few patterns of each kind.
const benchRoutes = `routes:
  - {match: "POST /orders", policy: idempotency_key, required: true}
  - {match: "POST /submit", policy: fingerprint}
  - {match: "PUT /orders/{id}", policy: idempotency_key, required: true}
  - {match: "/admin/", policy: idempotency_key, required: true}
`

// okTransport answers every request 200 without a network, so that the
// benchmark prices the gateway alone.
type okTransport struct{}

func (okTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_ = r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r, ProtoMajor: 1, ProtoMinor: 1}, nil
}

// BenchmarkServeHTTP prices one request through ServeHTTP, routing
// included, to an app that answers at once: passed through (paths of
// several shapes) or refused by its route's policy (a keyless POST
// /orders, before any store call). Compare builds with:
//
//	go test -run '^$' -bench ServeHTTP -benchmem -count 10 ./gateway/
func BenchmarkServeHTTP(b *testing.B) {
	routes, err := gateway.ParseRoutes([]byte(benchRoutes))
	if err != nil {
		b.Fatal(err)
	}
	d := newDeps(b)
	gw, err := gateway.New(&url.URL{Scheme: "http", Host: "app.test"}, routes, quiet,
		gateway.WithKeeper(d.keeper), gateway.WithTransport(okTransport{}))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, target string
		status               int
	}{
		{"passthrough", "POST", "/plain", 200},
		{"passthrough with a file suffix", "GET", "/static/app.min.js", 200},
		{"passthrough with capitals", "GET", "/Reports/2026/Summary", 200},
		{"passthrough not ASCII", "GET", "/caf%C3%A9/men%C3%BC", 200},
		{"routed, refused by its policy", "POST", "/orders", 400},
	} {
		b.Run(strings.ReplaceAll(tc.name, " ", "_"), func(b *testing.B) {
			req := httptest.NewRequest(tc.method, tc.target, nil)
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				w := httptest.NewRecorder()
				gw.ServeHTTP(w, req)
				if w.Code != tc.status {
					b.Fatalf("= %d %s, want %d", w.Code, w.Body, tc.status)
				}
				_, _ = io.Copy(io.Discard, w.Body)
			}
		})
	}
}

// BenchmarkMatch prices finding a request's route alone (ServeHTTP's
// routing, without the proxy or a policy), for paths of several shapes.
func BenchmarkMatch(b *testing.B) {
	routes, err := gateway.ParseRoutes([]byte(benchRoutes))
	if err != nil {
		b.Fatal(err)
	}
	d := newDeps(b)
	gw, err := gateway.New(&url.URL{Scheme: "http", Host: "app.test"}, routes, quiet, gateway.WithKeeper(d.keeper))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, method, target string }{
		{"routed", "POST", "/orders"},
		{"routed with a wildcard", "PUT", "/orders/42"},
		{"unrouted", "POST", "/plain"},
		{"unrouted with a file suffix", "GET", "/static/app.min.js"},
		{"unrouted with capitals", "GET", "/Reports/2026/Summary"},
		{"unrouted not ASCII", "GET", "/caf%C3%A9/men%C3%BC"},
		{"a spelling of a route", "POST", "/Orders.json"},
	} {
		b.Run(strings.ReplaceAll(tc.name, " ", "_"), func(b *testing.B) {
			req := httptest.NewRequest(tc.method, tc.target, nil)
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				gateway.Match(gw, req)
			}
		})
	}
}

// reportCPU starts counting the process's CPU time (user and system);
// the function it returns reports it per iteration as cpu-ns/op, which a
// busy machine sways less than ns/op (as in test/load).
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		b.ReportMetric(float64((cpuTime()-start).Nanoseconds())/float64(b.N), "cpu-ns/op")
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
