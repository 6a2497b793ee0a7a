package guard_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/token"
)

// shape builds the same protected route, POST /orders, with either
// middleware shape, counting how often the application handler runs.
type shape struct {
	name  string
	build func(mw func(http.Handler) http.Handler, runs *atomic.Int64) http.Handler
}

var shapes = []shape{
	{"gin", func(mw func(http.Handler) http.Handler, runs *atomic.Int64) http.Handler {
		r := gin.New()
		r.POST("/orders", guard.Gin(mw), func(c *gin.Context) {
			claims, ok := guard.TokenFrom(c.Request.Context())
			if !ok || claims.ID == "" {
				c.String(http.StatusInternalServerError, "no claims in context")
				return
			}
			runs.Add(1)
			c.String(http.StatusCreated, claims.ID)
		})
		return r
	}},
	{"net/http", func(mw func(http.Handler) http.Handler, runs *atomic.Int64) http.Handler {
		return mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			claims, ok := guard.TokenFrom(r.Context())
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
		req = httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(url.Values{token.FormField: {tok}, "item": {"x"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(http.MethodPost, "/orders", nil)
		if tok != "" {
			req.Header.Set(token.Header, tok)
		}
	}
	return serve(h, req)
}

func TestRequireToken(t *testing.T) {
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
					tc.run(t, svc, sh.build(guard.RequireToken(svc, "checkout"), &runs), &runs)
				})
			}
		})
	}
}

func TestRequireTokenSubjectAndErrorHandler(t *testing.T) {
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			svc := newService(t)
			ctx := context.Background()
			var reason error
			mw := guard.RequireToken(svc, "checkout",
				guard.WithSubject(func(r *http.Request) string { return r.Header.Get("X-User") }),
				guard.WithErrorHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					reason = guard.FailureReason(r)
					w.WriteHeader(problem.For(reason).Status)
					_, _ = w.Write([]byte("<p>Please reload the form.</p>"))
				})))
			var runs atomic.Int64
			h := sh.build(mw, &runs)
			is, _ := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout", Subject: "alice"})

			req := httptest.NewRequest(http.MethodPost, "/orders", nil)
			req.Header.Set(token.Header, is.Token)
			req.Header.Set("X-User", "mallory")
			rec := serve(h, req)
			if rec.Code != http.StatusForbidden || !errors.Is(reason, token.ErrSubjectMismatch) || !strings.Contains(rec.Body.String(), "reload") {
				t.Fatalf("other user = %d %q, reason %v", rec.Code, rec.Body, reason)
			}

			req.Header.Set("X-User", "alice")
			rec = serve(h, req)
			if rec.Code != http.StatusCreated || runs.Load() != 1 {
				t.Fatalf("bound user = %d %s", rec.Code, rec.Body)
			}
		})
	}
}

// TestRequireTokenFormBody checks how RequireToken treats the body: it
// reads a tokenless request's body, within WithMaxBody, to find the form
// field, and hands it on unread; a request with the header token keeps
// its body unread whatever its size; a form a handler before parsed is
// looked up where that handler left it.
func TestRequireTokenFormBody(t *testing.T) {
	form := func(tok string) string {
		return url.Values{token.FormField: {tok}, "item": {"book"}, "note": {strings.Repeat("n", 100)}}.Encode()
	}
	tests := []struct {
		name       string
		header     bool // the token in the Idempotency-Token header
		parsed     bool // a handler before RequireToken parsed the form
		body       func(tok string) string
		ctype      string
		maxBody    int64 // WithMaxBody; 0 leaves the default
		wantStatus int
		wantCode   string
		wantItem   string // the item the handler parsed from the body
		wantRuns   int64
	}{
		{"the form the token came from reaches the handler whole", false, false, form, "application/x-www-form-urlencoded", 0, 201, "", "book", 1},
		{"a form over the limit is 413 and the token is not looked for", false, false, form, "application/x-www-form-urlencoded", 64, 413, "payload_too_large", "", 0},
		{"a header token leaves a body over the limit alone", true, false, form, "application/x-www-form-urlencoded", 64, 201, "", "book", 1},
		{"a JSON body has no form field: 400", false, false, func(string) string { return `{"item":"book"}` }, "application/json", 0, 400, "invalid_request", "", 0},
		{"a form a handler before parsed still carries the token", false, true, form, "application/x-www-form-urlencoded", 0, 201, "", "book", 1},
		{"a parsed form without the field is 400", false, true, func(string) string { return "item=book" }, "application/x-www-form-urlencoded", 0, 400, "invalid_request", "", 0},
	}
	for _, sh := range shapes {
		for _, tc := range tests {
			t.Run(sh.name+"/"+tc.name, func(t *testing.T) {
				svc := newService(t)
				is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
				if err != nil {
					t.Fatal(err)
				}
				var item atomic.Value
				var runs atomic.Int64
				next := func(next http.Handler) http.Handler {
					return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
						item.Store(r.PostFormValue("item"))
						next.ServeHTTP(w, r)
					})
				}
				mw := guard.RequireToken(svc, "checkout", guard.WithMaxBody(tc.maxBody))
				h := sh.build(func(h http.Handler) http.Handler { return mw(next(h)) }, &runs)
				req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(tc.body(is.Token)))
				req.Header.Set("Content-Type", tc.ctype)
				if tc.header {
					req.Header.Set(token.Header, is.Token)
				}
				if tc.parsed {
					if err := req.ParseForm(); err != nil {
						t.Fatal(err)
					}
				}
				rec := serve(h, req)
				got, _ := item.Load().(string)
				if rec.Code != tc.wantStatus || codeOf(rec) != tc.wantCode || got != tc.wantItem || runs.Load() != tc.wantRuns {
					t.Fatalf("got %d %q item %q runs %d; want %d %q item %q runs %d (%s)",
						rec.Code, codeOf(rec), got, runs.Load(), tc.wantStatus, tc.wantCode, tc.wantItem, tc.wantRuns, rec.Body)
				}
			})
		}
	}
	t.Run("the body is handed on unread", func(t *testing.T) {
		svc := newService(t)
		is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
		if err != nil {
			t.Fatal(err)
		}
		body := form(is.Token)
		var got string
		h := guard.RequireToken(svc, "checkout")(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got = string(b)
		}))
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if rec := serve(h, req); rec.Code != http.StatusOK || got != body {
			t.Fatalf("= %d, the handler read %q, want %q", rec.Code, got, body)
		}
	})
}

func TestHiddenFieldEscapes(t *testing.T) {
	got := string(guard.HiddenField(`"><script>`))
	want := `<input type="hidden" name="idempotency_token" value="&#34;&gt;&lt;script&gt;">`
	if got != want {
		t.Fatalf("HiddenField = %s, want %s", got, want)
	}
}

func TestField(t *testing.T) {
	tests := []struct {
		name    string
		opts    []guard.Option
		subject string // the subject the rendered token must redeem for
	}{
		{"an unbound token", nil, ""},
		{"bound to the request's subject with WithSubject", []guard.Option{guard.WithSubject(func(r *http.Request) string { return r.Header.Get("X-User") })}, "alice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := newService(t)
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set("X-User", "alice")
			field, err := guard.Field(req, svc, "checkout", tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			s := string(field)
			i := strings.Index(s, `value="`)
			tok := s[i+len(`value="`) : len(s)-2]
			if _, err := svc.Redeem(context.Background(), tok, "checkout", tc.subject); err != nil {
				t.Fatalf("rendered token does not redeem: %v (%s)", err, s)
			}
		})
	}
}
