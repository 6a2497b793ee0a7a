package main

import (
	"bytes"
	"crypto/rand"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/replayguard/replayguard/test/load/internal/fixture"
)

var invalidCode = []byte(`"code":"token_invalid"`)

// TestForgedAnswer checks the answer against what the load program's
// forged mode wants (401 with "code":"token_invalid") and against the
// header fields Replayguard writes on a forged token.
func TestForgedAnswer(t *testing.T) {
	h := newRouter(forgedAnswer())
	req := httptest.NewRequest(http.MethodPost, redeemPath, nil)
	req.Header.Set("Idempotency-Token", "eyJhbGciOiJIUzI1NiJ9.eyJ4IjoxfQ.AAAA")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("status = %d, want 401", w.Code)
	}
	body := w.Body.Bytes()
	if !bytes.Contains(body, invalidCode) || !bytes.Contains(body, []byte(`"request_id":"`+fixedRequestID+`"`)) {
		t.Fatalf("body %s: want code token_invalid and request_id %s", body, fixedRequestID)
	}
	tests := []struct{ name, value string }{
		{"Cache-Control", "no-store"},
		{"Content-Type", "application/problem+json"},
		{"X-Request-Id", fixedRequestID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := w.Header().Values(tt.name); !slices.Equal(got, []string{tt.value}) {
				t.Fatalf("%s = %q, want %q", tt.name, got, tt.value)
			}
		})
	}
	if n := len(w.Header()); n != len(tests) {
		t.Fatalf("answer has %d header fields (%v), want %d", n, w.Header(), len(tests))
	}
}

// forge signs a token shaped like Replayguard's (and like the load
// program's forged ones) with a random key no server holds.
func forge(t *testing.T, kid string) string {
	t.Helper()
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	now := time.Now()
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"jti": "4242424242", "iat": now.Add(-time.Second).Unix(), "exp": now.Add(time.Hour).Unix(), "pur": "default",
	})
	tok.Header["kid"] = kid
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSameAnswerAsReplayguard sends forged tokens over HTTP to
// Replayguard's own engine (handlers, on the memory store) and to
// bound401, and wants the same answer from both but for the Date and the
// request ID: status, header names and values, Content-Length and body.
func TestSameAnswerAsReplayguard(t *testing.T) {
	rg := fixture.Replayguard(t)
	bound := httptest.NewServer(newRouter(forgedAnswer()))
	t.Cleanup(bound.Close)

	tests := []struct{ name, tok string }{
		{"token with the server's kid signed with another key (the load program's)", forge(t, "load")},
		{"token with a kid the server does not know", forge(t, "other")},
		{"malformed token", "eyJhbGciOiJIUzI1NiJ9.eyJ4IjoxfQ.AAAA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, got := fixture.Post(t, rg.URL, redeemPath, tt.tok), fixture.Post(t, bound.URL, redeemPath, tt.tok)
			if want.Status != http.StatusUnauthorized || !bytes.Contains(want.Body, invalidCode) {
				t.Fatalf("Replayguard answered %d %s, want 401 token_invalid", want.Status, want.Body)
			}
			if got.Status != want.Status {
				t.Errorf("status = %d, Replayguard's %d", got.Status, want.Status)
			}
			id := want.Header.Get("X-Request-Id")
			if len(id) != len(fixedRequestID) {
				t.Errorf("Replayguard's request ID %q is not as long as fixedRequestID", id)
			}
			for _, name := range []string{"Date", "X-Request-Id"} {
				if len(got.Header.Values(name)) != 1 || len(want.Header.Values(name)) != 1 {
					t.Errorf("%s = %q, Replayguard's %q: want one each", name, got.Header.Values(name), want.Header.Values(name))
				}
			}
			wh, gh := want.Header.Clone(), got.Header.Clone()
			for _, h := range []http.Header{wh, gh} {
				h.Del("Date")
				h.Del("X-Request-Id")
			}
			if !maps.EqualFunc(gh, wh, slices.Equal[[]string]) {
				t.Errorf("header fields %v, Replayguard's %v", gh, wh)
			}
			if wb := bytes.ReplaceAll(want.Body, []byte(id), []byte(fixedRequestID)); !bytes.Equal(got.Body, wb) {
				t.Errorf("body\n%s\nReplayguard's (with its request ID replaced)\n%s", got.Body, wb)
			}
		})
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	addr, stop := fixture.Start(t, run)
	resp, err := http.Post("http://"+addr+redeemPath, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !bytes.Contains(body, invalidCode) {
		t.Fatalf("POST %s = %d %s, want 401 token_invalid", redeemPath, resp.StatusCode, body)
	}
	if err := stop(); err != nil {
		t.Fatalf("run after cancel = %v, want nil", err)
	}
}
