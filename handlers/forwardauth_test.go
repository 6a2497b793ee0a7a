package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/store/storetest"
	"github.com/replayguard/replayguard/token"
)

const forwardAuthKey = "proxy-api-key"

// brokenRedeems fails every token redemption, like a store that is down:
// its error wraps store.ErrUnavailable, as every store's does.
type brokenRedeems struct{ store.Store }

var errStoreDown = errors.New("dial tcp 10.9.8.7:6379: connect: connection refused")

func (brokenRedeems) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, store.Unavailable("redeem", errStoreDown)
}

// forwardAuthServer is the standalone engine over a memory store on clk,
// with its redemption metrics.
type forwardAuthServer struct {
	h       http.Handler
	tokens  *token.Service
	clk     *storetest.Clock
	metrics *metrics.Metrics
}

func newForwardAuthServer(t *testing.T, brokenStore bool, opts ...handlers.Option) *forwardAuthServer {
	t.Helper()
	clk := storetest.NewClock(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
	mem := memory.New(memory.WithClock(clk.Now))
	t.Cleanup(func() { _ = mem.Close() })
	var st store.Store = mem
	if brokenStore {
		st = brokenRedeems{mem}
	}
	svc, err := token.New(st, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}},
		token.WithMachineID(7), token.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	e, err := handlers.New(svc, append(opts, handlers.WithMetrics(m), handlers.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))...).
		Engine()
	if err != nil {
		t.Fatal(err)
	}
	return &forwardAuthServer{h: e, tokens: svc, clk: clk, metrics: m}
}

func (s *forwardAuthServer) issue(t *testing.T, purpose, subject string) token.Issued {
	t.Helper()
	is, err := s.tokens.Issue(context.Background(), token.IssueRequest{Purpose: purpose, Subject: subject})
	if err != nil {
		t.Fatal(err)
	}
	return is
}

// redemptions returns replayguard_redemptions_total by outcome.
func (s *forwardAuthServer) redemptions(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := s.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "replayguard_redemptions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					got[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return got
}

type forwardAuthCall struct {
	method string
	query  string // the proxy's configured query, e.g. "purpose=checkout"
	token  string // the Idempotency-Token header; "" sends none
	auth   string // the Authorization header; "" sends none
	body   io.Reader
}

func (s *forwardAuthServer) call(c forwardAuthCall) *httptest.ResponseRecorder {
	target := handlers.ForwardAuthPath
	if c.query != "" {
		target += "?" + c.query
	}
	req := httptest.NewRequest(c.method, target, c.body)
	// What nginx and Traefik add to the subrequest: ignored, but present.
	req.Header.Set("X-Forwarded-Method", http.MethodPost)
	req.Header.Set("X-Forwarded-Uri", "/checkout")
	if c.token != "" {
		req.Header.Set(token.Header, c.token)
	}
	if c.auth != "" {
		req.Header.Set("Authorization", c.auth)
	}
	rec := httptest.NewRecorder()
	s.h.ServeHTTP(rec, req)
	return rec
}

// wantRefusal checks a forward-auth refusal: status, the problem's code,
// a body status equal to the HTTP status, and no token ID.
func wantRefusal(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) problem.Problem {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body: %v: %s", err, rec.Body)
	}
	if p.Code != code || p.Status != status || p.Type != problem.TypePrefix+code {
		t.Fatalf("problem = %+v, want code %s and status %d", p, code, status)
	}
	if got := rec.Header().Get(handlers.ProblemCodeHeader); got != code {
		t.Fatalf("%s = %q, want %q", handlers.ProblemCodeHeader, got, code)
	}
	if id := rec.Header().Get(token.IDHeader); id != "" {
		t.Fatalf("%s = %q on a refusal", token.IDHeader, id)
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("Cache-Control = %q, want no-store", cc)
	}
	return p
}

func wantRedeemed(t *testing.T, rec *httptest.ResponseRecorder, id string) {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("status = %d, want 200; body %s", rec.Code, rec.Body)
	}
	if got := rec.Header().Get(token.IDHeader); got != id {
		t.Fatalf("%s = %q, want %q", token.IDHeader, got, id)
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("Cache-Control = %q, want no-store", cc)
	}
	if rec.Body.Len() != 0 {
		t.Fatalf("body = %q, want none", rec.Body)
	}
	if got := rec.Header().Get(handlers.ProblemCodeHeader); got != "" {
		t.Fatalf("%s = %q on success", handlers.ProblemCodeHeader, got)
	}
}

