package handlers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// The Gin middleware lets a request through once per token; the replay is
// refused with 409 token_used before the handler runs.
func ExampleGuard_RequireToken() {
	gin.SetMode(gin.ReleaseMode) // no debug output
	// Real keys come from token.ParseKeys(os.Getenv("REPLAYGUARD_SIGNING_KEYS")).
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}

	guard := handlers.NewGuard(svc)
	r := gin.New()
	r.POST("/checkout", guard.RequireToken("checkout"), func(c *gin.Context) {
		c.String(http.StatusOK, "order placed")
	})

	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/checkout", nil)
		req.Header.Set(handlers.TokenHeader, is.Token)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, summary(w))
	}
	// Output:
	// 200 order placed
	// 409 problem token_used
}

// With WithTokenRecords, a double submit of a form is not refused: it gets
// the first submit's answer again, the same 303 to the same order page,
// marked Idempotent-Replayed. The order is placed once.
func ExampleWithTokenRecords() {
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New() // or a store/redis Store shared by every instance
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}
	keeper := idempotency.New(st) // 60s lease, 24h retention, 1 MiB bodies

	guard := handlers.NewGuard(svc, handlers.WithTokenRecords(keeper))
	orders := 0
	mux := http.NewServeMux()
	mux.Handle("POST /checkout", guard.RequireTokenHandler("checkout")(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			orders++
			http.Redirect(w, r, fmt.Sprintf("/orders/%d", orders), http.StatusSeeOther)
		})))

	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		fmt.Println(err)
		return
	}
	form := url.Values{handlers.TokenField: {is.Token}}.Encode()
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/checkout", strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Location"), "replayed:", w.Header().Get(handlers.IdempotentReplayedHeader) == "true")
	}
	fmt.Println("orders placed:", orders)
	// Output:
	// 303 /orders/1 replayed: false
	// 303 /orders/1 replayed: true
	// orders placed: 1
}

// The net/http middleware reads the token from the idempotency_token form
// field that HiddenField renders, so a plain HTML form is protected.
func ExampleGuard_RequireTokenHandler() {
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}

	guard := handlers.NewGuard(svc)
	mux := http.NewServeMux()
	mux.Handle("POST /comments", guard.RequireTokenHandler("comment")(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			claims, _ := handlers.TokenFrom(r.Context())
			fmt.Fprintf(w, "comment saved (purpose %s)", claims.Purpose)
		})))

	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "comment"})
	if err != nil {
		fmt.Println(err)
		return
	}
	form := url.Values{handlers.TokenField: {is.Token}, "text": {"first!"}}.Encode()
	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/comments", strings.NewReader(form))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		fmt.Println(w.Code, summary(w))
	}
	// Output:
	// 200 comment saved (purpose comment)
	// 409 problem token_used
}

// An HTML application renders its own page for a refused form with
// WithErrorHandler; FailureReason says why, and ProblemFor gives the status.
func ExampleWithErrorHandler() {
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}

	refused := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reason := handlers.FailureReason(r)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(handlers.ProblemFor(reason).Status)
		switch {
		case errors.Is(reason, token.ErrUsed):
			fmt.Fprint(w, "<p>This form was already sent.</p>")
		case errors.Is(reason, token.ErrExpired):
			fmt.Fprint(w, "<p>This form has expired; reload the page.</p>")
		default:
			fmt.Fprint(w, "<p>Please reload the page and try again.</p>")
		}
	})
	guard := handlers.NewGuard(svc, handlers.WithErrorHandler(refused))
	protected := guard.RequireTokenHandler("signup")(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "<p>Welcome!</p>") }))

	is, err := svc.Issue(context.Background(), token.IssueRequest{Purpose: "signup"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, tok := range []string{is.Token, is.Token, ""} {
		req := httptest.NewRequest(http.MethodPost, "/signup", nil)
		if tok != "" {
			req.Header.Set(handlers.TokenHeader, tok)
		}
		w := httptest.NewRecorder()
		protected.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String())
	}
	// Output:
	// 200 <p>Welcome!</p>
	// 409 <p>This form was already sent.</p>
	// 400 <p>Please reload the page and try again.</p>
}

// HiddenField renders the form input a no-JavaScript form carries; the
// value is HTML-escaped. Guard.Field issues a token and renders it in one
// call.
func ExampleHiddenField() {
	fmt.Println(handlers.HiddenField("eyJhbGciOi.eyJleHAiOj.L9sEhriC"))
	// Output:
	// <input type="hidden" name="idempotency_token" value="eyJhbGciOi.eyJleHAiOj.L9sEhriC">
}

// Mount adds the token API to an application's own Gin router: browsers
// (or the application's own pages) get tokens from POST /v1/tokens, and
// POST /v1/tokens/redeem redeems each exactly once.
func ExampleMount() {
	gin.SetMode(gin.ReleaseMode)
	keys := []token.Key{{ID: "2026-01", Secret: []byte("example only: 32 bytes or longer")}}
	st := memory.New()
	defer st.Close()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		fmt.Println(err)
		return
	}

	r := gin.New()
	handlers.Mount(r, svc, handlers.WithIssueRate(st, handlers.DefaultIssueRate))

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/tokens",
		strings.NewReader(`{"purpose":"checkout","ttl_seconds":600}`)))
	var issued struct {
		Token     string `json:"token"`
		Purpose   string `json:"purpose"`
		ExpiresIn int    `json:"expires_in"`
	}
	if err := json.NewDecoder(w.Body).Decode(&issued); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(w.Code, issued.Purpose, issued.ExpiresIn, w.Header().Get("Cache-Control"))

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/tokens/redeem", strings.NewReader(`{"purpose":"checkout"}`))
		req.Header.Set(handlers.TokenHeader, issued.Token)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, summary(w))
	}
	// Output:
	// 201 checkout 600 no-store
	// 200 {"status":"redeemed","purpose":"checkout"}
	// 409 problem token_used
}

// ProblemFor is the one table from errors to HTTP answers. A store that
// cannot confirm is 503 with a fixed detail: the store's own error never
// reaches the client.
func ExampleProblemFor() {
	for _, err := range []error{
		token.ErrUsed,
		fmt.Errorf("%w: dial tcp 10.0.0.7:6379: connection refused", token.ErrUnavailable),
	} {
		p := handlers.ProblemFor(err)
		fmt.Println(p.Status, p.Type)
		fmt.Printf("  detail: %q\n", p.Detail)
	}
	// Output:
	// 409 urn:replayguard:problem:token_used
	//   detail: "The token was already redeemed. Fetch a new token for a new request."
	// 503 urn:replayguard:problem:store_unavailable
	//   detail: "The store did not confirm the operation; nothing was done. Retry later."
}

// summary condenses a response for the examples: the problem code of a
// problem+json answer, the status and purpose of a redeem answer (its ID
// changes on every run), else the body.
func summary(w *httptest.ResponseRecorder) string {
	switch w.Header().Get("Content-Type") {
	case "application/problem+json":
		var p handlers.Problem
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			return err.Error()
		}
		return "problem " + p.Code
	case "application/json; charset=utf-8":
		var v struct {
			Status  string `json:"status"`
			Purpose string `json:"purpose"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
			return err.Error()
		}
		b, _ := json.Marshal(v)
		return string(b)
	}
	return w.Body.String()
}
