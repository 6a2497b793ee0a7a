package sdk_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
	"github.com/replayguard/replayguard/web/sdk"
)

// wireBudget is the most the minified script may weigh on the wire, gzipped
// or Brotli-compressed.
const wireBudget = 3 << 10

// request sends method path with the header lines hdr ("Name: value", one
// line each, repeats allowed) to the Handler.
func request(t *testing.T, method, p string, hdr ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, p, nil)
	for _, h := range hdr {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			t.Fatalf("bad header line %q", h)
		}
		req.Header.Add(k, strings.TrimSpace(v))
	}
	rec := httptest.NewRecorder()
	sdk.Handler().ServeHTTP(rec, req)
	return rec.Result()
}

func get(t *testing.T, p string, hdr ...string) *http.Response {
	t.Helper()
	return request(t, http.MethodGet, p, hdr...)
}

func body(t *testing.T, res *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// served describes a path: the file whose bytes it serves and the
// compressed file, if any, committed for Brotli (Go has no Brotli decoder
// in the standard library; build.mjs --check decodes it).
var served = []struct {
	path, file, br, contentType string
}{
	{sdk.ScriptPath, "dist/replayguard.min.js", "dist/replayguard.min.js.br", "text/javascript; charset=utf-8"},
	{sdk.ModulePath, "replayguard.mjs", "", "text/javascript; charset=utf-8"},
	{sdk.SourcePath, "replayguard.js", "", "text/javascript; charset=utf-8"},
	{sdk.SourceMapPath, "dist/replayguard.min.js.map", "", "application/json; charset=utf-8"},
}

func TestPaths(t *testing.T) {
	want := []string{sdk.SRIPath}
	for _, s := range served {
		want = append(want, s.path)
	}
	got := sdk.Paths()
	if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Fatalf("Paths() = %v, want %v", got, want)
	}
	for _, p := range got {
		if res := get(t, p); res.StatusCode != 200 {
			t.Errorf("GET %s: %d", p, res.StatusCode)
		}
	}
}

// TestRepresentations checks every path in every content coding: the
// decoded bytes are the file's, the headers describe the bytes sent, and
// each representation has its own ETag.
func TestRepresentations(t *testing.T) {
	etagRE := regexp.MustCompile(`^"[0-9a-f]{32}(-gzip|-br)?"$`)
	for _, s := range served {
		t.Run(s.path, func(t *testing.T) {
			want := readFile(t, s.file)
			codings := []string{"", "gzip"}
			if s.br != "" {
				codings = append(codings, "br")
			}
			etags := map[string]string{}
			for _, coding := range codings {
				ae := coding
				if ae == "" {
					ae = "identity"
				}
				res := get(t, s.path, "Accept-Encoding: "+ae)
				b := body(t, res)
				if res.StatusCode != 200 {
					t.Fatalf("%s: status %d", ae, res.StatusCode)
				}
				if got := res.Header.Get("Content-Encoding"); got != coding {
					t.Errorf("%s: Content-Encoding %q", ae, got)
				}
				if got := res.Header.Get("Content-Length"); got != fmt.Sprint(len(b)) {
					t.Errorf("%s: Content-Length %s for %d bytes", ae, got, len(b))
				}
				var decoded []byte
				switch coding {
				case "":
					decoded = b
				case "gzip":
					decoded = gunzip(t, b)
				case "br":
					if !bytes.Equal(b, readFile(t, s.br)) {
						t.Errorf("br: body is not %s", s.br)
					}
					decoded = want // build.mjs --check proves the .br decodes to the file
				}
				if !bytes.Equal(decoded, want) {
					t.Errorf("%s: decoded body is not %s", ae, s.file)
				}
				if coding != "" && len(b) >= len(want) {
					t.Errorf("%s: %d bytes, no smaller than identity's %d", ae, len(b), len(want))
				}
				for k, v := range map[string]string{
					"Content-Type":                s.contentType,
					"Cache-Control":               "public, max-age=86400",
					"Access-Control-Allow-Origin": "*",
					"X-Content-Type-Options":      "nosniff",
					"Vary":                        "Accept-Encoding",
				} {
					if got := res.Header.Get(k); got != v {
						t.Errorf("%s: %s = %q, want %q", ae, k, got, v)
					}
				}
				etag := res.Header.Get("ETag")
				if !etagRE.MatchString(etag) {
					t.Errorf("%s: ETag = %q", ae, etag)
				}
				for c, e := range etags {
					if e == etag {
						t.Errorf("%s and %s share the ETag %s", ae, c, etag)
					}
				}
				etags[ae] = etag

				head := request(t, http.MethodHead, s.path, "Accept-Encoding: "+ae)
				if hb := body(t, head); head.StatusCode != 200 || len(hb) != 0 {
					t.Errorf("HEAD %s: status %d, %d body bytes", ae, head.StatusCode, len(hb))
				}
				for _, k := range []string{"Content-Type", "Content-Encoding", "Content-Length", "ETag", "Vary", "Cache-Control"} {
					if head.Header.Get(k) != res.Header.Get(k) {
						t.Errorf("HEAD %s: %s = %q, GET has %q", ae, k, head.Header.Get(k), res.Header.Get(k))
					}
				}
			}
		})
	}
}

