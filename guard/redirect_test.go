package guard_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/guard"
)

func TestSeeOther(t *testing.T) {
	cases := []struct {
		name         string
		method       string
		path         string // the request's path
		url          string // SeeOther's argument
		wantLocation string
		wantBody     bool
	}{
		{"a POST is sent to an absolute path, with no body", http.MethodPost, "/orders", "/orders/42", "/orders/42", false},
		{"a query string is kept", http.MethodPost, "/orders", "/orders/42?new=1", "/orders/42?new=1", false},
		{"a relative path is resolved against the request's path", http.MethodPost, "/shop/orders", "orders/42", "/shop/orders/42", false},
		{"an absolute URL is kept as it is", http.MethodPost, "/orders", "https://shop.example/orders/42", "https://shop.example/orders/42", false},
		{"a GET gets the short HTML body http.Redirect writes", http.MethodGet, "/orders", "/orders/42", "/orders/42", true},
	}
	shapes := []struct {
		name  string
		serve func(w http.ResponseWriter, r *http.Request, url string)
	}{
		{"net/http", func(w http.ResponseWriter, r *http.Request, url string) {
			guard.SeeOther(w, r, url)
		}},
		{"gin", func(w http.ResponseWriter, r *http.Request, url string) {
			e := gin.New()
			e.Any("/*path", func(c *gin.Context) { guard.SeeOther(c.Writer, c.Request, url) })
			e.ServeHTTP(w, r)
		}},
	}
	for _, s := range shapes {
		for _, c := range cases {
			t.Run(s.name+": "+c.name, func(t *testing.T) {
				w := httptest.NewRecorder()
				s.serve(w, httptest.NewRequest(c.method, c.path, strings.NewReader("item=tea")), c.url)

				if w.Code != http.StatusSeeOther {
					t.Errorf("status = %d, want 303", w.Code)
				}
				if got := w.Header().Get("Location"); got != c.wantLocation {
					t.Errorf("Location = %q, want %q", got, c.wantLocation)
				}
				if got := w.Header().Get("Cache-Control"); got != "no-store" {
					t.Errorf("Cache-Control = %q, want no-store", got)
				}
				if gotBody := w.Body.Len() > 0; gotBody != c.wantBody {
					t.Errorf("body = %q, want a body: %v", w.Body, c.wantBody)
				}
			})
		}
	}
}

// A protected POST handler answers with 303 See Other to the page that shows
// what it did.
func ExampleSeeOther() {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/orders", func(c *gin.Context) {
		id := 42 // the order this request created
		guard.SeeOther(c.Writer, c.Request, fmt.Sprintf("/orders/%d", id))
	})

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/orders", nil))
	fmt.Println(w.Code, w.Header().Get("Location"))
	// Output: 303 /orders/42
}
