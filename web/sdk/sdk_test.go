package sdk_test

import (
	"crypto/sha512"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/web/sdk"
)

func get(t *testing.T, path string, hdr map[string]string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	sdk.Handler().ServeHTTP(rec, req)
	return rec.Result()
}

func TestServedFiles(t *testing.T) {
	tests := []struct {
		path, file, contentType string
	}{
		{sdk.ScriptPath, "replayguard.js", "text/javascript; charset=utf-8"},
		{sdk.ModulePath, "replayguard.mjs", "text/javascript; charset=utf-8"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			res := get(t, tc.path, nil)
			body, _ := io.ReadAll(res.Body)
			want, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != 200 || string(body) != string(want) {
				t.Fatalf("status %d, body matches file: %v", res.StatusCode, string(body) == string(want))
			}
			for k, v := range map[string]string{
				"Content-Type":                tc.contentType,
				"Cache-Control":               "public, max-age=86400",
				"Access-Control-Allow-Origin": "*",
			} {
				if got := res.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			etag := res.Header.Get("ETag")
			if !regexp.MustCompile(`^"[0-9a-f]{32}"$`).MatchString(etag) {
				t.Fatalf("ETag = %q", etag)
			}
			for _, inm := range []string{etag, "W/" + etag, `"other", ` + etag, "*"} {
				if res := get(t, tc.path, map[string]string{"If-None-Match": inm}); res.StatusCode != http.StatusNotModified || res.Header.Get("ETag") != etag {
					t.Errorf("If-None-Match %s: status %d", inm, res.StatusCode)
				}
			}
			if res := get(t, tc.path, map[string]string{"If-None-Match": `"stale"`}); res.StatusCode != 200 {
				t.Errorf("stale If-None-Match: status %d", res.StatusCode)
			}
		})
	}
}

func TestSRI(t *testing.T) {
	src, err := os.ReadFile("replayguard.js")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha512.Sum384(src)
	want := "sha384-" + base64.StdEncoding.EncodeToString(sum[:])
	if sdk.SRI != want {
		t.Fatalf("SRI = %s, want %s", sdk.SRI, want)
	}
	res := get(t, sdk.SRIPath, nil)
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") || strings.TrimSuffix(string(body), "\n") != want {
		t.Fatalf("SRI endpoint: %d %q %q", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), want) {
		t.Fatalf("README.md does not print the current SRI hash %s", want)
	}
}

func TestUnknownPathAndMethod(t *testing.T) {
	if res := get(t, "/sdk/other.js", nil); res.StatusCode != 404 {
		t.Fatalf("unknown path: %d", res.StatusCode)
	}
	rec := httptest.NewRecorder()
	sdk.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, sdk.ScriptPath, nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", rec.Code)
	}
}