// TestNegotiation checks which representation an Accept-Encoding gets
// (RFC 9110 §12.5.3).
func TestNegotiation(t *testing.T) {
	tests := []struct {
		name   string
		hdr    []string // Accept-Encoding lines; nil: none sent
		script string   // coding for the script (br, gzip, identity)
		module string   // for the module entry (gzip, identity)
	}{
		{"no Accept-Encoding", nil, "", ""},
		{"empty: identity only", []string{""}, "", ""},
		{"gzip", []string{"gzip"}, "gzip", "gzip"},
		{"br", []string{"br"}, "br", ""},
		{"Chromium's", []string{"gzip, deflate, br, zstd"}, "br", "gzip"},
		{"equal qvalues: the smallest", []string{"gzip, br"}, "br", "gzip"},
		{"case-insensitive", []string{"GZip"}, "gzip", "gzip"},
		{"x-gzip is gzip", []string{"x-gzip"}, "gzip", "gzip"},
		{"higher qvalue wins", []string{"gzip;q=1, br;q=0.5"}, "gzip", "gzip"},
		{"spaces around parameters", []string{"br ; q=0.2 , gzip ; q=0.3, identity ;q=0.1"}, "gzip", "gzip"},
		{"identity is 1 unless named", []string{"gzip;q=0.9, br;q=0.8"}, "", ""},
		{"br refused", []string{"br;q=0, gzip"}, "gzip", "gzip"},
		{"br refused alone", []string{"br;q=0"}, "", ""},
		{"both refused", []string{"gzip;q=0, br;q=0.000"}, "", ""},
		{"identity preferred", []string{"gzip;q=0.4, identity;q=0.5"}, "", ""},
		{"identity less preferred", []string{"gzip;q=0.5, identity;q=0.4"}, "gzip", "gzip"},
		{"identity refused", []string{"identity;q=0, gzip"}, "gzip", "gzip"},
		{"identity", []string{"identity"}, "", ""},
		{"star", []string{"*"}, "br", "gzip"},
		{"star below gzip", []string{"*;q=0.1, gzip"}, "gzip", "gzip"},
		{"star but br", []string{"br;q=0, *"}, "gzip", "gzip"},
		{"star refused, gzip named", []string{"*;q=0, gzip"}, "gzip", "gzip"},
		{"nothing acceptable: the field is disregarded", []string{"*;q=0"}, "", ""},
		{"identity refused, nothing on offer: disregarded", []string{"identity;q=0, zstd"}, "", ""},
		{"unknown codings", []string{"zstd, deflate, compress"}, "", ""},
		{"malformed qvalue: element ignored", []string{"gzip;q=2, br;q=abc"}, "", ""},
		{"malformed qvalue beside a good one", []string{"gzip, br;q=1.0001"}, "gzip", "gzip"},
		{"several lines", []string{"br;q=0", "gzip"}, "gzip", "gzip"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for p, want := range map[string]string{sdk.ScriptPath: tc.script, sdk.ModulePath: tc.module} {
				req := httptest.NewRequest(http.MethodGet, p, nil)
				if tc.hdr != nil {
					req.Header["Accept-Encoding"] = tc.hdr
				}
				rec := httptest.NewRecorder()
				sdk.Handler().ServeHTTP(rec, req)
				if got := rec.Header().Get("Content-Encoding"); rec.Code != 200 || got != want {
					t.Errorf("%s: %d, Content-Encoding %q, want %q", p, rec.Code, got, want)
				}
				if got := rec.Header().Get("Content-Length"); got != fmt.Sprint(rec.Body.Len()) {
					t.Errorf("%s: Content-Length %s for %d bytes", p, got, rec.Body.Len())
				}
			}
		})
	}
}