func TestForwardAuthRedeemsOncePerMethod(t *testing.T) {
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		t.Run(method, func(t *testing.T) {
			s := newForwardAuthServer(t, false)
			is := s.issue(t, "checkout", "")
			call := forwardAuthCall{method: method, query: "purpose=checkout", token: is.Token}
			wantRedeemed(t, s.call(call), is.ID)
			// httptest.ResponseRecorder keeps a HEAD answer's body; a real
			// server drops it.
			wantRefusal(t, s.call(call), http.StatusForbidden, "token_used")
			if got := s.redemptions(t); got["redeemed"] != 1 || got["token_used"] != 1 {
				t.Fatalf("redemptions = %v, want redeemed 1 and token_used 1", got)
			}
		})
	}
}

func TestForwardAuthOutcomes(t *testing.T) {
	type setup struct {
		s        *forwardAuthServer
		checkout token.Issued // purpose checkout, unbound
		alice    token.Issued // purpose checkout, subject alice
		plain    token.Issued // the default purpose
	}
	bearer := "Bearer " + forwardAuthKey
	tests := []struct {
		name        string
		brokenStore bool
		apiKeys     bool
		before      func(t *testing.T, u setup) // runs before the call
		call        func(u setup) forwardAuthCall
		status      int
		code        string // "" for success
		id          func(u setup) string
		wantMetric  string
		after       func(t *testing.T, u setup) // runs after the call
	}{
		{
			name: "a token for the configured purpose is redeemed",
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token}
			},
			status:     200,
			id:         func(u setup) string { return u.checkout.ID },
			wantMetric: "redeemed",
		},
		{
			name:       "without a purpose in the query the default purpose applies",
			call:       func(u setup) forwardAuthCall { return forwardAuthCall{method: "GET", token: u.plain.Token} },
			status:     200,
			id:         func(u setup) string { return u.plain.ID },
			wantMetric: "redeemed",
		},
		{
			name: "a subject-bound token is redeemed for its subject",
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout&subject=alice", token: u.alice.Token}
			},
			status:     200,
			id:         func(u setup) string { return u.alice.ID },
			wantMetric: "redeemed",
		},
		{
			name: "the request body is never read, so an oversized one is no matter",
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "POST", query: "purpose=checkout", token: u.checkout.Token,
					body: strings.NewReader(strings.Repeat("x", 2*handlers.MaxBodyBytes))}
			},
			status:     200,
			id:         func(u setup) string { return u.checkout.ID },
			wantMetric: "redeemed",
		},
		{
			name:       "no token is 403 invalid_request",
			call:       func(u setup) forwardAuthCall { return forwardAuthCall{method: "POST", query: "purpose=checkout"} },
			status:     403,
			code:       "invalid_request",
			wantMetric: "invalid_request",
		},
		{
			name: "a forged token is 403 token_invalid, not 401",
			call: func(u setup) forwardAuthCall {
				forged := u.checkout.Token[:strings.LastIndexByte(u.checkout.Token, '.')+1] + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
				return forwardAuthCall{method: "POST", query: "purpose=checkout", token: forged}
			},
			status:     403,
			code:       "token_invalid",
			wantMetric: "token_invalid",
			after: func(t *testing.T, u setup) {
				// The real token was not touched.
				wantRedeemed(t, u.s.call(forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token}), u.checkout.ID)
			},
		},
		{
			name: "an expired token is 403 token_expired, not 401",
			before: func(t *testing.T, u setup) {
				u.s.clk.Advance(token.DefaultTTL + token.MaxLeeway + time.Second)
			},
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token}
			},
			status:     403,
			code:       "token_expired",
			wantMetric: "token_expired",
		},
		{
			name: "a used token is 403 token_used, not 409",
			before: func(t *testing.T, u setup) {
				wantRedeemed(t, u.s.call(forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token}), u.checkout.ID)
			},
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "POST", query: "purpose=checkout", token: u.checkout.Token}
			},
			status:     403,
			code:       "token_used",
			wantMetric: "token_used",
		},
		{
			name: "a token redeemed through POST /v1/tokens/redeem is used here too",
			before: func(t *testing.T, u setup) {
				req := httptest.NewRequest(http.MethodPost, "/v1/tokens/redeem?purpose=checkout", nil)
				req.Header.Set(token.Header, u.checkout.Token)
				rec := httptest.NewRecorder()
				u.s.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					t.Fatalf("redeem: %d %s", rec.Code, rec.Body)
				}
			},
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token}
			},
			status:     403,
			code:       "token_used",
			wantMetric: "token_used",
		},
		{
			name: "another purpose is 403 purpose_mismatch and the token stays valid",
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=refund", token: u.checkout.Token}
			},
			status:     403,
			code:       "purpose_mismatch",
			wantMetric: "purpose_mismatch",
			after: func(t *testing.T, u setup) {
				wantRedeemed(t, u.s.call(forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token}), u.checkout.ID)
			},
		},
		{
			name: "a subject-bound token without its subject is 403 subject_mismatch",
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.alice.Token}
			},
			status:     403,
			code:       "subject_mismatch",
			wantMetric: "subject_mismatch",
		},
		{
			name: "another subject is 403 subject_mismatch",
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout&subject=mallory", token: u.alice.Token}
			},
			status:     403,
			code:       "subject_mismatch",
			wantMetric: "subject_mismatch",
		},
		{
			name: "a malformed configured purpose is 403 invalid_request",
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=no%20spaces", token: u.checkout.Token}
			},
			status:     403,
			code:       "invalid_request",
			wantMetric: "invalid_request",
		},
		{
			name:        "a store that does not answer is 503 store_unavailable",
			brokenStore: true,
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token}
			},
			status:     503,
			code:       "store_unavailable",
			wantMetric: "store_unavailable",
		},
		{
			name:    "with API keys, none sent is 401 unauthorized",
			apiKeys: true,
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token}
			},
			status:     401,
			code:       "unauthorized",
			wantMetric: "unauthorized",
			after: func(t *testing.T, u setup) {
				// Refused before the token was looked at: it still redeems.
				wantRedeemed(t, u.s.call(forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token, auth: bearer}), u.checkout.ID)
			},
		},
		{
			name:    "with API keys, a wrong one is 401 unauthorized",
			apiKeys: true,
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token, auth: "Bearer not-the-key"}
			},
			status:     401,
			code:       "unauthorized",
			wantMetric: "unauthorized",
		},
		{
			name:    "with API keys, the right one redeems",
			apiKeys: true,
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "POST", query: "purpose=checkout", token: u.checkout.Token, auth: bearer}
			},
			status:     200,
			id:         func(u setup) string { return u.checkout.ID },
			wantMetric: "redeemed",
		},
		{
			name:    "with API keys, the right key and a used token is 403 token_used",
			apiKeys: true,
			before: func(t *testing.T, u setup) {
				wantRedeemed(t, u.s.call(forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token, auth: bearer}), u.checkout.ID)
			},
			call: func(u setup) forwardAuthCall {
				return forwardAuthCall{method: "GET", query: "purpose=checkout", token: u.checkout.Token, auth: bearer}
			},
			status:     403,
			code:       "token_used",
			wantMetric: "token_used",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []handlers.Option
			if tt.apiKeys {
				opts = append(opts, handlers.WithAPIKeys(forwardAuthKey))
			}
			s := newForwardAuthServer(t, tt.brokenStore, opts...)
			u := setup{s: s, checkout: s.issue(t, "checkout", ""), alice: s.issue(t, "checkout", "alice"), plain: s.issue(t, "", "")}
			if tt.before != nil {
				tt.before(t, u)
			}
			before := s.redemptions(t)
			rec := s.call(tt.call(u))
			if tt.code == "" {
				wantRedeemed(t, rec, tt.id(u))
			} else {
				p := wantRefusal(t, rec, tt.status, tt.code)
				if p.RequestID == "" || p.RequestID != rec.Header().Get(problem.RequestIDHeader) {
					t.Fatalf("request_id = %q, X-Request-ID = %q", p.RequestID, rec.Header().Get(problem.RequestIDHeader))
				}
			}
			switch tt.status {
			case http.StatusUnauthorized:
				if got := rec.Header().Get("WWW-Authenticate"); got != `Bearer realm="replayguard"` {
					t.Fatalf("WWW-Authenticate = %q", got)
				}
			case http.StatusServiceUnavailable:
				if got := rec.Header().Get("Retry-After"); got == "" {
					t.Fatal("no Retry-After on 503")
				}
				if strings.Contains(rec.Body.String(), "10.9.8.7") {
					t.Fatalf("the store's address reached the client: %s", rec.Body)
				}
			default:
				if got := rec.Header().Get("WWW-Authenticate"); got != "" {
					t.Fatalf("WWW-Authenticate = %q on %d", got, rec.Code)
				}
			}
			after := s.redemptions(t)
			if d := after[tt.wantMetric] - before[tt.wantMetric]; d != 1 {
				t.Fatalf("redemptions{outcome=%q} went up by %v, want 1 (before %v, after %v)", tt.wantMetric, d, before, after)
			}
			if tt.after != nil {
				tt.after(t, u)
			}
		})
	}
}

func TestForwardAuthOtherMethodsAre405(t *testing.T) {
	s := newForwardAuthServer(t, false)
	rec := s.call(forwardAuthCall{method: http.MethodOptions, query: "purpose=checkout"})
	if rec.Code != http.StatusMethodNotAllowed || problemCode(t, rec) != "method_not_allowed" {
		t.Fatalf("OPTIONS: %d %s, want 405 method_not_allowed", rec.Code, rec.Body)
	}
}

// problemCode requires rec to be a problem+json answer and returns its
// code.
func problemCode(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, body %s", ct, rec.Body)
	}
	var p problem.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	return p.Code
}
