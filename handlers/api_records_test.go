package handlers_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/store/storetest"
	"github.com/replayguard/replayguard/token"
)

func init() { gin.SetMode(gin.TestMode) }

// quietLogs is the API's logger in tests: request lines are discarded.
var quietLogs = handlers.WithLogger(slog.New(slog.DiscardHandler))

// newFakeClock returns a clock that moves only when told to.
func newFakeClock() *storetest.Clock {
	return storetest.NewClock(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
}

// newRecordStore returns a memory store on the real clock, closed with
// the test.
func newRecordStore(t testing.TB) *memory.Store {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	return st
}

var machineIDs atomic.Uint32

// newTokenService returns a token service over st with its own machine ID,
// so that services sharing a store never issue the same ID.
func newTokenService(t testing.TB, st store.Store, opts ...token.Option) *token.Service {
	t.Helper()
	svc, err := token.New(st, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}},
		append([]token.Option{token.WithMachineID(uint16(100 + machineIDs.Add(1)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

const backendKey = "backend-secret"

// apiStores open a store whose clock the test moves with advance: the
// memory store's own clock, or miniredis's.
var apiStores = []struct {
	name string
	open func(t *testing.T) (st store.Store, now func() time.Time, advance func(time.Duration))
}{
	{"memory", func(t *testing.T) (store.Store, func() time.Time, func(time.Duration)) {
		clk := newFakeClock()
		st := memory.New(memory.WithClock(clk.Now))
		t.Cleanup(func() { _ = st.Close() })
		return st, clk.Now, clk.Advance
	}},
	{"miniredis", func(t *testing.T) (store.Store, func() time.Time, func(time.Duration)) {
		clk := newFakeClock()
		mr := miniredis.RunT(t)
		mr.SetTime(clk.Now())
		client := goredis.NewClient(&goredis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true, ReadTimeout: -1, WriteTimeout: -1})
		st := redisstore.New(client, redisstore.WithTimeout(10*time.Second)) // entries expire on miniredis's clock, moved by advance
		t.Cleanup(func() { _ = st.Close() })
		return st, clk.Now, func(d time.Duration) {
			clk.Advance(d)
			mr.SetTime(clk.Now())
			mr.FastForward(d)
		}
	}},
}

// apiEnv is a running server with the token API, records on.
type apiEnv struct {
	t       *testing.T
	srv     *httptest.Server
	svc     *token.Service
	m       *metrics.Metrics
	keeper  *idempotency.Keeper
	now     func() time.Time // the clock of svc and keeper
	advance func(time.Duration)
}

func newAPIEnv(t *testing.T, open func(t *testing.T) (store.Store, func() time.Time, func(time.Duration)), keeper []idempotency.Option, opts ...handlers.Option) apiEnv {
	t.Helper()
	st, now, advance := open(t)
	svc := newTokenService(t, st, token.WithClock(now))
	m := metrics.New()
	k := idempotency.New(st, append([]idempotency.Option{idempotency.WithClock(now)}, keeper...)...)
	a := handlers.New(svc, append([]handlers.Option{handlers.WithAPIKeys(backendKey), handlers.WithMetrics(m), handlers.WithRecords(k), quietLogs}, opts...)...)
	e, err := a.Engine()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return apiEnv{t: t, srv: srv, svc: svc, m: m, keeper: k, now: now, advance: advance}
}

// apiAnswer is a decoded answer of the API.
type apiAnswer struct {
	status     int
	header     http.Header
	raw        []byte
	code       string // problem code
	jsonStatus string // "status" of a 200 redeem answer
	response   *apiResponse
}

type apiResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// post sends body as JSON to path, with the backend's API key unless
// noAuth.
func (e apiEnv) post(path string, body any, noAuth bool) apiAnswer {
	e.t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		e.t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+path, bytes.NewReader(data))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if !noAuth {
		req.Header.Set("Authorization", "Bearer "+backendKey)
	}
	return e.do(req)
}

func (e apiEnv) do(req *http.Request) apiAnswer {
	e.t.Helper()
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	a := apiAnswer{status: resp.StatusCode, header: resp.Header, raw: raw}
	switch resp.Header.Get("Content-Type") {
	case "application/problem+json":
		var p problem.Problem
		if err := json.Unmarshal(raw, &p); err != nil {
			e.t.Fatalf("problem %s: %v", raw, err)
		}
		a.code = p.Code
	case "application/json; charset=utf-8":
		var v struct {
			Status   string       `json:"status"`
			Response *apiResponse `json:"response"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			e.t.Fatalf("answer %s: %v", raw, err)
		}
		a.jsonStatus, a.response = v.Status, v.Response
	}
	return a
}

func (e apiEnv) issue(purpose string, ttl time.Duration) token.Issued {
	e.t.Helper()
	is, err := e.svc.Issue(context.Background(), token.IssueRequest{Purpose: purpose, TTL: ttl})
	if err != nil {
		e.t.Fatal(err)
	}
	return is
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func TestAPITokenRecords(t *testing.T) {
	orderPage := map[string]any{
		"status":  303,
		"headers": map[string]string{"Location": "/orders/7", "x-multi": "a, b", "Set-Cookie": "session=first-callers-only", "Date": "Mon, 01 Jan 2001 00:00:00 GMT"},
		"body":    b64("see /orders/7\x00\xff"),
	}
	replayedOrderPage := &apiResponse{Status: 303, Headers: map[string]string{"Location": "/orders/7", "X-Multi": "a, b"}, Body: b64("see /orders/7\x00\xff")}
	// A step calls one endpoint with the token named tok: "a" and "b" are
	// live checkout tokens, "short" lives ten seconds, "login" is for
	// another purpose, "forged" is none of ours, "" sends no token.
	type step struct {
		name       string
		path       string // redeem, complete or release
		tok        string
		record     bool
		response   any // the "response" of complete; nil leaves it out
		noAuth     bool
		advance    time.Duration // before the call
		wantStatus int
		wantCode   string       // problem code
		wantJSON   string       // "status" of a 200 answer
		wantResp   *apiResponse // the replayed response
	}
	redeem := func(name, tok string, record bool, status int, code, json string) step {
		return step{name: name, path: "redeem", tok: tok, record: record, wantStatus: status, wantCode: code, wantJSON: json}
	}
	complete := func(name, tok string, response any, status int, code string) step {
		return step{name: name, path: "complete", tok: tok, response: response, wantStatus: status, wantCode: code}
	}
	release := func(name, tok string, status int, code string) step {
		return step{name: name, path: "release", tok: tok, wantStatus: status, wantCode: code}
	}
	replayed := func(name, tok string, record bool, resp *apiResponse) step {
		return step{name: name, path: "redeem", tok: tok, record: record, wantStatus: 200, wantJSON: "replayed", wantResp: resp}
	}
	tests := []struct {
		name   string
		keeper []idempotency.Option
		steps  []step
	}{
		{"record, complete, then every redeem gets the response", nil, []step{
			redeem("open the record", "a", true, 200, "", "redeemed"),
			redeem("a duplicate while processing", "a", true, 409, "request_in_progress", ""),
			redeem("a plain redeem while processing", "a", false, 409, "request_in_progress", ""),
			complete("complete", "a", orderPage, 204, ""),
			replayed("a duplicate gets the response", "a", true, replayedOrderPage),
			replayed("so does a plain redeem", "a", false, replayedOrderPage),
			complete("complete twice", "a", orderPage, 409, "record_not_processing"),
			release("release after completion", "a", 409, "record_not_processing"),
			replayed("the record is unchanged", "a", false, replayedOrderPage),
			redeem("another token is another execution", "b", true, 200, "", "redeemed"),
		}},
		{"release gives the token back for one retry (the backend's 5xx)", nil, []step{
			redeem("open the record", "a", true, 200, "", "redeemed"),
			release("release", "a", 204, ""),
			release("release twice", "a", 409, "record_not_processing"),
			redeem("the retry opens a new record", "a", true, 200, "", "redeemed"),
			redeem("and is in progress for duplicates", "a", false, 409, "request_in_progress", ""),
			complete("complete", "a", map[string]any{"status": 201, "headers": map[string]string{}, "body": ""}, 204, ""),
			replayed("then recorded", "a", true, &apiResponse{Status: 201, Headers: map[string]string{}, Body: ""}),
		}},
		{"a 4xx is recorded as any response", nil, []step{
			redeem("open", "a", true, 200, "", "redeemed"),
			complete("complete with 422", "a", map[string]any{"status": 422, "body": b64(`{"error":"sold out"}`)}, 204, ""),
			replayed("replayed", "a", false, &apiResponse{Status: 422, Headers: map[string]string{}, Body: b64(`{"error":"sold out"}`)}),
		}},
		{"a body over the cap is recorded without it", []idempotency.Option{idempotency.WithMaxBody(16)}, []step{
			redeem("open", "a", true, 200, "", "redeemed"),
			complete("complete with 40 bytes", "a", map[string]any{"status": 200, "body": b64(strings.Repeat("x", 40))}, 204, ""),
			redeem("a duplicate", "a", true, 409, "response_not_stored", ""),
			redeem("a plain redeem", "a", false, 409, "response_not_stored", ""),
		}},
		{"an invalid response is refused and the record stays processing", nil, []step{
			redeem("open", "a", true, 200, "", "redeemed"),
			complete("no response", "a", nil, 400, "invalid_request"),
			complete("status 99", "a", map[string]any{"status": 99}, 400, "invalid_request"),
			complete("status 600", "a", map[string]any{"status": 600}, 400, "invalid_request"),
			complete("status 101", "a", map[string]any{"status": 101}, 400, "invalid_request"),
			complete("a header name with a space", "a", map[string]any{"status": 200, "headers": map[string]string{"Bad Name": "x"}}, 400, "invalid_request"),
			complete("a header value with CRLF", "a", map[string]any{"status": 200, "headers": map[string]string{"X-A": "a\r\nSet-Cookie: x"}}, 400, "invalid_request"),
			complete("one header named twice", "a", map[string]any{"status": 200, "headers": map[string]string{"location": "/a", "Location": "/b"}}, 400, "invalid_request"),
			complete("a body that is not base64", "a", map[string]any{"status": 200, "body": "not base64!"}, 400, "invalid_request"),
			complete("a body in base64url", "a", map[string]any{"status": 200, "body": "-_-_"}, 400, "invalid_request"),
			complete("an unknown field", "a", map[string]any{"status": 200, "trailers": map[string]string{}}, 400, "invalid_request"),
			redeem("still processing", "a", false, 409, "request_in_progress", ""),
			complete("a valid response", "a", orderPage, 204, ""),
			replayed("replayed", "a", false, replayedOrderPage),
		}},
		{"complete and release need a processing record and a genuine token", nil, []step{
			complete("complete of a token never redeemed", "a", orderPage, 409, "record_not_processing"),
			release("release of a token never redeemed", "a", 409, "record_not_processing"),
			complete("a forged token", "forged", orderPage, 401, "token_invalid"),
			release("no token", "", 400, "invalid_request"),
			{name: "complete without the API key", path: "complete", tok: "a", response: orderPage, noAuth: true, wantStatus: 401, wantCode: "unauthorized"},
			{name: "release without the API key", path: "release", tok: "a", noAuth: true, wantStatus: 401, wantCode: "unauthorized"},
			redeem("the token was left alone: a plain redeem", "a", false, 200, "", "redeemed"),
			redeem("which used it up", "a", true, 409, "token_used", ""),
			complete("and left no record", "a", orderPage, 409, "record_not_processing"),
		}},
		{"the token's own refusals come first", nil, []step{
			redeem("another purpose", "login", true, 403, "purpose_mismatch", ""),
			redeem("a forged token", "forged", true, 401, "token_invalid", ""),
			{name: "without the API key", path: "redeem", tok: "a", record: true, noAuth: true, wantStatus: 401, wantCode: "unauthorized"},
			redeem("the token stayed valid", "a", true, 200, "", "redeemed"),
		}},
		{"a token that expires while processing can still be completed and replayed", nil, []step{
			redeem("open", "short", true, 200, "", "redeemed"),
			{name: "complete after exp", path: "complete", tok: "short", response: orderPage, advance: 30 * time.Second, wantStatus: 204},
			replayed("a late duplicate gets the response", "short", true, replayedOrderPage),
			replayed("so does a plain redeem", "short", false, replayedOrderPage),
		}},
		{"a token that expires while processing can be released, and is then expired", nil, []step{
			redeem("open", "short", true, 200, "", "redeemed"),
			redeem("in progress", "short", false, 409, "request_in_progress", ""),
			{name: "release after exp", path: "release", tok: "short", advance: 30 * time.Second, wantStatus: 204},
			redeem("a retry is refused", "short", true, 401, "token_expired", ""),
			redeem("a plain one too", "short", false, 401, "token_expired", ""),
			complete("and nothing is left to complete", "short", orderPage, 409, "record_not_processing"),
		}},
		{"an expired token without a record is expired and opens nothing", nil, []step{
			{name: "redeem after exp", path: "redeem", tok: "short", record: true, advance: 30 * time.Second, wantStatus: 401, wantCode: "token_expired"},
			complete("no record was opened", "short", orderPage, 409, "record_not_processing"),
		}},
		{"a record's lease is not renewed: the backend must complete (or renew) within the lock TTL and its grace", []idempotency.Option{idempotency.WithLockTTL(20 * time.Second)}, []step{
			redeem("open", "a", true, 200, "", "redeemed"),
			{name: "inside the lease", path: "redeem", tok: "a", advance: 19 * time.Second, wantStatus: 409, wantCode: "request_in_progress"},
			{name: "inside the grace", path: "redeem", tok: "a", advance: 20 * time.Second, wantStatus: 409, wantCode: "request_in_progress"},
			{name: "after the lease and grace a retry redeems", path: "redeem", tok: "a", record: true, advance: time.Second, wantStatus: 200, wantJSON: "redeemed"},
			complete("complete", "a", orderPage, 204, ""),
			replayed("replayed", "a", false, replayedOrderPage),
		}},
	}
	for _, sc := range apiStores {
		for _, tc := range tests {
			t.Run(sc.name+"/"+tc.name, func(t *testing.T) {
				e := newAPIEnv(t, sc.open, tc.keeper)
				toks := map[string]string{
					"a": e.issue("checkout", 0).Token, "b": e.issue("checkout", 0).Token,
					"short": e.issue("checkout", 10*time.Second).Token, "login": e.issue("login", 0).Token,
					"forged": "a.b.c", "": "",
				}
				for _, s := range tc.steps {
					e.advance(s.advance)
					body := map[string]any{"token": toks[s.tok]}
					switch s.path {
					case "redeem":
						body["purpose"] = "checkout"
						body["record"] = s.record
					case "complete":
						if s.response != nil {
							body["response"] = s.response
						}
					}
					got := e.post("/v1/tokens/"+s.path, body, s.noAuth)
					if got.status != s.wantStatus || got.code != s.wantCode || got.jsonStatus != s.wantJSON {
						t.Fatalf("%s: got %d %q %q %s; want %d %q %q", s.name, got.status, got.code, got.jsonStatus, got.raw, s.wantStatus, s.wantCode, s.wantJSON)
					}
					if fmt.Sprint(got.response) != fmt.Sprint(s.wantResp) {
						t.Fatalf("%s: response %+v, want %+v", s.name, got.response, s.wantResp)
					}
					if s.wantCode == "request_in_progress" && got.header.Get("Retry-After") != "1" {
						t.Fatalf("%s: Retry-After %q, want 1", s.name, got.header.Get("Retry-After"))
					}
					if got.status == 200 && got.header.Get("Cache-Control") != "no-store" {
						t.Fatalf("%s: Cache-Control %q", s.name, got.header.Get("Cache-Control"))
					}
				}
			})
		}
	}
}

// TestAPITokenRecordsReplayIsExact checks the replayed answer's JSON byte
// for byte: the shape the issue fixes, base64 with padding, and a body of
// arbitrary bytes coming back as sent.
func TestAPITokenRecordsReplayIsExact(t *testing.T) {
	e := newAPIEnv(t, apiStores[0].open, nil)
	is := e.issue("checkout", 0)
	before := e.now()
	got := e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": true}, false)
	var opened struct {
		LeaseExpiresAt time.Time `json:"lease_expires_at"`
	}
	if got.jsonStatus != "redeemed" || json.Unmarshal(got.raw, &opened) != nil {
		t.Fatalf("redeem: %d %s", got.status, got.raw)
	}
	// The lease end told is whole seconds, never past the record's lease.
	if lo, hi := before.Add(e.keeper.LockTTL()-time.Second), e.now().Add(e.keeper.LockTTL()); opened.LeaseExpiresAt.Before(lo) || opened.LeaseExpiresAt.After(hi) {
		t.Fatalf("lease_expires_at = %v, want within [%v, %v]", opened.LeaseExpiresAt, lo, hi)
	}
	body := []byte{0, 1, 2, 0xfe, 0xff, 'o', 'k'}
	resp := map[string]any{"status": 303, "headers": map[string]string{"Location": "/orders/7"}, "body": base64.StdEncoding.EncodeToString(body)}
	if got := e.post("/v1/tokens/complete", map[string]any{"token": is.Token, "response": resp}, false); got.status != 204 || len(got.raw) != 0 {
		t.Fatalf("complete: %d %s", got.status, got.raw)
	}
	got = e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout"}, false)
	want := fmt.Sprintf(`{"status":"replayed","id":%q,"purpose":"checkout","subject":"","response":{"status":303,"headers":{"Location":"/orders/7"},"body":"AAEC/v9vaw=="}}`, is.ID)
	if strings.TrimSpace(string(got.raw)) != want {
		t.Fatalf("replay = %s\nwant     %s", got.raw, want)
	}
	// The token in the Idempotency-Token header works as for redeem.
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/tokens/redeem", strings.NewReader(`{"purpose":"checkout"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(token.Header, is.Token)
	req.Header.Set("Authorization", "Bearer "+backendKey)
	if again := e.do(req); !bytes.Equal(again.raw, got.raw) {
		t.Fatalf("the header token's replay differs: %s", again.raw)
	}
}

func TestAPITokenRecordsFiftyConcurrentRedeemsOpenOneRecord(t *testing.T) {
	const n = 50
	for _, sc := range apiStores {
		t.Run(sc.name, func(t *testing.T) {
			e := newAPIEnv(t, sc.open, nil)
			is := e.issue("checkout", 0)
			race := func(record bool) map[string]int {
				start := make(chan struct{})
				answers := make(chan apiAnswer, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						<-start
						answers <- e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": record || i%2 == 0}, false)
					})
				}
				close(start)
				wg.Wait()
				close(answers)
				counts := map[string]int{}
				for a := range answers {
					counts[fmt.Sprintf("%d %s%s", a.status, a.code, a.jsonStatus)]++
				}
				return counts
			}
			if got := race(true); got["200 redeemed"] != 1 || got["409 request_in_progress"] != n-1 {
				t.Fatalf("while processing: %v; want 1 redeemed and %d in progress", got, n-1)
			}
			if got := e.post("/v1/tokens/complete", map[string]any{"token": is.Token, "response": map[string]any{"status": 303, "headers": map[string]string{"Location": "/orders/7"}}}, false); got.status != 204 {
				t.Fatalf("complete: %d %s", got.status, got.raw)
			}
			if got := race(false); got["200 replayed"] != n {
				t.Fatalf("after completion: %v; want %d replays", got, n)
			}
		})
	}
}

func TestAPIWithoutRecords(t *testing.T) {
	st := newRecordStore(t)
	svc := newTokenService(t, st)
	e, err := handlers.New(svc, quietLogs).Engine()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(e)
	defer srv.Close()
	env := apiEnv{t: t, srv: srv, svc: svc}
	is := env.issue("checkout", 0)
	tests := []struct {
		name       string
		path       string
		body       map[string]any
		wantStatus int
		wantCode   string
	}{
		{"record: true is refused", "/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": true}, 400, "invalid_request"},
		{"complete is not served", "/v1/tokens/complete", map[string]any{"token": is.Token, "response": map[string]any{"status": 200}}, 404, "not_found"},
		{"release is not served", "/v1/tokens/release", map[string]any{"token": is.Token}, 404, "not_found"},
		{"renew is not served", "/v1/tokens/renew", map[string]any{"token": is.Token, "lease": strings.Repeat("0", 32)}, 404, "not_found"},
		{"the token was not touched", "/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout"}, 200, ""},
		{"a plain redeem is used up as before", "/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": false}, 409, "token_used"},
	}
	for _, tc := range tests {
		got := env.post(tc.path, tc.body, true)
		if got.status != tc.wantStatus || got.code != tc.wantCode {
			t.Fatalf("%s: got %d %q %s; want %d %q", tc.name, got.status, got.code, got.raw, tc.wantStatus, tc.wantCode)
		}
	}
}

func TestAPITokenRecordsMetrics(t *testing.T) {
	e := newAPIEnv(t, apiStores[0].open, nil)
	is := e.issue("checkout", 0)
	e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": true}, false)
	e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout"}, false)
	e.post("/v1/tokens/release", map[string]any{"token": is.Token}, false)
	e.post("/v1/tokens/release", map[string]any{"token": is.Token}, false)
	opened := e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": true}, false)
	var lease struct{ Lease string }
	if err := json.Unmarshal(opened.raw, &lease); err != nil {
		t.Fatal(err)
	}
	e.post("/v1/tokens/renew", map[string]any{"token": is.Token, "lease": lease.Lease}, false)
	e.post("/v1/tokens/complete", map[string]any{"token": is.Token, "response": map[string]any{"status": 204}}, false)
	e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout"}, false)
	e.post("/v1/tokens/renew", map[string]any{"token": is.Token, "lease": lease.Lease}, false)
	families, err := e.m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			labels := []string{}
			for _, l := range mt.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			switch f.GetName() {
			case "replayguard_redemptions_total", "replayguard_token_records_total":
				got[strings.Join(labels, "/")] = mt.GetCounter().GetValue()
			}
		}
	}
	want := map[string]float64{
		"redeemed": 2, "request_in_progress": 1, "replayed": 1,
		"release/released": 1, "release/record_not_processing": 1, "complete/completed": 1,
		"renew/renewed": 1, "renew/record_not_processing": 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("counts = %v\nwant     %v", got, want)
	}
}

