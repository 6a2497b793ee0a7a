package sdk_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/replayguard/replayguard/web/sdk"
)

// Example serves the SDK on a net/http mux, as a page would load it.
func Example() {
	mux := http.NewServeMux()
	mux.Handle("GET /sdk/", sdk.Handler())

	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodGet, sdk.ScriptPath, nil))
	fmt.Println(w.Code, w.Header().Get("Content-Type"), strings.HasPrefix(sdk.SRI, "sha384-"))
	// Output:
	// 200 text/javascript; charset=utf-8 true
}
