package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGatewayMetrics runs the server in gateway mode and checks that
// GET /metrics counts the gateway's refusals, replays and pass-through
// requests under the route's pattern or a fixed label, never a path, and
// serves replayguard_build_info.
func TestGatewayMetrics(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer app.Close()
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startGateway(t, "REPLAYGUARD_UPSTREAM="+app.URL, "REPLAYGUARD_ROUTES="+routes)

	for i, step := range []struct {
		target, key, body string
		want              int
	}{
		{"/orders", "a", `{"n":1}`, 201},
		{"/orders", "a", `{"n":1}`, 201},
		{"/orders", "a", `{"n":2}`, 422},
		{"/orders", "", `{"n":1}`, 400},
		{"/shop/items/1", "", "", 201},
		{"/shop/items/2", "", "", 201},
	} {
		req := newReq(t, "POST", base+step.target, step.body, "Content-Type", "application/json")
		if step.key != "" {
			req.Header.Set("Idempotency-Key", fmt.Sprintf("%q", step.key))
		}
		if got := try(req); got.status != step.want {
			t.Fatalf("step %d: POST %s = %d, want %d: %s", i, step.target, got.status, step.want, got.body)
		}
	}
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for _, want := range []string{
		`replayguard_http_requests_total{method="POST",route="POST /orders",status_class="2xx"} 2`,
		`replayguard_http_requests_total{method="POST",route="POST /orders",status_class="4xx"} 2`,
		`replayguard_http_requests_total{method="POST",route="passthrough",status_class="2xx"} 2`,
		`replayguard_idempotency_outcomes_total{outcome="executed",policy="idempotency_key"} 1`,
		`replayguard_idempotency_outcomes_total{outcome="replayed",policy="idempotency_key"} 1`,
		`replayguard_idempotency_outcomes_total{outcome="fingerprint_mismatch",policy="idempotency_key"} 1`,
		`replayguard_build_info{goversion=`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("GET /metrics has no %s", want)
		}
	}
	if strings.Contains(text, "/shop/items") {
		t.Error("a raw path became a label value")
	}
}
