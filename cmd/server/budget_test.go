package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// TestOneCallerCannotFillTheMemoryStore: on the embedded store in gateway
// mode, one caller's keyed requests (3,100 once made token issuance
// answer 503 store_full for everyone, with /readyz still ready) are
// bounded by its quota and by the records' half of the store; other
// callers can still issue tokens and redeem them on token routes, big
// responses count by their bytes, and the metrics say when the records
// are full, while /readyz stays ready with a warning (the instance still
// serves tokens and replays).
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
		// Each caller's ten answers fit its address's bytes (auto: an
		// eighth of 2 MiB), so that many callers together fill the records.
		"REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS=1MiB",
		"REPLAYGUARD_TRUSTED_PROXIES=127.0.0.1", // each caller at its own address
	)
	callers := 0
	addr := map[string]string{}
	order := func(caller string, i int) result {
		if addr[caller] == "" {
			callers++
			addr[caller] = fmt.Sprintf("198.51.100.%d", callers)
		}
		return try(newReq(t, "POST", base+"/orders", `{"qty":1}`, "Content-Type", "application/json",
			"Authorization", "Bearer "+caller, "Idempotency-Key", fmt.Sprintf(`"%s-%d"`, caller, i),
			"X-Forwarded-For", addr[caller]))
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
			if r.header.Get("Idempotent-Replayed") == "" && metric(t, base, `replayguard_store_full{pool="records"}`) == "1" {
				full = true
				break
			}
		}
	}
	if !full {
		t.Fatal("the store never became full")
	}
	if r := try(newReq(t, "GET", base+"/readyz", "")); r.status != http.StatusOK || !strings.Contains(string(r.body), `"warnings":["records_full"]`) {
		t.Fatalf("readyz with the records full = %d %s, want 200 with the warning records_full", r.status, r.body)
	}
	if full := metric(t, base, `replayguard_store_full{pool="all"}`); full != "0" {
		t.Fatalf(`replayguard_store_full{pool="all"} with only the records full = %q, want 0`, full)
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

// TestOneAddressCannotFillTheRecords: the per-caller quota counts per
// credential, and nothing checks credentials, so one client at one
// address sending keyed requests each with an invented Authorization (the
// app answering 401, which is stored) once filled the records' half:
// every real user's keyed request got 503 store_full, and /readyz 503,
// taking every instance out of the load balancer. The per-address bound
// stops the flood at its address; the records are never full, real users
// are served, and /readyz fails only once tokens no longer fit.
func TestOneAddressCannotFillTheRecords(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(app.Close)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startGateway(t,
		"REPLAYGUARD_UPSTREAM="+app.URL,
		"REPLAYGUARD_ROUTES="+routes,
		"REPLAYGUARD_MEMORY_MAX_ENTRIES=2400", // records: 1,200; per caller 120, per address 150
		"REPLAYGUARD_TRUSTED_PROXIES=127.0.0.1",
		"REPLAYGUARD_ISSUE_RATE=0",
	)
	order := func(from, bearer, key string) result {
		return try(newReq(t, "POST", base+"/orders", `{"qty":1}`, "Content-Type", "application/json",
			"Authorization", "Bearer "+bearer, "Idempotency-Key", `"`+key+`"`, "X-Forwarded-For", from))
	}
	counts := map[int]int{}
	for i := range 1200 {
		r := order("203.0.113.66", fmt.Sprintf("fake%d", i), fmt.Sprintf("k%d", i))
		counts[r.status]++
		if r.status == http.StatusTooManyRequests && (r.code() != "rate_limited" || r.header.Get("Retry-After") == "") {
			t.Fatalf("flood request %d = %d %s, want 429 rate_limited with Retry-After", i, r.status, r.body)
		}
	}
	if counts[http.StatusUnauthorized] < 150 || counts[http.StatusUnauthorized] > 152 || counts[http.StatusTooManyRequests]+counts[http.StatusUnauthorized] != 1200 {
		t.Fatalf("the flood got %v, want about 150 answers from the app and 429 for the rest", counts)
	}
	if full := metric(t, base, `replayguard_store_full{pool="records"}`); full != "0" {
		t.Fatalf(`replayguard_store_full{pool="records"} after the flood = %q, want 0`, full)
	}
	if r := try(newReq(t, "GET", base+"/readyz", "")); r.status != http.StatusOK || strings.Contains(string(r.body), "warnings") {
		t.Fatalf("readyz after the flood = %d %s, want 200 without warnings", r.status, r.body)
	}
	// Real users elsewhere are served, and their answers replayed.
	for i := range 20 {
		from := fmt.Sprintf("198.51.100.%d", i+1)
		user := fmt.Sprintf("user%d", i)
		if r := order(from, user, "k"); r.status != http.StatusUnauthorized || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("user %d after the flood = %d %s, want the app's 401", i, r.status, r.body)
		}
		if r := order(from, user, "k"); r.status != http.StatusUnauthorized || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("user %d's retry = %d %s, want the stored 401", i, r.status, r.body)
		}
	}
	// When tokens no longer fit, the instance is not ready.
	for i := 0; ; i++ {
		r := try(newReq(t, "POST", base+"/v1/tokens", ""))
		if r.status == http.StatusServiceUnavailable && r.code() == "store_full" {
			break
		}
		if r.status != http.StatusCreated || i > 2400 {
			t.Fatalf("issue %d = %d %s, want 201 until the store is full", i, r.status, r.body)
		}
	}
	if r := try(newReq(t, "GET", base+"/readyz", "")); r.status != http.StatusServiceUnavailable || r.code() != "store_full" {
		t.Fatalf("readyz with tokens refused = %d %s, want 503 store_full", r.status, r.body)
	}
	if full := metric(t, base, `replayguard_store_full{pool="all"}`); full != "1" {
		t.Fatalf(`replayguard_store_full{pool="all"} with tokens refused = %q, want 1`, full)
	}
}

