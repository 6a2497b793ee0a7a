package replay

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
)

// errBase is wrapped by every error SignatureBase returns; Verify turns it
// into ErrInvalid.
var errBase = errors.New("replay: cannot build the signature base")

// Derived component names (RFC 9421 §2.2) that SignatureBase supports.
// @status (responses only) and @query-param are not supported.
const (
	compMethod        = "@method"
	compTargetURI     = "@target-uri"
	compAuthority     = "@authority"
	compScheme        = "@scheme"
	compRequestTarget = "@request-target"
	compPath          = "@path"
	compQuery         = "@query"
	compSigParams     = "@signature-params"
	compContentDigest = "content-digest"
)

// SignatureBase returns the signature base (RFC 9421 §2.5) of m for one
// signature: input is that signature's covered components with its
// parameters, exactly as they appear (or will appear) as the member
// labelled name in Signature-Input. name is used in error messages only.
//
// Covered components are the derived components @method, @target-uri,
// @authority, @scheme, @request-target, @path and @query, and HTTP fields
// by lowercase name, whose values are the field lines of m.Header,
// trimmed and joined with ", " (§2.1). Component parameters (;sf, ;key,
// ;bs, ;req, ;tr, ;name) are not supported and are an error, as are a
// component listed twice, a field m lacks, and a value holding a CR or
// LF. m.URL must be absolute (Scheme and Host set) for @authority,
// @scheme and @target-uri.
//
// @authority is the lowercase host with the scheme's default port
// removed; @target-uri is scheme://authority/path?query with that same
// authority, "/" for an empty path, and "?" only when there is a query
// (WHATWG URL serialisation, as Node signers produce). @path is
// m.URL.RawPath when it decodes to m.URL.Path (the path as a server
// received it), else m.URL.EscapedPath(); "/" when empty. @query is "?"
// followed by m.URL.RawQuery as received, "?" alone when there is none.
// @request-target is the path and, when present, "?" and the query.
//
// The last line is "@signature-params" followed by the serialisation of
// input, so a signer builds input, calls SignatureBase, signs the result
// and sends the same input in Signature-Input.
func SignatureBase(m Message, name string, input httpsfv.InnerList) (string, error) {
	var b strings.Builder
	b.Grow(64 * (len(input.Items) + 2))
	seen := make(map[string]bool, len(input.Items))
	for i, it := range input.Items {
		comp, ok := it.Value.(string)
		if !ok {
			return "", fmt.Errorf("%w: %s: covered component %d is not a string", errBase, name, i)
		}
		if it.Params != nil && len(it.Params.Names()) > 0 {
			return "", fmt.Errorf("%w: %s: component %q: parameters are not supported", errBase, name, comp)
		}
		if seen[comp] {
			return "", fmt.Errorf("%w: %s: component %q is listed twice", errBase, name, comp)
		}
		seen[comp] = true
		v, err := componentValue(m, comp)
		if err != nil {
			return "", fmt.Errorf("%w: %s: component %q: %v", errBase, name, comp, err)
		}
		if strings.ContainsAny(v, "\r\n") {
			return "", fmt.Errorf("%w: %s: component %q: value holds a line break", errBase, name, comp)
		}
		// A string with no parameters serialises as a quoted string; the
		// name was checked to be a lowercase token-ish string below, so
		// no escaping is needed, but serialise properly all the same.
		b.WriteString(quoteSF(comp))
		b.WriteString(": ")
		b.WriteString(v)
		b.WriteByte('\n')
	}
	params, err := serializeParams(input)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", errBase, name, err)
	}
	b.WriteString(`"@signature-params": `)
	b.WriteString(params)
	return b.String(), nil
}

// serializeParams serialises input (the @signature-params value), after
// checking that every value is one httpsfv can serialise without
// panicking. Nil parameter sets count as empty.
func serializeParams(input httpsfv.InnerList) (string, error) {
	// SignatureBase refused component parameters, so every item shares
	// one empty set.
	none := httpsfv.NewParams()
	il := httpsfv.InnerList{Items: make([]httpsfv.Item, len(input.Items)), Params: input.Params}
	for i, it := range input.Items {
		if _, ok := it.Value.(string); !ok {
			return "", fmt.Errorf("covered component %d is not a string", i)
		}
		il.Items[i] = httpsfv.Item{Value: it.Value, Params: none}
	}
	if il.Params == nil {
		il.Params = httpsfv.NewParams()
	}
	for _, k := range il.Params.Names() {
		v, _ := il.Params.Get(k)
		switch v.(type) {
		case bool, string, int64, float64, []byte, httpsfv.Token, httpsfv.DisplayString, time.Time:
		default:
			return "", fmt.Errorf("signature parameter %q has an unsupported type %T", k, v)
		}
	}
	s, err := httpsfv.Marshal(il)
	if err != nil {
		return "", fmt.Errorf("cannot serialise the signature parameters: %v", err)
	}
	return s, nil
}

