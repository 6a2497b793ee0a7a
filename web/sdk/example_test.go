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
	r := httptest.NewRequest(http.MethodGet, sdk.ScriptPath, nil)
	r.Header.Set("Accept-Encoding", "gzip, deflate, br, zstd")
	mux.ServeHTTP(w, r)
	fmt.Println(w.Code, w.Header().Get("Content-Type"), w.Header().Get("Content-Encoding"), strings.HasPrefix(sdk.SRI, "sha384-"))
	// Output:
	// 200 text/javascript; charset=utf-8 br true
}