// TestFingerprintFloodIsBoundedByTheAddressQuota: keyless requests to a
// fingerprint route open records too, and once did not count: 300
// distinct bodies from one address got 300 answers past an address bound
// of 125, and enough of them filled the records' half, so that a caller
// at another address got 503 store_full for a fresh key on another
// route. They count as keyed records do.
func TestFingerprintFloodIsBoundedByTheAddressQuota(t *testing.T) {
	base := startFloodGateway(t, 0, "REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS=125")
	counts := map[int]int{}
	for i := range 300 {
		r := comment(t, base, "203.0.113.66", i)
		counts[r.status]++
		if r.status == http.StatusTooManyRequests && (r.code() != "rate_limited" || r.header.Get("Retry-After") == "") {
			t.Fatalf("flood request %d = %d %s, want 429 rate_limited with Retry-After", i, r.status, r.body)
		}
		if r.status == http.StatusCreated && counts[http.StatusTooManyRequests] > 0 {
			t.Fatalf("flood request %d = 201 after a 429", i)
		}
	}
	if counts[http.StatusCreated] != 125 || counts[http.StatusTooManyRequests] != 175 {
		t.Fatalf("the flood got %v, want 125 answers from the app and 429 for the rest", counts)
	}
	// A double submit from the flooding address is still replayed, and
	// other addresses are not affected.
	if r := comment(t, base, "203.0.113.66", 0); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the first comment's double submit = %d %v %s, want its replay", r.status, r.header, r.body)
	}
	victimOrders(t, base, "198.51.100.7")
}

