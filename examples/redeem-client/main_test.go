package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

const testAPIKey = "test-backend-key"

// newServer runs the standalone server's engine, with an API key and
// token records (as cmd/server has them), on the memory store.
func newServer(t *testing.T) (*httptest.Server, *token.Service) {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { st.Close() })
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := token.New(st, []token.Key{key}, token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.ReleaseMode)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The Keeper shares the token service's store: a token's record lives
	// beside the token.
	keeper := idempotency.New(st)
	engine, err := handlers.New(svc, handlers.WithAPIKeys(testAPIKey), handlers.WithLogger(logger), handlers.WithRecords(keeper)).Engine()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(engine)
	t.Cleanup(srv.Close)
	return srv, svc
}

func TestRedeemOnceThenConflict(t *testing.T) {
	srv, svc := newServer(t)
	ctx := context.Background()
	is, err := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{BaseURL: srv.URL, APIKey: testAPIKey, HTTP: srv.Client()}

	steps := []struct {
		name         string
		wantStatus   int
		wantRedeemed bool
		wantCode     string
	}{
		{"first redeem succeeds", http.StatusOK, true, ""},
		{"second redeem is a conflict", http.StatusConflict, false, "token_used"},
	}
	for _, s := range steps {
		res, err := c.Redeem(ctx, is.Token, "checkout", "")
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if res.Status != s.wantStatus || res.Redeemed != s.wantRedeemed || res.Code != s.wantCode {
			t.Errorf("%s: got %+v, want status %d redeemed %v code %q", s.name, res, s.wantStatus, s.wantRedeemed, s.wantCode)
		}
		if s.wantRedeemed && res.ID != is.ID {
			t.Errorf("%s: redeemed ID %q, want %q", s.name, res.ID, is.ID)
		}
	}
}

func TestRedeemRefusals(t *testing.T) {
	srv, svc := newServer(t)
	ctx := context.Background()
	is, err := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		apiKey   string
		purpose  string
		wantCode string
	}{
		{"a wrong API key is unauthorized", "wrong", "checkout", "unauthorized"},
		{"another purpose is refused and keeps the token", testAPIKey, "login", "purpose_mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Client{BaseURL: srv.URL, APIKey: tt.apiKey, HTTP: srv.Client()}
			res, err := c.Redeem(ctx, is.Token, tt.purpose, "")
			if err != nil {
				t.Fatal(err)
			}
			if res.Redeemed || res.Code != tt.wantCode {
				t.Errorf("got %+v, want refusal %q", res, tt.wantCode)
			}
		})
	}
	c := &Client{BaseURL: srv.URL, APIKey: testAPIKey, HTTP: srv.Client()}
	if res, err := c.Redeem(ctx, is.Token, "checkout", ""); err != nil || !res.Redeemed {
		t.Errorf("after the refusals the token no longer redeems: %+v, %v", res, err)
	}
}