// TestAPITokenRecordsLease: the lease a record redemption answers lets a
// backend that outlived it find out, instead of ending the record a
// duplicate reopened meanwhile; without a lease (the issue's contract),
// complete and release end whoever's processing record it is.
func TestAPITokenRecordsLease(t *testing.T) {
	for _, sc := range apiStores {
		t.Run(sc.name, func(t *testing.T) {
			e := newAPIEnv(t, sc.open, []idempotency.Option{idempotency.WithLockTTL(20 * time.Second)})
			is := e.issue("checkout", 0)
			open := func() string {
				t.Helper()
				got := e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": true}, false)
				var a struct{ Lease string }
				if got.jsonStatus != "redeemed" || json.Unmarshal(got.raw, &a) != nil || len(a.Lease) != 32 {
					t.Fatalf("redeem = %d %s, want redeemed with a lease", got.status, got.raw)
				}
				return a.Lease
			}
			page := map[string]any{"status": 303, "headers": map[string]string{"Location": "/orders/7"}, "body": ""}
			first := open()
			e.advance(41 * time.Second) // the first backend outlives its lease and grace
			second := open()
			if second == first {
				t.Fatal("the reopened record has the first one's lease")
			}
			for _, tc := range []struct {
				name, path string
				body       map[string]any
				status     int
				code       string
			}{
				{"the first backend's late release is refused", "/v1/tokens/release", map[string]any{"token": is.Token, "lease": first}, 409, "record_not_processing"},
				{"the first backend's late complete is refused", "/v1/tokens/complete", map[string]any{"token": is.Token, "lease": first, "response": page}, 409, "record_not_processing"},
				{"a malformed lease is refused", "/v1/tokens/complete", map[string]any{"token": is.Token, "lease": "abc", "response": page}, 400, "invalid_request"},
				{"the duplicate is still in progress", "/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout"}, 409, "request_in_progress"},
				{"the second backend completes with its lease", "/v1/tokens/complete", map[string]any{"token": is.Token, "lease": second, "response": page}, 204, ""},
			} {
				got := e.post(tc.path, tc.body, false)
				if got.status != tc.status || got.code != tc.code {
					t.Fatalf("%s: %d %q %s, want %d %q", tc.name, got.status, got.code, got.raw, tc.status, tc.code)
				}
			}
			if got := e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout"}, false); got.jsonStatus != "replayed" || got.response == nil || got.response.Headers["Location"] != "/orders/7" {
				t.Fatalf("after completion: %d %s", got.status, got.raw)
			}
		})
	}
}