// TestFingerprintFloodCannotFillTheRecordsWithBytes: at the memory
// store's default sizes, the per-address bound on records (62,500 a day)
// does not bound bytes: 800 keyless requests from one address answered
// 100 KB each filled the 64 MiB of the records' half, and a caller at
// another address got 503 store_full for a fresh key on another route.
// The address's bytes are bounded too (8 MiB a day by default): the
// flood, offering more than the records' half, gets 429 once they are
// used up, the records are never full, and the other address is served.
func TestFingerprintFloodCannotFillTheRecordsWithBytes(t *testing.T) {
	const answer = 100 << 10
	base := startFloodGateway(t, answer) // the default store, sizes and bounds
	const maxRecordBytes, perAddress = memory.DefaultMaxBytes / 2, memory.DefaultMaxBytes / 2 / 8
	const offered = 800
	if offered*answer <= maxRecordBytes {
		t.Fatalf("the flood offers %d bytes, not more than the records' %d", offered*answer, maxRecordBytes)
	}
	counts := map[int]int{}
	for i := range offered {
		r := comment(t, base, "203.0.113.66", i)
		counts[r.status]++
		switch {
		case r.status == http.StatusTooManyRequests && (r.code() != "rate_limited" || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, "response bytes")):
			t.Fatalf("flood request %d = %d %s, want 429 rate_limited for the address's bytes, with Retry-After", i, r.status, r.body)
		case r.status == http.StatusCreated && counts[http.StatusTooManyRequests] > 0:
			t.Fatalf("flood request %d = 201 after a 429", i)
		case r.status != http.StatusCreated && r.status != http.StatusTooManyRequests:
			t.Fatalf("flood request %d = %d %s", i, r.status, r.body)
		}
	}
	t.Logf("the flood of %d got %v", offered, counts)
	// The answers that fit the address's bytes, and one more that was
	// sent but not stored.
	if max := perAddress/answer + 1; counts[http.StatusCreated] > max || counts[http.StatusCreated] < max-5 {
		t.Fatalf("the flood got %v, want about %d answers from the app and 429 for the rest", counts, max)
	}
	if full := metric(t, base, `replayguard_store_full{pool="records"}`); full != "0" {
		t.Fatalf(`replayguard_store_full{pool="records"} after the flood = %q, want 0`, full)
	}
	if b, err := strconv.ParseFloat(metric(t, base, `replayguard_store_bytes{pool="records"}`), 64); err != nil || b > perAddress+answer {
		t.Fatalf(`replayguard_store_bytes{pool="records"} after the flood = %v (%v), want at most the address's %d bytes and an answer`, b, err, perAddress)
	}
	victimOrders(t, base, "198.51.100.7")
	// A keyless request from another address on the flooded route is
	// answered and recorded too.
	if r := comment(t, base, "198.51.100.8", 0); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("another address's comment = %d %.200s, want 201 from the app", r.status, r.body)
	}
	if r := comment(t, base, "198.51.100.8", 0); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("its double submit = %d %.200s, want its replay", r.status, r.body)
	}
}

// startFloodGateway starts a gateway on the memory store with env, in
// front of an app that answers 201 with a body of answer bytes: POST
// /comments is a fingerprint route whose window (an hour) outlasts the
// test, so that no record expires during a flood; POST /orders needs an
// Idempotency-Key. Each client is at the address in its X-Forwarded-For.
func startFloodGateway(t *testing.T, answer int, env ...string) string {
	t.Helper()
	body := strings.Repeat("a", answer)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(app.Close)
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - {match: \"POST /comments\", policy: fingerprint, window: 1h}\n  - {match: \"POST /orders\", policy: idempotency_key, required: true}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startGateway(t, append([]string{
		"REPLAYGUARD_UPSTREAM=" + app.URL,
		"REPLAYGUARD_ROUTES=" + routes,
		"REPLAYGUARD_TRUSTED_PROXIES=127.0.0.1",
	}, env...)...)
}

// comment posts the i-th distinct keyless comment from the address from.
func comment(t *testing.T, base, from string, i int) result {
	t.Helper()
	return try(newReq(t, "POST", base+"/comments", fmt.Sprintf(`{"text":"comment %d"}`, i), "Content-Type", "application/json", "X-Forwarded-For", from))
}

