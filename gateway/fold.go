package gateway

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"github.com/replayguard/replayguard/problem"
)

// Why foldPath refuses a path, or match a request; each is
// problem.ErrBadRequest (400 invalid_request) with the reason as its
// detail.
var (
	errNotUTF8      = fmt.Errorf("%w: the path is not UTF-8 once percent-decoded (such as the overlong %%c0%%af), which lenient decoders read as / or .", problem.ErrBadRequest)
	errDotsOnly     = fmt.Errorf("%w: a path segment is only dots and spaces but not . or .. (such as ... or %%2e%%20), which servers read as ., .. or nothing", problem.ErrBadRequest)
	errDeepEncoding = fmt.Errorf("%w: the path is percent-encoded more than %d times (such as %%2525252541)", problem.ErrBadRequest, maxDecodes+1)
	errAmbiguous    = fmt.Errorf("%w: the path is another spelling of a route other than the one it matches as sent; send the route's own spelling", problem.ErrBadRequest)
)

// maxDecodes is how many times foldPath decodes a path after the
// server's decoding: paths encoded deeper are refused, so that a path of
// %25252525... costs linear time, not quadratic.
const maxDecodes = 3

// foldPath returns the spelling of path (a request's path, decoded once)
// that frameworks would map onto the same route, so that a route matches
// every spelling an app may serve as it (see Gateway.ServeHTTP):
//
//   - the percent-escapes left after the first decoding are decoded too,
//     until none is left (%256Frders is /orders to servers that decode
//     twice), at most maxDecodes times: a path with escapes left after
//     that is refused (errDeepEncoding);
//   - the result must be UTF-8 at every step: lenient decoders read
//     overlong forms such as %c0%af as /, so such paths are refused
//     (errNotUTF8), not guessed at;
//   - a path that is not ASCII is normalised to NFKC (／ is /, ｏ is o,
//     ‥ is .., ſ is s), and every letter is mapped to upper and then to
//     lower case (unicode.ToUpper, unicode.ToLower: ı and İ are i,
//     K is k); an ASCII path is lowercased;
//   - a backslash, semicolon or control character that decoding or NFKC
//     brought in is refused as checkTarget refuses a plain one (＼ is \,
//     and so is %25255c to servers that decode three times);
//   - a ? or # (sent as %3F or %23, or brought in by NFKC) ends the path,
//     as in an app that decodes the target before it splits off the
//     query;
//   - segments lose their trailing dots and spaces (admin. and admin%20
//     are admin, as on Windows), empty segments are dropped, . and ..
//     are resolved, and a segment of only dots and spaces that is not
//     . or .. is refused (errDotsOnly);
//   - the trailing slash is dropped.
//
// A .ext suffix is kept; extCuts gives the spellings without it. A path
// that does not start with / (the * of OPTIONS *) is returned as it is.
func foldPath(path string) (string, error) {
	if path == "" || path[0] != '/' || isFolded(path) {
		return path, nil
	}
	p, err := decodeFold(path)
	if err != nil || isFolded(p) {
		return p, err
	}
	out := make([]byte, 0, len(p))
	rest := p[1:]
	for {
		seg, tail, more := strings.Cut(rest, "/")
		switch t := strings.TrimRight(seg, ". "); {
		case seg == "" || seg == ".":
		case seg == "..":
			for len(out) > 0 && out[len(out)-1] != '/' {
				out = out[:len(out)-1]
			}
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		case t == "":
			return "", errDotsOnly
		default:
			out = append(out, '/')
			out = append(out, t...)
		}
		if !more {
			break
		}
		rest = tail
	}
	if len(out) == 0 {
		return "/", nil
	}
	if string(out) == path {
		return path, nil // no allocation for a path already in folded form
	}
	return string(out), nil
}