// TestAPITokenRecordsRenew: a backend whose work outlives the lock TTL
// keeps its record with POST /v1/tokens/renew and the lease it was
// given, so that a duplicate is not run meanwhile; renew answers when the
// lease now ends, and refuses what does not hold the record.
func TestAPITokenRecordsRenew(t *testing.T) {
	const ttl = 20 * time.Second // and a grace of as much
	page := map[string]any{"status": 303, "headers": map[string]string{"Location": "/orders/7"}, "body": ""}
	type step struct {
		name    string
		path    string // redeem (with "record": true), plainRedeem, renew or complete
		lease   string // "first", "second", "none", "malformed" or "unknown": which lease the call sends
		tok     string // "a" (the default) or "forged"
		noAuth  bool
		advance time.Duration // before the call
		status  int
		code    string
		json    string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"renewals keep the record past its first lease and grace, and the backend completes", []step{
			{name: "open", path: "redeem", status: 200, json: "redeemed"},
			{name: "renew inside the lease", path: "renew", lease: "first", advance: 15 * time.Second, status: 200, json: "renewed"},
			{name: "past the first lease and grace a duplicate is still in progress", path: "plainRedeem", advance: 30 * time.Second, status: 409, code: "request_in_progress"},
			{name: "renew again", path: "renew", lease: "first", status: 200, json: "renewed"},
			{name: "complete", path: "complete", lease: "first", advance: 35 * time.Second, status: 204},
			{name: "a duplicate gets the response", path: "plainRedeem", status: 200, json: "replayed"},
			{name: "renew after completion", path: "renew", lease: "first", status: 409, code: "record_not_processing"},
		}},
		{"without renewals the lease and grace end and a retry redeems", []step{
			{name: "open", path: "redeem", status: 200, json: "redeemed"},
			{name: "renew after the lease and grace", path: "renew", lease: "first", advance: 41 * time.Second, status: 409, code: "record_not_processing"},
			{name: "a retry opens a new record", path: "redeem", status: 200, json: "redeemed"},
			{name: "the first backend's lease renews nothing", path: "renew", lease: "first", status: 409, code: "record_not_processing"},
			{name: "the second backend's does", path: "renew", lease: "second", status: 200, json: "renewed"},
		}},
		{"renew refuses what does not name a record it may renew", []step{
			{name: "a token never redeemed", path: "renew", lease: "unknown", status: 409, code: "record_not_processing"},
			{name: "open", path: "redeem", status: 200, json: "redeemed"},
			{name: "no lease", path: "renew", lease: "none", status: 400, code: "invalid_request"},
			{name: "a malformed lease", path: "renew", lease: "malformed", status: 400, code: "invalid_request"},
			{name: "another lease", path: "renew", lease: "unknown", status: 409, code: "record_not_processing"},
			{name: "a forged token", path: "renew", lease: "first", tok: "forged", status: 401, code: "token_invalid"},
			{name: "without the API key", path: "renew", lease: "first", noAuth: true, status: 401, code: "unauthorized"},
			{name: "the record is still processing", path: "plainRedeem", status: 409, code: "request_in_progress"},
			{name: "and renews with its lease", path: "renew", lease: "first", status: 200, json: "renewed"},
		}},
	}
	for _, sc := range apiStores {
		for _, tc := range tests {
			t.Run(sc.name+"/"+tc.name, func(t *testing.T) {
				e := newAPIEnv(t, sc.open, []idempotency.Option{idempotency.WithLockTTL(ttl)})
				is := e.issue("checkout", time.Hour)
				leases := map[string]string{"none": "", "malformed": "abc", "unknown": strings.Repeat("0", 32)}
				for _, s := range tc.steps {
					e.advance(s.advance)
					tok := is.Token
					if s.tok == "forged" {
						tok = "a.b.c"
					}
					body := map[string]any{"token": tok}
					path := s.path
					switch s.path {
					case "redeem", "plainRedeem":
						path = "redeem"
						body["purpose"], body["record"] = "checkout", s.path == "redeem"
					case "complete":
						body["response"] = page
					}
					if s.lease != "" {
						body["lease"] = leases[s.lease]
					}
					before := e.now()
					got := e.post("/v1/tokens/"+path, body, s.noAuth)
					if got.status != s.status || got.code != s.code || got.jsonStatus != s.json {
						t.Fatalf("%s: got %d %q %q %s; want %d %q %q", s.name, got.status, got.code, got.jsonStatus, got.raw, s.status, s.code, s.json)
					}
					var a struct {
						Lease          string    `json:"lease"`
						LeaseExpiresAt time.Time `json:"lease_expires_at"`
					}
					if got.status == 200 && json.Unmarshal(got.raw, &a) != nil {
						t.Fatalf("%s: answer %s", s.name, got.raw)
					}
					switch {
					case s.path == "redeem" && leases["first"] == "":
						leases["first"] = a.Lease
					case s.path == "redeem":
						leases["second"] = a.Lease
					case s.path == "renew" && got.status == 200:
						// Whole seconds, never past the store's end of the lease.
						if lo, hi := before.Add(ttl-time.Second), e.now().Add(ttl); a.LeaseExpiresAt.Before(lo) || a.LeaseExpiresAt.After(hi) {
							t.Fatalf("%s: lease_expires_at = %v, want within [%v, %v]", s.name, a.LeaseExpiresAt, lo, hi)
						}
						if want := fmt.Sprintf(`{"status":"renewed","lease_expires_at":%q}`, a.LeaseExpiresAt.Format(time.RFC3339)); string(got.raw) != want {
							t.Fatalf("%s: answer %s, want %s", s.name, got.raw, want)
						}
						if got.header.Get("Cache-Control") != "no-store" {
							t.Fatalf("%s: Cache-Control %q", s.name, got.header.Get("Cache-Control"))
						}
					}
				}
			})
		}
	}
}