func TestRunIssuesThenShowsTheReplayRefused(t *testing.T) {
	srv, _ := newServer(t)
	var out, errOut bytes.Buffer
	getenv := func(name string) string {
		if name == "REDEEM_CLIENT_API_KEY" {
			return testAPIKey
		}
		return ""
	}
	code := run(context.Background(), []string{"-url", srv.URL, "-purpose", "checkout"}, getenv, &out, &errOut)
	if code != 0 {
		t.Errorf("exit status %d, want 0; stderr: %s", code, errOut.String())
	}
	for _, want := range []string{"issued token", "redeem #1: 200 redeemed", "redeem #2: 409 token_used: do not proceed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunWithoutServerFailsClosed(t *testing.T) {
	srv, _ := newServer(t)
	url := srv.URL
	srv.Close() // nothing listens there now
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-url", url, "-token", "a.b.c"}, func(string) string { return "" }, &out, &errOut)
	if code != 2 || !strings.Contains(out.String(), "do not proceed") {
		t.Errorf("exit status %d, output %q: want 2 and a refusal", code, out.String())
	}
}

// TestRecordMode runs handle, as a backend in record mode would for each
// request carrying the token, and counts the orders placed.
func TestRecordMode(t *testing.T) {
	tests := []struct {
		name string
		// fail is how many attempts fail before the action succeeds.
		fail int
		// duplicateInside sends a duplicate while the first is running.
		duplicateInside bool
		wantCodes       []int
		// wantLocations is each attempt's answer to the client; "" for
		// none.
		wantLocations []string
		wantOrders    int
	}{
		{
			name:          "a double submit places one order and the duplicate gets the same 303",
			wantCodes:     []int{0, 0},
			wantLocations: []string{"/orders/1", "/orders/1"},
			wantOrders:    1,
		},
		{
			name:          "a failed action releases the token, so the retry places the order and a duplicate gets its 303",
			fail:          1,
			wantCodes:     []int{1, 0, 0},
			wantLocations: []string{"", "/orders/1", "/orders/1"},
			wantOrders:    1,
		},
		{
			name:            "a duplicate while the order is being placed is refused, and one after gets the 303",
			duplicateInside: true,
			wantCodes:       []int{0, 0},
			wantLocations:   []string{"/orders/1", "/orders/1"},
			wantOrders:      1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, svc := newServer(t)
			ctx := context.Background()
			is, err := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout"})
			if err != nil {
				t.Fatal(err)
			}
			c := &Client{BaseURL: srv.URL, APIKey: testAPIKey, HTTP: srv.Client()}
			s := &shop{fail: tt.fail}
			var out bytes.Buffer
			action := s.place
			var insideCode int
			var insideResp *Response
			if tt.duplicateInside {
				action = func(ctx context.Context) (Response, error) {
					insideResp, insideCode = handle(ctx, c, is.Token, "checkout", "", s.place, &out, "duplicate")
					return s.place(ctx)
				}
			}

			var first *Response
			for i := range tt.wantCodes {
				resp, code := handle(ctx, c, is.Token, "checkout", "", action, &out, "attempt")
				if code != tt.wantCodes[i] {
					t.Errorf("attempt %d: exit status %d, want %d", i+1, code, tt.wantCodes[i])
				}
				got := ""
				if resp != nil {
					got = resp.Headers["Location"]
				}
				if got != tt.wantLocations[i] {
					t.Errorf("attempt %d: answered with Location %q, want %q", i+1, got, tt.wantLocations[i])
				}
				if resp == nil {
					continue
				}
				if first == nil {
					first = resp
				} else if resp.Status != first.Status || !bytes.Equal(resp.Body, first.Body) || resp.Headers["Content-Type"] != first.Headers["Content-Type"] {
					t.Errorf("attempt %d: answered %+v, want the first answer %+v", i+1, *resp, *first)
				}
			}
			if s.orders != tt.wantOrders {
				t.Errorf("%d orders placed, want %d", s.orders, tt.wantOrders)
			}
			if tt.duplicateInside && (insideCode != 1 || insideResp != nil || !strings.Contains(out.String(), "duplicate: 409 request_in_progress")) {
				t.Errorf("the duplicate during the first request got status %d and response %v, want 1 and none after 409 request_in_progress:\n%s", insideCode, insideResp, out.String())
			}

			// Every redeem of the token answers from its record, with or
			// without "record".
			res, err := c.Redeem(ctx, is.Token, "checkout", "")
			if err != nil {
				t.Fatal(err)
			}
			if !res.Replayed || res.Response == nil || res.Response.Status != http.StatusSeeOther || res.Response.Headers["Location"] != "/orders/1" || string(res.Response.Body) != "order 1 placed\n" {
				t.Errorf("a plain redeem after the order got %+v, want the stored 303 to /orders/1", res)
			}
		})
	}
}

func TestRunRecord(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string
	}{
		{
			name:     "a duplicate submit gets the first response and places nothing",
			args:     []string{"-record"},
			wantCode: 0,
			want: []string{
				"issued token",
				"attempt #1: 200 redeemed",
				"attempt #1: done, stored the response: 303 Location: /orders/1",
				"attempt #2: 200 replayed",
				"answer with the stored response: 303 Location: /orders/1",
			},
		},
		{
			name:     "a failure releases the token and the retry places the order",
			args:     []string{"-record", "-fail"},
			wantCode: 0,
			want: []string{
				"attempt #1: the action failed (the payment provider timed out); released the token for a retry",
				"attempt #2: 200 redeemed",
				"attempt #2: done, stored the response: 303 Location: /orders/1",
				"attempt #3: 200 replayed",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newServer(t)
			var out, errOut bytes.Buffer
			args := append([]string{"-url", srv.URL, "-api-key", testAPIKey}, tt.args...)
			code := run(context.Background(), args, func(string) string { return "" }, &out, &errOut)
			if code != tt.wantCode {
				t.Errorf("exit status %d, want %d; stderr: %s", code, tt.wantCode, errOut.String())
			}
			for _, want := range tt.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
			if n := strings.Count(out.String(), "stored the response"); n != 1 {
				t.Errorf("%d orders stored, want 1:\n%s", n, out.String())
			}
		})
	}
}

func TestRunFailNeedsRecord(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"-fail"}, func(string) string { return "" }, &out, &errOut)
	if code != 2 || !strings.Contains(errOut.String(), "-fail needs -record") {
		t.Errorf("exit status %d, stderr %q: want 2 and an explanation", code, errOut.String())
	}
}
