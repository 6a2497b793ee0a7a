package handlers_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// lockedBuffer is a bytes.Buffer safe for the logger and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// TestRequestLogNamesTheCauseOf5xx: a 503 problem says nothing about the
// store (its address stays out of answers), so the request's log line is
// where an operator finds the cause; 4xx lines carry no error.
func TestRequestLogNamesTheCauseOf5xx(t *testing.T) {
	mem := memory.New()
	t.Cleanup(func() { _ = mem.Close() })
	svc, err := token.New(brokenRedeems{mem}, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(9))
	if err != nil {
		t.Fatal(err)
	}
	is, err := svc.Issue(t.Context(), token.IssueRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	e, err := handlers.New(svc, handlers.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil)))).Engine()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, target string
		status       int
		wantError    string
	}{
		{"store down on redeem", "/v1/tokens/redeem", http.StatusServiceUnavailable, errStoreDown.Error()},
		{"store down on forward-auth", handlers.ForwardAuthPath, http.StatusServiceUnavailable, errStoreDown.Error()},
		{"a refusal is not an error", "/v1/tokens/redeem?purpose=" + strings.Repeat("x", 100), http.StatusBadRequest, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs.mu.Lock()
			logs.b.Reset()
			logs.mu.Unlock()
			req := httptest.NewRequest(http.MethodPost, tc.target, nil)
			req.Header.Set(token.Header, is.Token)
			w := httptest.NewRecorder()
			e.ServeHTTP(w, req)
			if w.Code != tc.status {
				t.Fatalf("status = %d %s, want %d", w.Code, w.Body, tc.status)
			}
			if strings.Contains(w.Body.String(), "10.9.8.7") {
				t.Fatalf("the answer reveals the store's address: %s", w.Body)
			}
			logs.mu.Lock()
			line := logs.b.Bytes()
			logs.mu.Unlock()
			var rec map[string]any
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Fatalf("log = %q: %v", line, err)
			}
			if got, _ := rec["error"].(string); !strings.Contains(got, tc.wantError) || (tc.wantError == "") != (got == "") {
				t.Fatalf("log error = %q, want %q", got, tc.wantError)
			}
		})
	}
}
