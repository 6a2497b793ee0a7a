package handlers_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

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
		req.Header.Set(token.Header, issued.Token)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, summary(w))
	}
	// Output:
	// 201 checkout 600 no-store
	// 200 {"status":"redeemed","purpose":"checkout"}
	// 409 problem token_used
}

// summary condenses a response for the examples: the problem code of a
// problem+json answer, the status and purpose of a redeem answer (its ID
// changes on every run), else the body.
func summary(w *httptest.ResponseRecorder) string {
	switch w.Header().Get("Content-Type") {
	case "application/problem+json":
		var p problem.Problem
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
