package main

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/store/memory"
)

var hiddenField = regexp.MustCompile(`name="idempotency_token" value="([^"]+)"`)

// formToken renders the form page and returns the token in its hidden field.
func formToken(t *testing.T, h http.Handler) string {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("GET / = %d, want 200; body: %s", w.Code, w.Body)
	}
	m := hiddenField.FindStringSubmatch(w.Body.String())
	if m == nil {
		t.Fatalf("GET / has no hidden token field; body: %s", w.Body)
	}
	return m[1]
}

func post(h http.Handler, form url.Values) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/comments", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func TestFormIsPostedOnce(t *testing.T) {
	st := memory.New()
	defer st.Close()
	h, err := newApp(st, "")
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"idempotency_token": {formToken(t, h)}, "text": {"hello"}}

	steps := []struct {
		name     string
		wantCode int
		wantBody string
	}{
		{"first post is accepted", http.StatusOK, "your comment was posted"},
		{"the same form posted again is refused", http.StatusConflict, "already posted"},
	}
	for _, s := range steps {
		w := post(h, form)
		if w.Code != s.wantCode || !strings.Contains(w.Body.String(), s.wantBody) {
			t.Errorf("%s: got %d %q, want %d containing %q", s.name, w.Code, w.Body, s.wantCode, s.wantBody)
		}
	}

	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if n := strings.Count(w.Body.String(), "<li>hello</li>"); n != 1 {
		t.Errorf("the comment is listed %d times, want once", n)
	}
}

func TestRefusals(t *testing.T) {
	st := memory.New()
	defer st.Close()
	h, err := newApp(st, "")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		form     url.Values
		wantCode int
	}{
		{"a post without a token is refused", url.Values{"text": {"x"}}, http.StatusBadRequest},
		{"a forged token is refused", url.Values{"idempotency_token": {"a.b.c"}, "text": {"x"}}, http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if w := post(h, tt.form); w.Code != tt.wantCode {
				t.Errorf("got %d, want %d; body: %s", w.Code, tt.wantCode, w.Body)
			}
		})
	}
}

func TestSigningKeysFromEnvironmentFormat(t *testing.T) {
	st := memory.New()
	defer st.Close()
	if _, err := newApp(st, "k1:dG9vIHNob3J0"); err == nil {
		t.Error("a key shorter than 32 bytes was accepted")
	}
	if _, err := newApp(st, "k1:"+strings.Repeat("QUFB", 11)); err != nil {
		t.Errorf("a 33-byte key was refused: %v", err)
	}
}