// victimOrders checks that a caller at the address from, away from a
// flood, gets the app's answer for a fresh key on /orders, and its retry
// the stored answer.
func victimOrders(t *testing.T, base, from string) {
	t.Helper()
	order := func() result {
		return try(newReq(t, "POST", base+"/orders", `{"qty":1}`, "Content-Type", "application/json",
			"Authorization", "Bearer victim", "Idempotency-Key", `"fresh-key"`, "X-Forwarded-For", from))
	}
	if r := order(); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("a fresh key from %s after the flood = %d %.200s, want 201 from the app", from, r.status, r.body)
	}
	if r := order(); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("its retry = %d %.200s, want the stored answer", r.status, r.body)
	}
}

// TestRecordQuotasForTheStore: auto sizes the per-caller and per-address
// bounds from the memory store's records, the per-address one never below
// the per-caller one, and the per-address bytes from the memory store's
// bytes for records; a number is taken as it is; a store without a bound
// gets none unless set.
func TestRecordQuotasForTheStore(t *testing.T) {
	mem := memory.New(memory.WithMaxEntries(1_000_000)) // records: 500,000 and 64 MiB
	t.Cleanup(func() { _ = mem.Close() })
	var unbounded store.Store = struct{ store.Store }{mem} // no Usage
	tests := []struct {
		name                  string
		env                   map[string]string
		st                    store.Store
		perCaller, perAddress int
		bytesPerAddress       int64
	}{
		{"auto on the memory store", nil, mem, 50_000, 62_500, 8 << 20},
		{"auto never below the per-caller bound", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER": "100000"}, mem, 100_000, 100_000, 8 << 20},
		{"set", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER": "10", "REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS": "500", "REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS": "2MiB"}, mem, 10, 500, 2 << 20},
		{"off", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS": "0", "REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS": "0"}, mem, 50_000, 0, 0},
		{"auto on an unbounded store", nil, unbounded, 0, 0, 0},
		{"set on an unbounded store", map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS": "1000", "REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS": "1000"}, unbounded, 0, 1000, 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(nil, func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			if got, gotAddr, gotBytes := c.perCaller(tc.st), c.perAddress(tc.st), c.bytesPerAddress(tc.st); got != tc.perCaller || gotAddr != tc.perAddress || gotBytes != tc.bytesPerAddress {
				t.Fatalf("per caller %d, per address %d and %d bytes; want %d, %d and %d", got, gotAddr, gotBytes, tc.perCaller, tc.perAddress, tc.bytesPerAddress)
			}
		})
	}
}

// TestAddressBytesNeedTheMemoryStore: only the memory store counts bytes
// per address, so a size set on another store (Redis, PostgreSQL) stops
// the server at start rather than leave it without the bound it asked
// for; auto there is none.
func TestAddressBytesNeedTheMemoryStore(t *testing.T) {
	mem := memory.New()
	t.Cleanup(func() { _ = mem.Close() })
	other := struct { // a store and limiter that counts no bytes, as Redis's
		store.Store
		store.Limiter
	}{mem, mem}
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		name    string
		setting string
		st      store.Store
		want    int // options
		wantErr string
	}{
		{"auto on the memory store", "auto", mem, 3, ""},
		{"a size on the memory store", "1MiB", mem, 3, ""},
		{"auto on another store", "auto", other, 0, ""},
		{"a size on another store", "8MiB", other, 0, "REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS: only the memory store"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(nil, func(k string) string {
				return map[string]string{"REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS": tc.setting}[k]
			})
			if err != nil {
				t.Fatal(err)
			}
			opts, err := recordQuotas(c, tc.st, tc.st, log)
			if len(opts) != tc.want || (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("recordQuotas = %d options, %v; want %d, %q", len(opts), err, tc.want, tc.wantErr)
			}
		})
	}
}
