package sdk

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/sha512"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The readable source and the module entry as written; dist/ holds what
// npm run build makes of the source (see build.mjs), committed so that Go
// builds need no Node.
//
//go:embed replayguard.js replayguard.mjs dist/replayguard.min.js dist/replayguard.min.js.map dist/replayguard.min.js.br
var files embed.FS

// Paths the Handler serves.
const (
	// ScriptPath serves the minified script (dist/replayguard.min.js), the
	// file SRI hashes.
	ScriptPath = "/sdk/replayguard.js"
	// ModulePath serves the ES module entry, which imports ./replayguard.js.
	ModulePath = "/sdk/replayguard.mjs"
	// SourcePath serves the readable source, web/sdk/replayguard.js.
	SourcePath = "/sdk/replayguard.src.js"
	// SourceMapPath serves the minified script's source map, which its
	// last line names.
	SourceMapPath = "/sdk/replayguard.min.js.map"
	// SRIPath serves SRI as text.
	SRIPath = "/sdk/replayguard.js.sri"
)

// Paths returns every path the Handler serves, for routers that register
// paths one by one.
func Paths() []string {
	return []string{ScriptPath, ModulePath, SourcePath, SourceMapPath, SRIPath}
}

// representation is an asset's bytes in one content coding.
type representation struct {
	coding string // "gzip" or "br"; "" for identity
	body   []byte
	etag   string // strong, and one per representation
}

type asset struct {
	contentType string
	// reps holds the identity representation first, then the encoded
	// ones, smallest first: the order of preference among equals.
	reps []representation
}

var assets = map[string]*asset{}

// SRI is the Subresource Integrity hash of the script served at
// ScriptPath, "sha384-…", for <script integrity="…">. It is computed over
// the decoded bytes, as browsers check it, so it holds for every content
// coding.
var SRI string

const (
	javascript = "text/javascript; charset=utf-8"
	sourceMap  = "application/json; charset=utf-8"
	plainText  = "text/plain; charset=utf-8"
)

func init() {
	// One writer for every file: each allocates most of a megabyte.
	zw, _ := gzip.NewWriterLevel(nil, gzip.BestCompression) // a valid level: no error
	for _, f := range []struct{ path, name, contentType, br string }{
		{ScriptPath, "dist/replayguard.min.js", javascript, "dist/replayguard.min.js.br"},
		{ModulePath, "replayguard.mjs", javascript, ""},
		{SourcePath, "replayguard.js", javascript, ""},
		{SourceMapPath, "dist/replayguard.min.js.map", sourceMap, ""},
	} {
		a := newAsset(f.contentType, mustRead(f.name))
		if f.br != "" {
			a.add("br", mustRead(f.br))
		}
		a.add("gzip", gzipped(zw, a.reps[0].body))
		assets[f.path] = a
	}
	sum := sha512.Sum384(assets[ScriptPath].reps[0].body)
	SRI = "sha384-" + base64.StdEncoding.EncodeToString(sum[:])
	assets[SRIPath] = newAsset(plainText, []byte(SRI+"\n"))
}

func mustRead(name string) []byte {
	b, err := files.ReadFile(name)
	if err != nil {
		panic("sdk: embedded file missing: " + name) // a build defect, caught by every test
	}
	return b
}

func newAsset(contentType string, body []byte) *asset {
	sum := sha256.Sum256(body)
	tag := hex.EncodeToString(sum[:16])
	return &asset{contentType, []representation{{"", body, `"` + tag + `"`}}}
}

// add offers body as the asset in coding, unless it is no smaller than
// the identity representation. Its ETag is the identity's with the coding
// appended, so a cache revalidating one representation never gets a 304
// for another.
func (a *asset) add(coding string, body []byte) {
	id := a.reps[0]
	if len(body) >= len(id.body) {
		return
	}
	a.reps = append(a.reps, representation{coding, body, strings.TrimSuffix(id.etag, `"`) + "-" + coding + `"`})
	slices.SortStableFunc(a.reps[1:], func(x, y representation) int { return len(x.body) - len(y.body) })
}

// gzipped compresses b with zw, once, at start: BestCompression costs
// little for files this small and nothing per request.
func gzipped(zw *gzip.Writer, b []byte) []byte {
	var buf bytes.Buffer
	zw.Reset(&buf)
	_, _ = zw.Write(b) // a bytes.Buffer does not fail
	_ = zw.Close()
	return buf.Bytes()
}

