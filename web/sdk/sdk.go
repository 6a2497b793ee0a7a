package sdk

import (
	"crypto/sha256"
	"crypto/sha512"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
)

//go:embed replayguard.js replayguard.mjs
var files embed.FS

// Paths the Handler serves.
const (
	ScriptPath = "/sdk/replayguard.js"
	ModulePath = "/sdk/replayguard.mjs"
	SRIPath    = "/sdk/replayguard.js.sri"
)

type asset struct {
	body        []byte
	contentType string
	etag        string
}

var assets = map[string]asset{}

// SRI is the Subresource Integrity hash of replayguard.js, "sha384-…",
// for <script integrity="…">.
var SRI string

func init() {
	for path, name := range map[string]string{ScriptPath: "replayguard.js", ModulePath: "replayguard.mjs"} {
		b, err := files.ReadFile(name)
		if err != nil {
			panic("sdk: embedded file missing: " + name) // a build defect, caught by every test
		}
		sum := sha256.Sum256(b)
		assets[path] = asset{b, "text/javascript; charset=utf-8", `"` + hex.EncodeToString(sum[:16]) + `"`}
	}
	sum := sha512.Sum384(assets[ScriptPath].body)
	SRI = "sha384-" + base64.StdEncoding.EncodeToString(sum[:])
	sri := []byte(SRI + "\n")
	s := sha256.Sum256(sri)
	assets[SRIPath] = asset{sri, "text/plain; charset=utf-8", `"` + hex.EncodeToString(s[:16]) + `"`}
}

// Script returns the SDK source, for tests and for inlining.
func Script() []byte { return assets[ScriptPath].body }

// Handler serves the three SDK paths (GET and HEAD) with a strong ETag
// (304 on a matching If-None-Match), Cache-Control: public,
// max-age=86400, X-Content-Type-Options: nosniff and
// Access-Control-Allow-Origin: * so pages on any origin can use
// integrity= and module imports. Other paths get 404.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, ok := assets[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("ETag", a.etag)
		h.Set("Cache-Control", "public, max-age=86400")
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("X-Content-Type-Options", "nosniff")
		if etagMatch(r.Header.Get("If-None-Match"), a.etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		h.Set("Content-Type", a.contentType)
		h.Set("Content-Length", strconv.Itoa(len(a.body)))
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(a.body)
	})
}

// etagMatch implements If-None-Match's weak comparison (RFC 9110 §13.1.2).
func etagMatch(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == "*" || t == etag {
			return true
		}
	}
	return false
}