// decodeFold is the first steps of foldPath: the remaining escapes
// decoded, NFKC and case, and the characters they may bring in checked.
func decodeFold(p string) (string, error) {
	if !utf8.ValidString(p) {
		return "", errNotUTF8
	}
	for n := 0; strings.IndexByte(p, '%') >= 0; n++ {
		q, ok := unescapeValid(p)
		if !ok {
			break
		}
		if n == maxDecodes {
			return "", errDeepEncoding
		}
		if !utf8.ValidString(q) {
			return "", errNotUTF8
		}
		p = q
	}
	if ascii(p) {
		p = strings.ToLower(p)
	} else {
		p = norm.NFKC.String(strings.Map(foldRune, norm.NFKC.String(p)))
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\':
			return "", errBackslash
		case c == ';':
			return "", errSemicolon
		case c < 0x20 || c == 0x7f:
			return "", errControl
		case c == '?' || c == '#':
			return p[:i], nil
		}
	}
	return p, nil
}

// isFolded reports whether foldPath would return p (starting with /) as
// it is, without allocating: p is lowercase ASCII without %, ?, #, \, ;
// or control characters, no segment is empty or starts with a dot, and
// none ends with a dot or a space.
func isFolded(p string) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c >= utf8.RuneSelf || 'A' <= c && c <= 'Z' || c < 0x20 || c == 0x7f,
			c == '%' || c == '?' || c == '#' || c == '\\' || c == ';':
			return false
		case c == '/':
			if i+1 < len(p) && (p[i+1] == '/' || p[i+1] == '.') || i+1 == len(p) && i > 0 {
				return false
			}
		case c == '.' || c == ' ':
			if i+1 == len(p) || p[i+1] == '/' {
				return false
			}
		}
	}
	return true
}

// foldRune maps r to upper and then to lower case, so that letters any
// common case-insensitive comparison equates fold alike (Java's
// equalsIgnoreCase does the same; ı and İ become i, K becomes k).
func foldRune(r rune) rune { return unicode.ToLower(unicode.ToUpper(r)) }

// ascii reports whether s is all ASCII.
func ascii(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// unescapeValid decodes every valid %XX escape of s, leaving a % that
// starts none as it is; ok is false when s has none.
func unescapeValid(s string) (string, bool) {
	var b []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && ishex(s[i+1]) && ishex(s[i+2]) {
			if b == nil {
				b = append(make([]byte, 0, len(s)), s[:i]...)
			}
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
			continue
		}
		if b != nil {
			b = append(b, s[i])
		}
	}
	if b == nil {
		return s, false
	}
	return string(b), true
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// extCuts returns the spellings of folded path p without a .ext suffix
// on its last segment (Rails routes /orders.json to /orders): cut at the
// first dot and at the last one (/a.tar.gz gives /a and /a.tar), each
// after the segment's first character that is not a dot, so that
// /.well-known stays whole. n is how many of cut are set.
func extCuts(p string) (cut [2]string, n int) {
	last := p[strings.LastIndexByte(p, '/')+1:]
	start := len(p) - len(last)
	lead := 0
	for lead < len(last) && last[lead] == '.' {
		lead++
	}
	first := strings.IndexByte(last[lead:], '.')
	if first < 0 {
		return cut, 0
	}
	for _, i := range [...]int{lead + first, strings.LastIndexByte(last, '.')} {
		c := p[:start+len(strings.TrimRight(last[:i], ". "))] // a prefix: no copy
		if n == 0 || c != cut[0] {
			cut[n] = c
			n++
		}
	}
	return cut, n
}

// foldPattern returns ServeMux pattern pattern (valid) with its host
// lowercased and each literal segment of its path folded as foldPath
// folds a request's path, escaped again: the pattern that matches the
// folded spellings of the requests pattern matches. Wildcards stay; a
// subtree keeps its trailing slash, and /{$} at the end is dropped
// (foldPath drops a request's trailing slash), except for the root.
func foldPattern(pattern string) (string, error) {
	method, rest := "", pattern
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		method, rest = pattern[:i+1], strings.TrimLeft(pattern[i+1:], " \t")
	}
	i := strings.IndexByte(rest, '/')
	if i < 0 {
		return "", fmt.Errorf("%q is not a ServeMux pattern", pattern)
	}
	host, path := strings.ToLower(rest[:i]), rest[i:]
	var b strings.Builder
	b.WriteString(method)
	b.WriteString(host)
	subtree := len(path) > 1 && strings.HasSuffix(path, "/")
	segs := strings.Split(strings.Trim(path, "/"), "/")
	wrote := false
	for _, seg := range segs {
		switch {
		case seg == "":
		case seg == "{$}":
			if !wrote {
				b.WriteString("/{$}")
				wrote = true
			}
		case strings.HasPrefix(seg, "{"):
			b.WriteString("/" + seg)
			wrote = true
		default:
			lit, err := url.PathUnescape(seg)
			if err != nil {
				lit = seg
			}
			f, err := foldPath("/" + lit)
			if err != nil {
				return "", err
			}
			for _, s := range strings.Split(f[1:], "/") {
				if s != "" {
					b.WriteString("/" + url.PathEscape(s))
					wrote = true
				}
			}
		}
	}
	if !wrote || subtree {
		b.WriteString("/")
	}
	return b.String(), nil
}