// Script returns the script served at ScriptPath (minified; SRI is its
// hash), for tests and for inlining.
func Script() []byte { return assets[ScriptPath].reps[0].body }

// Handler serves Paths (GET and HEAD). The JavaScript and the source map
// go out Brotli-compressed (the script; precompressed by npm run build),
// gzip-compressed (compressed once, at start) or as they are, as the
// request's Accept-Encoding prefers, with Vary: Accept-Encoding and a
// strong ETag per representation (304 on a matching If-None-Match).
// Every response has Cache-Control: public, max-age=86400,
// X-Content-Type-Options: nosniff and Access-Control-Allow-Origin: * so
// pages on any origin can use integrity= and module imports. Other paths
// get 404.
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
		rep := a.reps[0]
		if len(a.reps) > 1 {
			ae, sent := r.Header["Accept-Encoding"]
			rep = a.reps[negotiate(a.reps, strings.Join(ae, ","), sent)]
		}
		h := w.Header()
		if len(a.reps) > 1 {
			h.Set("Vary", "Accept-Encoding")
		}
		h.Set("ETag", rep.etag)
		h.Set("Cache-Control", "public, max-age=86400")
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("X-Content-Type-Options", "nosniff")
		if etagMatch(r.Header.Get("If-None-Match"), rep.etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		h.Set("Content-Type", a.contentType)
		if rep.coding != "" {
			h.Set("Content-Encoding", rep.coding)
		}
		h.Set("Content-Length", strconv.Itoa(len(rep.body)))
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(rep.body)
	})
}

// negotiate returns the index in reps (identity first, then the encoded
// representations, smallest first) of the one to send for an
// Accept-Encoding field value (RFC 9110 §12.5.3): the highest qvalue wins,
// and of equals the smallest representation. Without the field (sent
// false) any coding is acceptable, yet identity is sent, as a client that
// says nothing may understand nothing. When nothing is acceptable
// ("identity;q=0" or "*;q=0" and no coding on offer) the field is
// disregarded and identity sent, as §12.1 allows instead of a 406: a
// script that arrives is more use than an error.
func negotiate(reps []representation, field string, sent bool) int {
	if !sent {
		return 0
	}
	q := map[string]float64{}
	for _, el := range strings.Split(field, ",") {
		name, params, _ := strings.Cut(el, ";")
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "x-gzip" { // RFC 9110 §8.4.1.3: the same as gzip
			name = "gzip"
		}
		if v, ok := qvalue(params); ok && name != "" {
			q[name] = v
		} // a malformed element is ignored, not the whole field
	}
	best, bestQ := 0, acceptQ(q, "")
	for i := len(reps) - 1; i > 0; i-- {
		if v := acceptQ(q, reps[i].coding); v > 0 && v >= bestQ {
			best, bestQ = i, v
		}
	}
	return best
}

// acceptQ is the qvalue that q, an Accept-Encoding field by coding name,
// gives coding ("" for identity): its own if named, else that of "*" if
// named, else 0 for a coding and 1 for identity.
func acceptQ(q map[string]float64, coding string) float64 {
	name := coding
	if name == "" {
		name = "identity"
	}
	if v, ok := q[name]; ok {
		return v
	}
	if v, ok := q["*"]; ok {
		return v
	}
	if coding == "" {
		return 1
	}
	return 0
}

// qvalue parses an Accept-Encoding element's parameters: the weight of
// ";q=0.5", 1 without one; ok is false when it is malformed (RFC 9110
// §12.4.2: 0 to 1 with at most three decimals).
func qvalue(params string) (q float64, ok bool) {
	q = 1
	for _, p := range strings.Split(params, ";") {
		k, v, _ := strings.Cut(p, "=")
		if !strings.EqualFold(strings.TrimSpace(k), "q") {
			continue
		}
		v = strings.TrimSpace(v)
		whole, frac, dot := strings.Cut(v, ".")
		if (whole != "0" && whole != "1") || (dot && len(frac) > 3) || strings.Trim(frac, "0123456789") != "" {
			return 0, false
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f > 1 {
			return 0, false
		}
		q = f
	}
	return q, true
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