// failingRecords is a store whose record operations (Renew, Lookup,
// Release) fail, as a store that cannot confirm them does, while down.
type failingRecords struct {
	store.Store
	down *atomic.Bool
}

var errRecordsDown = store.Unavailable("records", errors.New("dial tcp 10.0.0.7:6379: connection refused"))

func (f failingRecords) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	if f.down.Load() {
		return false, errRecordsDown
	}
	return f.Store.Renew(ctx, key, owner, lease)
}

func (f failingRecords) Lookup(ctx context.Context, key string) (store.Record, bool, error) {
	if f.down.Load() {
		return store.Record{}, false, errRecordsDown
	}
	return f.Store.Lookup(ctx, key)
}

func (f failingRecords) Release(ctx context.Context, key, owner string) (bool, error) {
	if f.down.Load() {
		return false, errRecordsDown
	}
	return f.Store.Release(ctx, key, owner)
}

// TestAPITokenRecordsRenewFailsClosed: a renewal the store cannot
// confirm is 503 store_unavailable, never a lease end the backend would
// trust; once the store answers, the same lease renews.
func TestAPITokenRecordsRenewFailsClosed(t *testing.T) {
	down := new(atomic.Bool)
	e := newAPIEnv(t, func(t *testing.T) (store.Store, func() time.Time, func(time.Duration)) {
		st, now, advance := apiStores[0].open(t)
		return failingRecords{st, down}, now, advance
	}, nil)
	is := e.issue("checkout", 0)
	got := e.post("/v1/tokens/redeem", map[string]any{"token": is.Token, "purpose": "checkout", "record": true}, false)
	var a struct{ Lease string }
	if got.status != 200 || json.Unmarshal(got.raw, &a) != nil {
		t.Fatalf("redeem: %d %s", got.status, got.raw)
	}
	down.Store(true)
	if got := e.post("/v1/tokens/renew", map[string]any{"token": is.Token, "lease": a.Lease}, false); got.status != 503 || got.code != "store_unavailable" || strings.Contains(string(got.raw), "10.0.0.7") {
		t.Fatalf("renew while the store is down: %d %s, want 503 store_unavailable without the store's address", got.status, got.raw)
	}
	down.Store(false)
	if got := e.post("/v1/tokens/renew", map[string]any{"token": is.Token, "lease": a.Lease}, false); got.jsonStatus != "renewed" {
		t.Fatalf("renew once the store is back: %d %s", got.status, got.raw)
	}
}