// spellings holds the routes under their folded patterns (foldPattern),
// to find the route of a path's other spellings (foldPath). The zero
// value has no routes.
type spellings struct {
	mux    *http.ServeMux
	routes map[string]*route // by folded pattern: what mux answers with
	// changed: a pattern is not its own folded pattern; while none is,
	// a path that is its own folded spelling matches as it is matched.
	changed bool
	// first holds the first path segments of the folded patterns, so
	// that a path no pattern can match is not looked up; anyFirst: a
	// pattern's first segment is a wildcard, or it is the root's.
	first    map[string]bool
	anyFirst bool
}

// add adds rt, served by rr, under its folded pattern (registerFolded;
// before are the routes added so far, for its errors).
func (s *spellings) add(rt Route, before []Route, rr *route) error {
	if s.mux == nil {
		s.mux, s.routes, s.first = http.NewServeMux(), make(map[string]*route), make(map[string]bool)
	}
	fp, err := registerFolded(s.mux, rt, before, rr)
	if err != nil {
		return err
	}
	s.routes[fp] = rr
	s.changed = s.changed || fp != rt.Match
	path := fp[strings.IndexByte(fp, '/'):] // a valid pattern has one
	seg, _, _ := strings.Cut(path[1:], "/")
	if seg == "" || strings.HasPrefix(seg, "{") {
		s.anyFirst = true
	} else if lit, err := url.PathUnescape(seg); err == nil {
		s.first[lit] = true
	}
	return nil
}

// route returns the route whose folded pattern matches key, r's path
// folded (foldPath), or one of its extCuts, for r's method and host (in
// canonical form); errAmbiguous when they match different routes. A path
// that is its own folded spelling and has no .ext suffix is not looked
// up while every pattern is its own folded pattern: the routes' own
// ServeMux matches it alike.
func (s *spellings) route(r *http.Request, key string) (*route, error) {
	if s.mux == nil || key == "" || key[0] != '/' {
		return nil, nil
	}
	cuts, n := extCuts(key)
	if !s.changed && n == 0 && key == r.URL.Path {
		return nil, nil
	}
	var fr *http.Request
	var found *route
	paths := [...]string{key, cuts[0], cuts[1]}
	for _, p := range paths[:n+1] {
		if !s.mayMatch(p) {
			continue
		}
		if fr == nil {
			fr = &http.Request{Method: r.Method, Host: r.Host, URL: &url.URL{}}
		}
		fr.URL.Path = p
		rt := s.lookup(fr)
		if rt == nil {
			continue
		}
		if found != nil && found != rt {
			return nil, errAmbiguous
		}
		found = rt
	}
	return found, nil
}

// mayMatch reports whether a folded pattern may match folded path p, by
// its first segment.
func (s *spellings) mayMatch(p string) bool {
	if s.anyFirst {
		return true
	}
	seg, _, _ := strings.Cut(p[1:], "/")
	return s.first[seg]
}

// lookup is the route the folded mux gives fr: the one it matches, or
// the one it redirects to (a subtree's path without its slash).
func (s *spellings) lookup(fr *http.Request) *route {
	h, pattern := s.mux.Handler(fr)
	if rt, ok := h.(*route); ok {
		return rt
	}
	if pattern != "" {
		return s.routes[pattern]
	}
	return nil
}
