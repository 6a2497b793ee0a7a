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
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

const testAPIKey = "test-backend-key"

// newServer runs the standalone server's engine, with an API key, on the
// memory store.
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
	engine, err := handlers.New(svc, handlers.WithAPIKeys(testAPIKey), handlers.WithLogger(logger)).
		Engine(handlers.EngineConfig{Logger: logger})
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
