package guard

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/replayguard/replayguard/internal/jsonw"
	"github.com/replayguard/replayguard/problem"
)

// fingerprint returns the hex SHA-256 of what identifies a request for
// idempotency: its method, route, path, query and body, the body in
// canonical form (see canonicalBody) and the fields in ignore left out.
func fingerprint(r *http.Request, route string, body []byte, ignore map[string]bool) (string, error) {
	kind, canon, err := canonicalBody(r.Header.Get("Content-Type"), body, ignore)
	if err != nil {
		return "", err
	}
	b := make([]byte, 0, 256+len(canon))
	b = appendField(b, r.Method)
	b = appendField(b, route)
	b = appendField(b, r.URL.EscapedPath())
	b = appendField(b, canonicalQuery(r.URL.RawQuery, ignore))
	b = appendField(b, kind)
	b = appendField(b, canon)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// canonicalQuery sorts the query's parameters by name (keeping the order
// of repeated ones), without the ignored ones; a query that does not
// parse is kept as it is.
func canonicalQuery(raw string, ignore map[string]bool) string {
	if raw == "" {
		return ""
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return raw
	}
	for name := range ignore {
		delete(q, name)
	}
	return q.Encode()
}

// canonicalBody returns the kind of a body and its canonical form:
//
//   - JSON (application/json, */*+json): re-encoded with object keys
//     sorted, no insignificant whitespace, numbers as written, and the
//     ignored top-level members left out;
//   - application/x-www-form-urlencoded: fields sorted by name (repeated
//     fields in their order), ignored ones left out;
//   - multipart/form-data: parts sorted by field name (repeated fields in
//     their order), each as its name, file name, content type and the
//     SHA-256 of its content, ignored ones left out;
//   - anything else, or a body that does not parse as its type says: the
//     bytes as they are, with the media type.
//
// A JSON body that names a member twice in one object is refused with
// problem.ErrBadRequest: parsers disagree on which one wins (Go's takes
// the last, some the first), so {"amount":1,"amount":1000} and
// {"amount":1000} must not pass for the same request. Names that differ
// only in case count as the same name, as Go's encoding/json matches a
// struct field's name (strings.EqualFold, simple Unicode folding: the
// Kelvin sign K and k are one name): {"qty":1,"QTY":5} and
// {"QTY":5,"qty":1} read as 5 and as 1 there, but would have one
// canonical form. So is a JSON body
// that is not UTF-8 or escapes a lone surrogate ("\ud800"): RFC 8259
// requires UTF-8 and I-JSON (RFC 7493) forbids lone surrogates, and
// parsers disagree on them too (Go's and the canonical form read every
// such sequence as U+FFFD, others refuse them or keep them), so
// {"a":"\ud800"} and {"a":"\udbff"} must not pass for the same request.
func canonicalBody(contentType string, body []byte, ignore map[string]bool) (kind, canon string, err error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		mt = strings.ToLower(strings.TrimSpace(contentType))
	}
	if len(body) > 0 {
		switch {
		case mt == "application/json" || strings.HasSuffix(mt, "+json"):
			switch first, second, dup := duplicateMember(body); {
			case dup && first == second:
				return "", "", fmt.Errorf("%w: the JSON body names the member %q twice in one object; send each member once", problem.ErrBadRequest, clip(first))
			case dup:
				return "", "", fmt.Errorf("%w: the JSON body names the member %q twice in one object, the second time as %q (names that differ only in case are one member to some parsers, such as Go's); send each member once", problem.ErrBadRequest, clip(first), clip(second))
			}
			if why := notUnicode(body); why != "" {
				return "", "", fmt.Errorf("%w: the JSON body %s; send UTF-8 text, with each surrogate escape in a pair", problem.ErrBadRequest, why)
			}
			if c, ok := canonicalJSON(body, ignore); ok {
				return "json", c, nil
			}
		case mt == "application/x-www-form-urlencoded":
			if f, err := url.ParseQuery(string(body)); err == nil {
				for name := range ignore {
					delete(f, name)
				}
				return "form", f.Encode(), nil
			}
		case mt == "multipart/form-data":
			if c, ok := canonicalMultipart(body, params["boundary"], ignore); ok {
				return "multipart", c, nil
			}
		}
	}
	return "raw:" + mt, string(body), nil
}