// TestConditional checks If-None-Match against the representation the
// request negotiates, and only that one.
func TestConditional(t *testing.T) {
	for _, p := range []string{sdk.ScriptPath, sdk.ModulePath, sdk.SourcePath, sdk.SourceMapPath} {
		t.Run(p, func(t *testing.T) {
			etag := map[string]string{}
			for _, ae := range []string{"identity", "gzip", "br"} {
				etag[ae] = get(t, p, "Accept-Encoding: "+ae).Header.Get("ETag")
			}
			for ae, tag := range etag {
				for _, inm := range []string{tag, "W/" + tag, `"other", ` + tag, "*"} {
					res := get(t, p, "Accept-Encoding: "+ae, "If-None-Match: "+inm)
					if res.StatusCode != http.StatusNotModified || res.Header.Get("ETag") != tag || res.Header.Get("Vary") != "Accept-Encoding" {
						t.Errorf("%s, If-None-Match %s: %d, ETag %q, Vary %q", ae, inm, res.StatusCode, res.Header.Get("ETag"), res.Header.Get("Vary"))
					}
					if b := body(t, res); len(b) != 0 {
						t.Errorf("%s, If-None-Match %s: 304 with %d body bytes", ae, inm, len(b))
					}
				}
				if res := request(t, http.MethodHead, p, "Accept-Encoding: "+ae, "If-None-Match: "+tag); res.StatusCode != http.StatusNotModified {
					t.Errorf("HEAD %s, If-None-Match its ETag: %d", ae, res.StatusCode)
				}
				// Another representation's ETag is not this one's.
				for other, otherTag := range etag {
					if otherTag == tag {
						continue
					}
					res := get(t, p, "Accept-Encoding: "+ae, "If-None-Match: "+otherTag)
					if res.StatusCode != 200 || res.Header.Get("ETag") != tag {
						t.Errorf("%s with the ETag of %s: %d, ETag %q", ae, other, res.StatusCode, res.Header.Get("ETag"))
					}
				}
				if res := get(t, p, "Accept-Encoding: "+ae, `If-None-Match: "stale"`); res.StatusCode != 200 {
					t.Errorf("%s, stale If-None-Match: %d", ae, res.StatusCode)
				}
			}
		})
	}
}

func sri(b []byte) string {
	sum := sha512.Sum384(b)
	return "sha384-" + base64.StdEncoding.EncodeToString(sum[:])
}

func TestSRI(t *testing.T) {
	want := sri(readFile(t, "dist/replayguard.min.js"))
	if sdk.SRI != want {
		t.Fatalf("SRI = %s, want the minified script's %s", sdk.SRI, want)
	}
	if !bytes.Equal(sdk.Script(), readFile(t, "dist/replayguard.min.js")) {
		t.Fatal("Script() is not dist/replayguard.min.js")
	}
	// SRI is over the decoded bytes: every coding of the script has this hash.
	for _, ae := range []string{"identity", "gzip"} {
		res := get(t, sdk.ScriptPath, "Accept-Encoding: "+ae)
		b := body(t, res)
		if res.Header.Get("Content-Encoding") == "gzip" {
			b = gunzip(t, b)
		}
		if sri(b) != want {
			t.Errorf("%s: the decoded script does not have the SRI hash", ae)
		}
	}
	res := get(t, sdk.SRIPath, "Accept-Encoding: gzip, br")
	b := body(t, res)
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/plain; charset=utf-8" || string(b) != want+"\n" ||
		res.Header.Get("Content-Encoding") != "" || res.Header.Get("Vary") != "" || res.Header.Get("Content-Length") != fmt.Sprint(len(b)) {
		t.Fatalf("SRI endpoint: %d %v %q", res.StatusCode, res.Header, b)
	}
	readme := string(readFile(t, "../../README.md"))
	if !strings.Contains(readme, `<script src="/sdk/replayguard.js"
        integrity="`+want+`"`) {
		t.Fatalf("README.md's SDK snippet does not load /sdk/replayguard.js with the current SRI hash %s", want)
	}
}

