package gateway_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

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