// duplicateMember reports the first member that one object of the JSON
// body, at any depth, names twice: first is the name as the object gave
// it first, second as it gave it again. Two names are the same when they
// are equal under simple Unicode case folding (strings.EqualFold, which
// encoding/json matches a struct field's name with), so first and second
// may differ in case. Each object's names are kept in a map by their
// folded form (foldName), so the check is linear in the body's size. A
// body that is not JSON has none.
func duplicateMember(body []byte) (first, second string, dup bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	type level struct {
		names map[string]string // by folded name, the name as given; nil for an array
		key   bool              // the next token of an object is a name
	}
	var stack []level
	var buf []byte
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", "", false
		}
		if n := len(stack); n > 0 && stack[n-1].names != nil {
			top := &stack[n-1]
			if name, ok := tok.(string); ok && top.key {
				folded := name // most names need no folding: no copy
				if !isFolded(name) {
					buf = foldName(buf[:0], name)
					folded = string(buf)
				}
				if prev, seen := top.names[folded]; seen {
					return prev, name, true
				}
				top.names[folded] = name
				top.key = false
				continue
			}
			if d, ok := tok.(json.Delim); !ok || d == '{' || d == '[' {
				top.key = true // a value: the next token is a name
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, level{names: map[string]string{}, key: true})
		case json.Delim('['):
			stack = append(stack, level{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return "", "", false
			}
		}
	}
}

// foldName appends to b the folded form of name: each rune replaced by
// the smallest rune of its simple case-folding orbit (unicode.SimpleFold),
// an ASCII capital then by its small letter (k, K and the Kelvin sign K
// all become k; s, S and the long s ſ become s), so that foldName(x)
// equals foldName(y) exactly when strings.EqualFold(x, y), as
// encoding/json's own folding does.
func foldName(b []byte, name string) []byte {
	for i := 0; i < len(name); {
		if c := name[i]; c < utf8.RuneSelf {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b = append(b, c)
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(name[i:])
		if r = foldRune(r); 'A' <= r && r <= 'Z' {
			r += 'a' - 'A'
		}
		b = utf8.AppendRune(b, r)
		i += n
	}
	return b
}

// isFolded reports whether name is its own folded form because it is
// ASCII without capitals, as most member names are.
func isFolded(name string) bool {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c >= utf8.RuneSelf || 'A' <= c && c <= 'Z' {
			return false
		}
	}
	return true
}

// foldRune returns the smallest rune of r's simple case-folding orbit.
func foldRune(r rune) rune {
	for {
		next := unicode.SimpleFold(r)
		if next <= r {
			return next
		}
		r = next
	}
}

// notUnicode says why a JSON body's text is not Unicode, or returns "":
// it is not UTF-8, or a string escapes a surrogate (\uD800 to \uDFFF)
// that is not half of a high-low pair. Escapes are looked for in strings
// only, where JSON allows them.
func notUnicode(body []byte) string {
	if !utf8.Valid(body) {
		return "is not valid UTF-8"
	}
	inString, pendingHigh := false, false
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !inString {
			inString = c == '"'
			continue
		}
		if c != '\\' {
			if pendingHigh {
				return "escapes a lone surrogate"
			}
			inString = c != '"'
			continue
		}
		i++ // the escaped character
		if i >= len(body) || body[i] != 'u' {
			if pendingHigh {
				return "escapes a lone surrogate"
			}
			continue
		}
		r, ok := jsonw.Hex4(body[i+1:])
		if !ok {
			continue // not JSON: the parser refuses it
		}
		i += 4
		switch {
		case pendingHigh && 0xDC00 <= r && r <= 0xDFFF:
			pendingHigh = false
		case pendingHigh || 0xDC00 <= r && r <= 0xDFFF:
			return "escapes a lone surrogate"
		default:
			pendingHigh = 0xD800 <= r && r <= 0xDBFF
		}
	}
	if pendingHigh {
		return "escapes a lone surrogate"
	}
	return ""
}

// clip shortens s, a value from the request, for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func canonicalJSON(body []byte, ignore map[string]bool) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return "", false // trailing data
	}
	if obj, ok := v.(map[string]any); ok {
		for name := range ignore {
			delete(obj, name)
		}
	}
	out, err := json.Marshal(v) // map keys come out sorted
	if err != nil {
		return "", false
	}
	return string(out), true
}

func canonicalMultipart(body []byte, boundary string, ignore map[string]bool) (string, bool) {
	if boundary == "" {
		return "", false
	}
	type part struct{ name, file, ctype, sum string }
	var parts []part
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", false
		}
		h := sha256.New()
		if _, err := io.Copy(h, p); err != nil {
			return "", false
		}
		if name := p.FormName(); !ignore[name] {
			parts = append(parts, part{name, p.FileName(), p.Header.Get("Content-Type"), hex.EncodeToString(h.Sum(nil))})
		}
	}
	slices.SortStableFunc(parts, func(a, b part) int { return strings.Compare(a.name, b.name) })
	var b []byte
	for _, p := range parts {
		b = appendField(b, p.name)
		b = appendField(b, p.file)
		b = appendField(b, p.ctype)
		b = appendField(b, p.sum)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), true
}
