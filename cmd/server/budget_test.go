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

// TestOneCallerCannotFillTheMemoryStore: on the embedded store in gateway
// mode, one caller's keyed requests (3,100 once made token issuance
// answer 503 store_full for everyone, with /readyz still ready) are
// bounded by its quota and by the records' half of the store; other
// callers can still issue tokens, big responses count by their bytes, and
// /readyz and the metrics say when the store is full.
func TestOneCallerCannotFillTheMemoryStore(t *testing.T) {
	big := strings.Repeat("r", 64<<10)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, big)
	}))
	t.Cleanup(app.Close)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - match: \"POST /orders\"\n    policy: idempotency_key\n    required: true\n  - {match: \"POST /checkout\", policy: token, purpose: checkout}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startGateway(t,
		"REPLAYGUARD_UPSTREAM="+app.URL,
		"REPLAYGUARD_ROUTES="+routes,
		"REPLAYGUARD_MEMORY_MAX_ENTRIES=200",          // records: 100
		"REPLAYGUARD_MEMORY_MAX_BYTES=4MiB",           // records: 2 MiB, about thirty 64 KiB answers
		"REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER=auto", // a tenth of 100 records
	)
	order := func(caller string, i int) result {
		return try(newReq(t, "POST", base+"/orders", `{"qty":1}`, "Content-Type", "application/json",
			"Authorization", "Bearer "+caller, "Idempotency-Key", fmt.Sprintf(`"%s-%d"`, caller, i)))
	}

	// One caller is held to its quota: 10 records, then 429.
	for i := range 10 {
		if r := order("mallory", i); r.status != http.StatusCreated {
			t.Fatalf("mallory's order %d = %d %s", i, r.status, r.body)
		}
	}
	if r := order("mallory", 10); r.status != http.StatusTooManyRequests || r.code() != "rate_limited" {
		t.Fatalf("past the quota = %d %s, want 429 rate_limited", r.status, r.body)
	}
	// Many callers together fill the records' half, by bytes first.
	full := false
	for c := 0; c < 20 && !full; c++ {
		for i := range 10 {
			r := order(fmt.Sprintf("caller%d", c), i)
			if r.status != http.StatusCreated {
				t.Fatalf("caller%d's order %d = %d %s", c, i, r.status, r.body)
			}
			if r.header.Get("Idempotent-Replayed") == "" && metric(t, base, "replayguard_store_full") == "1" {
				full = true
				break
			}
		}
	}
	if !full {
		t.Fatal("the store never became full")
	}
	if r := try(newReq(t, "GET", base+"/readyz", "")); r.status != http.StatusServiceUnavailable || r.code() != "store_full" {
		t.Fatalf("readyz with the records full = %d %s, want 503 store_full", r.status, r.body)
	}
	if b := metric(t, base, `replayguard_store_bytes{pool="records"}`); b == "" {
		t.Fatal("no replayguard_store_bytes for records")
	}
	// Tokens still have their half.
	for i := range 50 {
		if r := try(newReq(t, "POST", base+"/v1/tokens", "")); r.status != http.StatusCreated {
			t.Fatalf("issue %d with the records full = %d %s", i, r.status, r.body)
		}
	}
	// And so do token routes' records, which count with the tokens: a
	// fresh token on a token route was once 503 store_full here.
	for i := range 3 {
		tok, _ := issueToken(t, base, "checkout")
		checkout := func() result {
			return try(newReq(t, "POST", base+"/checkout", `{"cart":1}`, "Content-Type", "application/json", "Idempotency-Token", tok))
		}
		if r := checkout(); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("checkout %d with the records full = %d %s, want 201 from the app", i, r.status, r.body)
		}
		if r := checkout(); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("checkout %d's double submit = %d %s, want its replay", i, r.status, r.body)
		}
	}
}

// metric returns the value of the series named exactly series on the
// server's /metrics, or "".
func metric(t *testing.T, base, series string) string {
	t.Helper()
	r := try(newReq(t, "GET", base+"/metrics", ""))
	for _, line := range strings.Split(string(r.body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}