// quoteSF serialises s as a structured-field string (RFC 9651 §4.1.6).
// Component names come from a parsed string or a caller, so escape " and
// \ as the serialisation requires.
func quoteSF(s string) string {
	if !strings.ContainsAny(s, `"\`) {
		return `"` + s + `"`
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
	return b.String()
}

// componentValue returns the value of one covered component of m.
func componentValue(m Message, comp string) (string, error) {
	if strings.HasPrefix(comp, "@") {
		return derivedValue(m, comp)
	}
	if !validFieldName(comp) {
		return "", errors.New("not a lowercase field name")
	}
	return fieldValue(m, comp)
}

// validFieldName reports whether s is a non-empty lowercase HTTP field
// name (an RFC 9110 token without uppercase letters).
func validFieldName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// fieldValue returns the canonicalised value of the HTTP field name
// (RFC 9421 §2.1): each field line's value with leading and trailing
// whitespace removed, joined with ", ".
func fieldValue(m Message, name string) (string, error) {
	vals := headerValues(m.Header, name)
	if len(vals) == 0 {
		return "", errors.New("the request has no such field")
	}
	if len(vals) == 1 {
		return strings.Trim(vals[0], " \t"), nil
	}
	var b strings.Builder
	for i, v := range vals {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strings.Trim(v, " \t"))
	}
	return b.String(), nil
}

// derivedValue returns the value of a derived component (RFC 9421 §2.2).
func derivedValue(m Message, comp string) (string, error) {
	switch comp {
	case compMethod:
		if m.Method == "" {
			return "", errors.New("the request has no method")
		}
		return m.Method, nil
	case compSigParams:
		return "", errors.New("@signature-params cannot be covered")
	}
	u := m.URL
	if u == nil {
		return "", errors.New("the request has no URL")
	}
	switch comp {
	case compAuthority:
		return authority(u)
	case compScheme:
		if u.Scheme == "" {
			return "", errors.New("the request URL has no scheme")
		}
		return strings.ToLower(u.Scheme), nil
	case compTargetURI:
		if u.Scheme == "" {
			return "", errors.New("the request URL has no scheme")
		}
		a, err := authority(u)
		if err != nil {
			return "", err
		}
		s := strings.ToLower(u.Scheme) + "://" + a + path(u)
		if u.RawQuery != "" || u.ForceQuery {
			s += "?" + u.RawQuery
		}
		return s, nil
	case compRequestTarget:
		s := path(u)
		if u.RawQuery != "" || u.ForceQuery {
			s += "?" + u.RawQuery
		}
		return s, nil
	case compPath:
		return path(u), nil
	case compQuery:
		return "?" + u.RawQuery, nil
	}
	return "", errors.New("unsupported derived component")
}

// path is the absolute path of u as sent, before percent-decoding; "/"
// when empty. That is u.RawPath whenever it decodes to u.Path: a server
// request's URL keeps the path received there when Go would have escaped
// it differently, including characters WHATWG URLs (Node, Deno, fetch)
// send raw but URL.EscapedPath re-escapes, such as | and ^. Otherwise it
// is u.EscapedPath(). A client signing for net/http, which sends
// EscapedPath, sets RawPath to it first.
func path(u *url.URL) string {
	p := u.RawPath
	if p == "" || !strings.HasPrefix(p, "/") {
		p = u.EscapedPath()
	} else if dec, err := url.PathUnescape(p); err != nil || dec != u.Path {
		p = u.EscapedPath()
	}
	if p == "" {
		return "/"
	}
	return p
}

// authority is u's host, lowercase, without the scheme's default port.
func authority(u *url.URL) (string, error) {
	if u.Host == "" {
		return "", errors.New("the request URL has no host")
	}
	h := strings.ToLower(u.Host)
	switch strings.ToLower(u.Scheme) {
	case "https":
		h = strings.TrimSuffix(h, ":443")
	case "http":
		h = strings.TrimSuffix(h, ":80")
	}
	return strings.TrimSuffix(h, ":"), nil
}
