package main

import (
	"context"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
	rgtoken "github.com/replayguard/replayguard/token"
)

func TestRoutesFileLoads(t *testing.T) {
	routes, err := gateway.LoadRoutes("routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []gateway.Route{
		{Match: "POST /orders", Policy: gateway.PolicyIdempotencyKey, Required: true},
		{Match: "POST /checkout", Policy: gateway.PolicyToken, Purpose: "checkout"},
		{Match: "POST /feedback", Policy: gateway.PolicyFingerprint},
	}
	if len(routes) != len(want) {
		t.Fatalf("got %d routes, want %d: %+v", len(routes), len(want), routes)
	}
	for i, w := range want {
		got := routes[i]
		if got.Match != w.Match || got.Policy != w.Policy || got.Required != w.Required || got.Purpose != w.Purpose {
			t.Errorf("routes[%d] = %+v, want %+v", i, got, w)
		}
	}
}

// TestAppImportsNoReplayguard keeps the example's point: the app is
// protected without a line of Replayguard code.
func TestAppImportsNoReplayguard(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, "github.com/replayguard/") {
			t.Errorf("main.go imports %s", p)
		}
	}
}

// env is the app on an httptest server behind a gateway with routes.yaml,
// as cmd/server runs it with REPLAYGUARD_UPSTREAM and REPLAYGUARD_ROUTES.
type env struct {
	app    *app
	direct *httptest.Server // the app itself
	front  *httptest.Server // the gateway
	tokens *rgtoken.Service
}

func newEnv(t *testing.T) env {
	t.Helper()
	a := newApp()
	direct := httptest.NewServer(a.routes())
	t.Cleanup(direct.Close)
	upstream, err := url.Parse(direct.URL)
	if err != nil {
		t.Fatal(err)
	}
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	key, err := rgtoken.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := rgtoken.New(st, []rgtoken.Key{key}, rgtoken.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	routes, err := gateway.LoadRoutes("routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(upstream, routes,
		gateway.WithKeeper(idempotency.New(st)), // the token service's store: records live beside tokens
		gateway.WithTokens(svc),
		gateway.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(gw)
	t.Cleanup(front.Close)
	return env{app: a, direct: direct, front: front, tokens: svc}
}

// answer is what a client saw.
type answer struct {
	status                          int
	location, body, replayed, ctype string
}

// send posts body to srv's path with the headers and returns the answer,
// without following redirects (a browser would follow the 303).
func send(t *testing.T, srv *httptest.Server, path, contentType, body string, header map[string]string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	c := srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{
		status:   resp.StatusCode,
		location: resp.Header.Get("Location"),
		body:     string(data),
		replayed: resp.Header.Get(idempotency.ReplayedHeader),
		ctype:    resp.Header.Get("Content-Type"),
	}
}

func TestDoubleSubmitRunsOnce(t *testing.T) {
	const form = "application/x-www-form-urlencoded"
	tests := []struct {
		name string
		// request returns the path, content type, body and headers to
		// send twice.
		request    func(t *testing.T, e env) (path, ctype, body string, header map[string]string)
		wantStatus int
		wantLoc    string
		// executions counts what the app did.
		executions func(e env) int
	}{
		{
			name: "idempotency_key: an API call retried with its key places one order",
			request: func(*testing.T, env) (string, string, string, map[string]string) {
				return "/orders", "application/json", `{"item":"tea"}`, map[string]string{"Idempotency-Key": `"order-1"`}
			},
			wantStatus: http.StatusCreated,
			wantLoc:    "/orders/1",
			executions: func(e env) int { return len(e.app.placed()) },
		},
		{
			name: "token: a form posted twice with its token places one order and both get the 303",
			request: func(t *testing.T, e env) (string, string, string, map[string]string) {
				is, err := e.tokens.Issue(context.Background(), rgtoken.IssueRequest{Purpose: "checkout"})
				if err != nil {
					t.Fatal(err)
				}
				return "/checkout", form, url.Values{"idempotency_token": {is.Token}, "item": {"tea"}}.Encode(), nil
			},
			wantStatus: http.StatusSeeOther,
			wantLoc:    "/orders/1",
			executions: func(e env) int { return len(e.app.placed()) },
		},
		{
			name: "fingerprint: an identical keyless form posted twice is received once",
			request: func(*testing.T, env) (string, string, string, map[string]string) {
				return "/feedback", form, "text=great+tea", nil
			},
			wantStatus: http.StatusOK,
			executions: func(e env) int { return e.app.received() },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			path, ctype, body, header := tt.request(t, e)
			first := send(t, e.front, path, ctype, body, header)
			second := send(t, e.front, path, ctype, body, header)

			if first.status != tt.wantStatus || first.location != tt.wantLoc || first.replayed != "" {
				t.Errorf("first: %d Location %q Idempotent-Replayed %q, want %d %q and no replay mark; body: %s",
					first.status, first.location, first.replayed, tt.wantStatus, tt.wantLoc, first.body)
			}
			if second.replayed != "true" {
				t.Errorf("second: Idempotent-Replayed %q, want true; status %d, body: %s", second.replayed, second.status, second.body)
			}
			if second.status != first.status || second.location != first.location || second.body != first.body || second.ctype != first.ctype {
				t.Errorf("second answer %+v differs from the first %+v", second, first)
			}
			if n := tt.executions(e); n != 1 {
				t.Errorf("the app ran %d times, want once", n)
			}
		})
	}
}

func TestRefusedBeforeTheApp(t *testing.T) {
	e := newEnv(t)
	const form = "application/x-www-form-urlencoded"
	tests := []struct {
		name       string
		direct     bool // to the app itself, not through the gateway
		path       string
		ctype      string
		body       string
		header     map[string]string
		wantStatus int
	}{
		{"a checkout straight to the app has no Replayguard-Token-Id and is refused by the app", true, "/checkout", form, "item=tea", nil, http.StatusForbidden},
		{"a checkout through the gateway without a token never reaches the app", false, "/checkout", form, "item=tea", nil, http.StatusBadRequest},
		{"a client-sent Replayguard-Token-Id is removed, so it is still a checkout without a token", false, "/checkout", form, "item=tea", map[string]string{"Replayguard-Token-Id": "1"}, http.StatusBadRequest},
		{"an order without an Idempotency-Key never reaches the app", false, "/orders", "application/json", `{"item":"tea"}`, nil, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := e.front
			if tt.direct {
				srv = e.direct
			}
			if got := send(t, srv, tt.path, tt.ctype, tt.body, tt.header); got.status != tt.wantStatus {
				t.Errorf("got %d, want %d; body: %s", got.status, tt.wantStatus, got.body)
			}
		})
	}
	if n := len(e.app.placed()); n != 0 {
		t.Errorf("%d orders placed, want none", n)
	}
}

func TestHomePageUsesTheSDK(t *testing.T) {
	e := newEnv(t)
	resp, err := e.front.Client().Get(e.front.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`<script src="/sdk/replayguard.js"`, `action="/checkout" data-replayguard="checkout"`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("GET / (through the gateway) lacks %q:\n%s", want, data)
		}
	}
}
