package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestApp(t *testing.T) {
	a := &app{}
	tests := []struct {
		name, method, path, body string
		want                     int
		wantLocation             string
		wantID                   float64
	}{
		{"a POST is the first execution", http.MethodPost, "/orders", `{"item":"x"}`, http.StatusCreated, "/orders/1", 1},
		{"a POST to any path is the next one", http.MethodPost, "/plain", "", http.StatusCreated, "/orders/2", 2},
		{"a body over 64 KiB is refused and not counted", http.MethodPost, "/orders", strings.Repeat("x", maxBody+1), http.StatusRequestEntityTooLarge, "", 0},
		{"GET is not an execution", http.MethodGet, "/orders", "", http.StatusMethodNotAllowed, "", 0},
		{"a POST after the refusals is the third", http.MethodPost, "/orders", "{}", http.StatusCreated, "/orders/3", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			a.ServeHTTP(w, httptest.NewRequest(tt.method, tt.path, strings.NewReader(tt.body)))
			if w.Code != tt.want || w.Header().Get("Location") != tt.wantLocation {
				t.Fatalf("%s %s = %d, Location %q; want %d, %q", tt.method, tt.path, w.Code, w.Header().Get("Location"), tt.want, tt.wantLocation)
			}
			if tt.want != http.StatusCreated {
				return
			}
			var got map[string]any
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got["id"] != tt.wantID {
				t.Fatalf("body %s (%v): want JSON with id %v", w.Body, err, tt.wantID)
			}
			if n := w.Body.Len(); n < 180 || n > 240 {
				t.Fatalf("body is %d bytes, want about 200", n)
			}
		})
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/_count", nil))
	if got := strings.TrimSpace(w.Body.String()); got != `{"executions":3}` {
		t.Fatalf("GET /_count = %s, want 3 executions", got)
	}
}
