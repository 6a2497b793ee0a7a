package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/pgtest"
	"github.com/replayguard/replayguard/internal/testenv"
)

// TestPostgresStore runs the server on a private PostgreSQL: it migrates
// an empty database at start; while PostgreSQL is down, issue, redeem,
// complete and release answer 503 store_unavailable within
// REPLAYGUARD_STORE_TIMEOUT and as long again, and /readyz answers 503; a token refused
// with 503 stays redeemable once; within 15 s of PostgreSQL accepting
// connections again the service works without a restart; and tokens and
// records survive a restart of the server.
func TestPostgresStore(t *testing.T) {
	pg := testenv.StartPostgres(t)
	// The calls before and after the outage must succeed inside it on a
	// loaded machine; those during it fail as soon as the connection is
	// refused, so a long one costs no time.
	const storeTimeout = 3 * time.Second
	env := []string{"REPLAYGUARD_POSTGRES_URL=" + pg.URL(), "REPLAYGUARD_STORE_TIMEOUT=" + storeTimeout.String(),
		"REPLAYGUARD_SIGNING_KEYS=k1:" + strings.Repeat("QUJD", 11)}
	base, stop := startServer(t, env...)

	tok, id := issueToken(t, base, "checkout")
	pending, _ := issueToken(t, base, "checkout")
	recorded, _ := issueToken(t, base, "checkout")
	redeem := func(base, tok, extra string) result {
		return try(newReq(t, "POST", base+"/v1/tokens/redeem", `{"token":"`+tok+`","purpose":"checkout"`+extra+`}`))
	}
	if r := redeem(base, tok, ""); r.status != http.StatusOK {
		t.Fatalf("redeem = %d %s", r.status, r.body)
	}
	open := redeem(base, recorded, `,"record":true`)
	var lease struct{ Lease string }
	if err := json.Unmarshal([]byte(open.body), &lease); open.status != http.StatusOK || err != nil || lease.Lease == "" {
		t.Fatalf("redeem with a record = %d %s", open.status, open.body)
	}

	pg.Stop()
	bound := 2 * storeTimeout // the timeout, and as long again for a loaded machine
	for _, c := range []struct {
		name string
		req  *http.Request
	}{
		{"issue", newReq(t, "POST", base+"/v1/tokens", `{"purpose":"checkout"}`)},
		{"redeem", newReq(t, "POST", base+"/v1/tokens/redeem", `{"token":"`+pending+`","purpose":"checkout"}`)},
		{"complete", newReq(t, "POST", base+"/v1/tokens/complete", `{"token":"`+recorded+`","lease":"`+lease.Lease+`","response":{"status":201,"headers":{},"body":""}}`)},
		{"release", newReq(t, "POST", base+"/v1/tokens/release", `{"token":"`+recorded+`","lease":"`+lease.Lease+`"}`)},
		{"readyz", newReq(t, "GET", base+"/readyz", "")},
	} {
		start := time.Now()
		r := try(c.req)
		if took := time.Since(start); r.status != http.StatusServiceUnavailable || r.code() != "store_unavailable" || took > bound {
			t.Fatalf("%s while PostgreSQL is down = %d %s in %v; want 503 store_unavailable within %v", c.name, r.status, r.body, took, bound)
		}
	}

	pg.Start()
	deadline := time.Now().Add(15 * time.Second)
	for try(newReq(t, "GET", base+"/readyz", "")).status != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("the server did not recover within 15 s of PostgreSQL coming back")
		}
		time.Sleep(100 * time.Millisecond) // polling the server, as a load balancer would
	}
	// The token refused with 503 is redeemable, once.
	if r := redeem(base, pending, ""); r.status != http.StatusOK {
		t.Fatalf("the token refused during the outage = %d %s, want 200", r.status, r.body)
	}
	if r := redeem(base, pending, ""); r.status != http.StatusConflict {
		t.Fatalf("its second redemption = %d %s, want 409", r.status, r.body)
	}
	if r := try(newReq(t, "POST", base+"/v1/tokens/complete", `{"token":"`+recorded+`","lease":"`+lease.Lease+`","response":{"status":201,"headers":{"Location":"/orders/7"},"body":""}}`)); r.status != http.StatusNoContent {
		t.Fatalf("complete after the outage = %d %s", r.status, r.body)
	}

	// A restarted server finds its tokens and records.
	fresh, _ := issueToken(t, base, "checkout")
	stop()
	base, _ = startServer(t, env...)
	if r := redeem(base, fresh, ""); r.status != http.StatusOK {
		t.Fatalf("a token issued before the restart = %d %s", r.status, r.body)
	}
	if r := redeem(base, tok, ""); r.status != http.StatusConflict {
		t.Fatalf("a token redeemed before the restart = %d %s, want 409", r.status, r.body)
	}
	if r := redeem(base, recorded, ""); r.status != http.StatusOK || !strings.Contains(r.body, `"replayed"`) || !strings.Contains(r.body, "/orders/7") {
		t.Fatalf("a recorded token after the restart = %d %s, want its recorded response", r.status, r.body)
	}
	_ = id
}

// TestPostgresURLFile runs the server with the database's URL in the file
// REPLAYGUARD_POSTGRES_URL_FILE names, ending in the newline an editor
// leaves: the server migrates that database and keeps its tokens there.
func TestPostgresURLFile(t *testing.T) {
	schema := pgtest.NewSchema(t)
	file := filepath.Join(t.TempDir(), "postgres-url")
	if err := os.WriteFile(file, []byte(pgtest.SchemaURL(t, schema)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base, _ := startServer(t, "REPLAYGUARD_POSTGRES_URL_FILE="+file, "REPLAYGUARD_SIGNING_KEYS=k1:"+strings.Repeat("QUJD", 11))

	tok, _ := issueToken(t, base, "checkout")
	var n int
	if err := pgtest.Pool(t, schema, 1).QueryRow(context.Background(), `SELECT count(*) FROM replayguard_tokens`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("tokens in the file's database = %d (%v), want 1", n, err)
	}
	redeem := func() result {
		return try(newReq(t, "POST", base+"/v1/tokens/redeem", `{"token":"`+tok+`","purpose":"checkout"}`))
	}
	if r := redeem(); r.status != http.StatusOK {
		t.Fatalf("redeem = %d %s", r.status, r.body)
	}
	if r := redeem(); r.status != http.StatusConflict || r.code() != "token_used" {
		t.Fatalf("second redeem = %d %s, want 409 token_used", r.status, r.body)
	}
}
