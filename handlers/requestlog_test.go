package handlers_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/internal/logjson"
	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// failingRedeems fails every token redemption with err, which wraps
// store.ErrUnavailable whatever its message.
type failingRedeems struct {
	store.Store
	err error
}

func (f failingRedeems) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, f.err
}

// silentUnavailable is a store failure whose message is empty.
type silentUnavailable struct{}

func (silentUnavailable) Error() string        { return "" }
func (silentUnavailable) Is(target error) bool { return target == store.ErrUnavailable }

// TestRequestLogNamesTheCauseOf5xx: a 503 problem says nothing about the
// store (its address stays out of answers), so the request's log line is
// where an operator finds the cause, as "error" with the error's text even
// when that text is empty; 4xx lines carry no error. The server's handler
// (logjson, which takes the line without a slog.Record) and any other
// slog handler write the same field.
func TestRequestLogNamesTheCauseOf5xx(t *testing.T) {
	for _, h := range []struct {
		name string
		new  func(io.Writer) slog.Handler
	}{
		{"logjson.Handler", func(w io.Writer) slog.Handler { return logjson.NewHandler(w, nil) }},
		{"slog.JSONHandler", func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }},
	} {
		for _, tc := range []struct {
			name, target string
			storeErr     error
			status       int
			wantField    bool // the line has "error"
			wantError    string
		}{
			{"store down on redeem", "/v1/tokens/redeem", store.Unavailable("redeem", errStoreDown), http.StatusServiceUnavailable, true, errStoreDown.Error()},
			{"store down on forward-auth", handlers.ForwardAuthPath, store.Unavailable("redeem", errStoreDown), http.StatusServiceUnavailable, true, errStoreDown.Error()},
			{"a store error with an empty message is still logged", "/v1/tokens/redeem", silentUnavailable{}, http.StatusServiceUnavailable, true, ""},
			{"a refusal is not an error", "/v1/tokens/redeem?purpose=" + strings.Repeat("x", 100), errStoreDown, http.StatusBadRequest, false, ""},
		} {
			t.Run(h.name+"/"+tc.name, func(t *testing.T) {
				mem := memory.New()
				t.Cleanup(func() { _ = mem.Close() })
				svc, err := token.New(failingRedeems{mem, tc.storeErr}, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(9))
				if err != nil {
					t.Fatal(err)
				}
				is, err := svc.Issue(t.Context(), token.IssueRequest{})
				if err != nil {
					t.Fatal(err)
				}
				var logs testenv.LockedBuffer
				e, err := handlers.New(svc, handlers.WithLogger(slog.New(h.new(&logs)))).Engine()
				if err != nil {
					t.Fatal(err)
				}
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
				line := logs.Bytes()
				var rec map[string]any
				if err := json.Unmarshal(line, &rec); err != nil {
					t.Fatalf("log = %q: %v", line, err)
				}
				got, ok := rec["error"]
				if ok != tc.wantField || (ok && !strings.Contains(got.(string), tc.wantError)) {
					t.Fatalf("log error = %q (present %v), want %q (present %v)", got, ok, tc.wantError, tc.wantField)
				}
			})
		}
	}
}
