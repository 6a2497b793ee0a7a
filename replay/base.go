package replay

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
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
	mem := listMember(name, input)
	b, err := appendBase(make([]byte, 0, 64*(len(input.Items)+2)), m, &mem)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// appendBase appends the signature base of m for the Signature-Input
// member mem to b; see SignatureBase. The @signature-params value is
// mem.raw when the member was read as received (then it is already the
// canonical serialisation), else mem.list serialised.
func appendBase(b []byte, m Message, mem *inputMember) ([]byte, error) {
	name := mem.label
	// Duplicates are looked for by scanning the few components a
	// signature usually covers, in a set for long lists.
	var seen map[string]bool
	if len(mem.comps) > 16 {
		seen = make(map[string]bool, len(mem.comps))
	}
	for i, c := range mem.comps {
		if !c.isString {
			return nil, fmt.Errorf("%w: %s: covered component %d is not a string", errBase, name, i)
		}
		comp := c.name
		if c.hasParams {
			return nil, fmt.Errorf("%w: %s: component %q: parameters are not supported", errBase, name, comp)
		}
		if listedTwice(mem.comps[:i], comp, seen) {
			return nil, fmt.Errorf("%w: %s: component %q is listed twice", errBase, name, comp)
		}
		// A string with no parameters serialises as a quoted string.
		b = appendQuotedSF(b, comp)
		b = append(b, ": "...)
		start := len(b)
		var err error
		if b, err = appendComponent(b, m, comp); err != nil {
			return nil, fmt.Errorf("%w: %s: component %q: %v", errBase, name, comp, err)
		}
		if bytes.ContainsAny(b[start:], "\r\n") {
			return nil, fmt.Errorf("%w: %s: component %q: value holds a line break", errBase, name, comp)
		}
		b = append(b, '\n')
	}
	params := mem.raw
	if params == "" {
		var err error
		if params, err = serializeParams(mem.list); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", errBase, name, err)
		}
	}
	b = append(b, `"@signature-params": `...)
	return append(b, params...), nil
}

// listedTwice reports whether comp is among before, the components
// before it (all strings), recording it in seen when seen is not nil.
func listedTwice(before []component, comp string, seen map[string]bool) bool {
	if seen != nil {
		if seen[comp] {
			return true
		}
		seen[comp] = true
		return false
	}
	for _, c := range before {
		if c.name == comp {
			return true
		}
	}
	return false
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

// appendQuotedSF appends s serialised as a structured-field string (RFC
// 9651 §4.1.6). Component names come from a parsed string or a caller,
// so escape " and \ as the serialisation requires.
func appendQuotedSF(b []byte, s string) []byte {
	b = append(b, '"')
	if !strings.ContainsAny(s, `"\`) {
		b = append(b, s...)
	} else {
		for i := 0; i < len(s); i++ {
			if s[i] == '"' || s[i] == '\\' {
				b = append(b, '\\')
			}
			b = append(b, s[i])
		}
	}
	return append(b, '"')
}

// appendComponent appends the value of one covered component of m.
func appendComponent(b []byte, m Message, comp string) ([]byte, error) {
	if strings.HasPrefix(comp, "@") {
		return appendDerived(b, m, comp)
	}
	if !validFieldName(comp) {
		return nil, errors.New("not a lowercase field name")
	}
	return appendField(b, m, comp)
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

// appendField appends the canonicalised value of the HTTP field name, a
// valid lowercase field name (RFC 9421 §2.1): each field line's value
// with leading and trailing whitespace removed, joined with ", ".
func appendField(b []byte, m Message, name string) ([]byte, error) {
	vals := fieldLines(m.Header, name)
	if len(vals) == 0 {
		return nil, errors.New("the request has no such field")
	}
	for i, v := range vals {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, strings.Trim(v, " \t")...)
	}
	return b, nil
}

// fieldLines is headerValues(h, name) for a valid lowercase field name,
// without allocating its canonical form.
func fieldLines(h http.Header, name string) []string {
	var buf [64]byte
	if len(name) > len(buf) {
		return headerValues(h, name)
	}
	// textproto.CanonicalMIMEHeaderKey's rule for a token: upper case
	// first and after each '-', lower case elsewhere (name is already).
	k := buf[:len(name)]
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		k[i] = c
		upper = c == '-'
	}
	if vals := h[string(k)]; len(vals) > 0 {
		return vals
	}
	return headerValues(h, name)
}

// appendDerived appends the value of a derived component (RFC 9421
// §2.2).
func appendDerived(b []byte, m Message, comp string) ([]byte, error) {
	switch comp {
	case compMethod:
		if m.Method == "" {
			return nil, errors.New("the request has no method")
		}
		return append(b, m.Method...), nil
	case compSigParams:
		return nil, errors.New("@signature-params cannot be covered")
	}
	u := m.URL
	if u == nil {
		return nil, errors.New("the request has no URL")
	}
	switch comp {
	case compAuthority:
		a, err := authority(u)
		if err != nil {
			return nil, err
		}
		return append(b, a...), nil
	case compScheme:
		if u.Scheme == "" {
			return nil, errors.New("the request URL has no scheme")
		}
		return append(b, strings.ToLower(u.Scheme)...), nil
	case compTargetURI:
		if u.Scheme == "" {
			return nil, errors.New("the request URL has no scheme")
		}
		a, err := authority(u)
		if err != nil {
			return nil, err
		}
		b = append(b, strings.ToLower(u.Scheme)...)
		b = append(b, "://"...)
		b = append(b, a...)
		return appendTarget(b, u), nil
	case compRequestTarget:
		return appendTarget(b, u), nil
	case compPath:
		return append(b, path(u)...), nil
	case compQuery:
		b = append(b, '?')
		return append(b, u.RawQuery...), nil
	}
	return nil, errors.New("unsupported derived component")
}

// appendTarget appends u's path and, when there is a query (or a bare
// "?"), "?" and the query.
func appendTarget(b []byte, u *url.URL) []byte {
	b = append(b, path(u)...)
	if u.RawQuery != "" || u.ForceQuery {
		b = append(b, '?')
		b = append(b, u.RawQuery...)
	}
	return b
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
