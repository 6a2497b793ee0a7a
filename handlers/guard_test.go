package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

func init() { gin.SetMode(gin.TestMode) }

func newService(t *testing.T) *token.Service {
	t.Helper()
	st := memory.New()
	t.Cleanup(func() { _ = st.Close() })
	svc, err := token.New(st, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(7))
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// protected builds the same protected route with either middleware shape,
// counting how often the application handler runs.
type shape struct {
	name  string
	build func(g *handlers.Guard, purpose string, runs *atomic.Int64) http.Handler
}

var shapes = []shape{
	{"gin", func(g *handlers.Guard, purpose string, runs *atomic.Int64) http.Handler {
		r := gin.New()
		r.POST("/orders", g.RequireToken(purpose), func(c *gin.Context) {
			claims, ok := handlers.TokenFrom(c.Request.Context())
			if !ok || claims.ID == "" {
				c.String(http.StatusInternalServerError, "no claims in context")
				return
			}
			runs.Add(1)
			c.String(http.StatusCreated, claims.ID)
		})
		return r
	}},
	{"net/http", func(g *handlers.Guard, purpose string, runs *atomic.Int64) http.Handler {
		return g.RequireTokenHandler(purpose)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			claims, ok := handlers.TokenFrom(r.Context())
			if !ok || claims.ID == "" {
				http.Error(w, "no claims in context", http.StatusInternalServerError)
				return
			}
			runs.Add(1)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte(claims.ID))
		}))
	}},
}

func post(h http.Handler, tok string, asForm bool) *httptest.ResponseRecorder {
	var req *http.Request
	if asForm {
		req = httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(url.Values{"idempotency_token": {tok}, "item": {"x"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(http.MethodPost, "/orders", nil)
		if tok != "" {
			req.Header.Set("Idempotency-Token", tok)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func problemCode(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, body %s", ct, rec.Body)
	}
	var p handlers.Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatal(err)
	}
	return p.Code
}

func TestGuard(t *testing.T) {
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			ctx := context.Background()
			tests := []struct {
				name string
				run  func(t *testing.T, svc *token.Service, h http.Handler, runs *atomic.Int64)
			}{
				{"header token runs the handler exactly once", func(t *testing.T, svc *token.Service, h http.Handler, runs *atomic.Int64) {
					is, _ := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout"})
					if rec := post(h, is.Token, false); rec.Code != http.StatusCreated || rec.Body.String() != is.ID {
						t.Fatalf("first = %d %s", rec.Code, rec.Body)
					}
					rec := post(h, is.Token, false)
					if rec.Code != http.StatusConflict || problemCode(t, rec) != "token_used" {
						t.Fatalf("second = %d %s", rec.Code, rec.Body)
					}
					if runs.Load() != 1 {
						t.Fatalf("handler ran %d times", runs.Load())
					}
				}},
				{"form field token is accepted", func(t *testing.T, svc *token.Service, h http.Handler, runs *atomic.Int64) {
					is, _ := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout"})
					if rec := post(h, is.Token, true); rec.Code != http.StatusCreated {
						t.Fatalf("form submit = %d %s", rec.Code, rec.Body)
					}
				}},
				{"missing token is 400 and the handler never runs", func(t *testing.T, svc *token.Service, h http.Handler, runs *atomic.Int64) {
					rec := post(h, "", false)
					if rec.Code != http.StatusBadRequest || problemCode(t, rec) != "invalid_request" || runs.Load() != 0 {
						t.Fatalf("= %d %s, runs %d", rec.Code, rec.Body, runs.Load())
					}
				}},
				{"token for another purpose is refused and stays valid", func(t *testing.T, svc *token.Service, h http.Handler, runs *atomic.Int64) {
					is, _ := svc.Issue(ctx, token.IssueRequest{Purpose: "login"})
					rec := post(h, is.Token, false)
					if rec.Code != http.StatusForbidden || problemCode(t, rec) != "purpose_mismatch" {
						t.Fatalf("= %d %s", rec.Code, rec.Body)
					}
					if _, err := svc.Redeem(ctx, is.Token, "login", ""); err != nil {
						t.Fatalf("token did not stay valid: %v", err)
					}
				}},
				{"forged token is 401", func(t *testing.T, svc *token.Service, h http.Handler, runs *atomic.Int64) {
					rec := post(h, "a.b.c", false)
					if rec.Code != http.StatusUnauthorized || problemCode(t, rec) != "token_invalid" {
						t.Fatalf("= %d %s", rec.Code, rec.Body)
					}
				}},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					svc := newService(t)
					var runs atomic.Int64
					tc.run(t, svc, sh.build(handlers.NewGuard(svc), "checkout", &runs), &runs)
				})
			}
		})
	}
}

func TestGuardSubjectAndErrorHandler(t *testing.T) {
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			svc := newService(t)
			ctx := context.Background()
			var reason error
			g := handlers.NewGuard(svc,
				handlers.WithSubjectFunc(func(r *http.Request) string { return r.Header.Get("X-User") }),
				handlers.WithErrorHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					reason = handlers.FailureReason(r)
					w.WriteHeader(handlers.ProblemFor(reason).Status)
					_, _ = w.Write([]byte("<p>Please reload the form.</p>"))
				})))
			var runs atomic.Int64
			h := sh.build(g, "checkout", &runs)
			is, _ := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout", Subject: "alice"})

			req := httptest.NewRequest(http.MethodPost, "/orders", nil)
			req.Header.Set("Idempotency-Token", is.Token)
			req.Header.Set("X-User", "mallory")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusForbidden || !errors.Is(reason, token.ErrSubjectMismatch) || !strings.Contains(rec.Body.String(), "reload") {
				t.Fatalf("other user = %d %q, reason %v", rec.Code, rec.Body, reason)
			}

			req.Header.Set("X-User", "alice")
			rec = httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusCreated || runs.Load() != 1 {
				t.Fatalf("bound user = %d %s", rec.Code, rec.Body)
			}
		})
	}
}

func TestHiddenFieldEscapes(t *testing.T) {
	got := string(handlers.HiddenField(`"><script>`))
	want := `<input type="hidden" name="idempotency_token" value="&#34;&gt;&lt;script&gt;">`
	if got != want {
		t.Fatalf("HiddenField = %s, want %s", got, want)
	}
}

func TestGuardField(t *testing.T) {
	svc := newService(t)
	g := handlers.NewGuard(svc)
	field, err := g.Field(httptest.NewRequest(http.MethodGet, "/", nil), "checkout")
	if err != nil {
		t.Fatal(err)
	}
	s := string(field)
	i := strings.Index(s, `value="`)
	tok := s[i+len(`value="`) : len(s)-2]
	if _, err := svc.Redeem(context.Background(), tok, "checkout", ""); err != nil {
		t.Fatalf("rendered token does not redeem: %v (%s)", err, s)
	}
}
