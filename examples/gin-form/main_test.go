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
func formToken(t *testing.T, app http.Handler) string {
	t.Helper()
	w := httptest.NewRecorder()
	app.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("GET / = %d, want 200; body: %s", w.Code, w.Body)
	}
	m := hiddenField.FindStringSubmatch(w.Body.String())
	if m == nil {
		t.Fatalf("GET / has no hidden token field; body: %s", w.Body)
	}
	return m[1]
}

func post(app http.Handler, form url.Values) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/comments", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	app.ServeHTTP(w, req)
	return w
}

func TestFormIsPostedOnce(t *testing.T) {
	st := memory.New()
	defer st.Close()
	app, err := newApp(st, "")
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"idempotency_token": {formToken(t, app)}, "text": {"hello"}}

	steps := []struct {
		name     string
		wantCode int
		wantBody string
	}{
		{"first post is accepted", http.StatusOK, "your comment was posted"},
		{"the same form posted again is refused", http.StatusConflict, "already posted"},
	}
	for _, s := range steps {
		w := post(app, form)
		if w.Code != s.wantCode || !strings.Contains(w.Body.String(), s.wantBody) {
			t.Errorf("%s: got %d %q, want %d containing %q", s.name, w.Code, w.Body, s.wantCode, s.wantBody)
		}
	}

	w := httptest.NewRecorder()
	app.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if n := strings.Count(w.Body.String(), "<li>hello</li>"); n != 1 {
		t.Errorf("the comment is listed %d times, want once", n)
	}
}

func TestFormWithoutTokenIsRefused(t *testing.T) {
	st := memory.New()
	defer st.Close()
	app, err := newApp(st, "")
	if err != nil {
		t.Fatal(err)
	}
	if w := post(app, url.Values{"text": {"no token"}}); w.Code != http.StatusBadRequest {
		t.Errorf("POST without a token = %d, want 400", w.Code)
	}
}

func TestTokenAPIIsMounted(t *testing.T) {
	st := memory.New()
	defer st.Close()
	app, err := newApp(st, "")
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	app.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/tokens?purpose=comment", nil))
	if w.Code != http.StatusCreated {
		t.Errorf("POST /v1/tokens = %d, want 201; body: %s", w.Code, w.Body)
	}
}