// TestWireSize checks the budget and the sizes README.md quotes, as the
// Handler serves them.
func TestWireSize(t *testing.T) {
	size := map[string]int{}
	for _, ae := range []string{"identity", "gzip", "br"} {
		size[ae] = len(body(t, get(t, sdk.ScriptPath, "Accept-Encoding: "+ae)))
	}
	size["source"] = len(body(t, get(t, sdk.SourcePath, "Accept-Encoding: identity")))
	for _, ae := range []string{"gzip", "br"} {
		if size[ae] > wireBudget {
			t.Errorf("the script is %d bytes with %s, over the budget of %d", size[ae], ae, wireBudget)
		}
	}
	table := fmt.Sprintf(`| Representation | Bytes |
|---|---:|
| readable source, `+"`/sdk/replayguard.src.js`"+` | %d |
| minified, `+"`/sdk/replayguard.js`"+` | %d |
| minified, `+"`Content-Encoding: gzip`"+` | **%d** |
| minified, `+"`Content-Encoding: br`"+` | **%d** |
`, size["source"], size["identity"], size["gzip"], size["br"])
	if readme := string(readFile(t, "../../README.md")); !strings.Contains(readme, table) {
		t.Fatalf("README.md must quote the sizes served, in this table:\n%s", table)
	}
}

// TestSourceMap checks that the minified script names its map, the map
// names the readable source by the path that serves it, and the source it
// was built from is the current one: a change to replayguard.js without
// npm run build fails here, without Node.
func TestSourceMap(t *testing.T) {
	script := string(sdk.Script())
	m := regexp.MustCompile(`\n//# sourceMappingURL=([^\s]+)\n$`).FindStringSubmatch(script)
	if m == nil {
		t.Fatal("the minified script does not end with a sourceMappingURL comment")
	}
	if p := path.Join(path.Dir(sdk.ScriptPath), m[1]); p != sdk.SourceMapPath {
		t.Fatalf("the script's source map resolves to %s, served at %s", p, sdk.SourceMapPath)
	}
	var sm struct {
		Version        int      `json:"version"`
		Sources        []string `json:"sources"`
		SourcesContent []string `json:"sourcesContent"`
	}
	if err := json.Unmarshal(body(t, get(t, sdk.SourceMapPath)), &sm); err != nil {
		t.Fatal(err)
	}
	if sm.Version != 3 || len(sm.Sources) != 1 || len(sm.SourcesContent) != 1 {
		t.Fatalf("source map: version %d, sources %v, %d sourcesContent", sm.Version, sm.Sources, len(sm.SourcesContent))
	}
	if p := path.Join(path.Dir(sdk.SourceMapPath), sm.Sources[0]); p != sdk.SourcePath {
		t.Fatalf("the map's source resolves to %s; the readable source is served at %s", p, sdk.SourcePath)
	}
	if sm.SourcesContent[0] != string(readFile(t, "replayguard.js")) {
		t.Fatal("dist/ was built from another replayguard.js: run npm run build in web/sdk and commit dist/")
	}
}

// TestBuildIsCurrent runs build.mjs --check: dist/ must be exactly what the
// pinned esbuild makes of the current source, and the .br must decode to
// the script. Without node or web/sdk/node_modules it skips, unless
// REPLAYGUARD_TEST_REQUIRE=1 or CI=true.
func TestBuildIsCurrent(t *testing.T) {
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join("node_modules", "esbuild", "package.json"))
	}
	if err != nil {
		testenv.Missing(t, "the build check needs node and web/sdk/node_modules (run npm ci in web/sdk): "+err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, node, "build.mjs", "--check").CombinedOutput()
	if err != nil {
		t.Fatalf("node build.mjs --check: %v\n%s", err, out)
	}
}

func TestUnknownPathAndMethod(t *testing.T) {
	if res := get(t, "/sdk/other.js"); res.StatusCode != 404 {
		t.Fatalf("unknown path: %d", res.StatusCode)
	}
	for _, p := range sdk.Paths() {
		res := request(t, http.MethodPost, p)
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("POST %s: %d, Allow %q", p, res.StatusCode, res.Header.Get("Allow"))
		}
	}
}
