package replay

import (
	"encoding/base64"
	"strings"

	"github.com/dunglas/httpsfv"
)

// This file reads the three structured fields Verify parses on every
// request (Signature-Input, Signature, Content-Digest) without httpsfv when
// they have the shape signers send, which is also their canonical
// serialisation. Each fast reader only ever succeeds: on anything it does
// not recognise, malformed or merely unusual, it reports false and the
// caller parses the field with httpsfv as before, so every error, and
// every unusual but valid field, takes the one path it always took.
// FuzzFastFieldsMatchHTTPSFV holds the readers to httpsfv.

// Kinds of a parameter value, as far as Verify tells them apart.
const (
	kindOther = iota
	kindInt
	kindString
)

// sfParam is one parameter of a Signature-Input member.
type sfParam struct {
	key  string
	kind uint8
	n    int64  // kindInt
	s    string // kindString
}

// component is one item of a Signature-Input member's inner list.
type component struct {
	name      string // the item's value, when it is a string
	isString  bool
	hasParams bool
}

// inputMember is one member of Signature-Input, as Verify and the
// signature base use it.
type inputMember struct {
	label string
	// isList: the member is an inner list with parameters; choose skips
	// the others, which have no comps or params.
	isList bool
	comps  []component
	params []sfParam
	// raw is the inner list exactly as received, when the fast reader
	// read it: then it is its canonical serialisation, the
	// @signature-params value. Empty otherwise.
	raw string
	// list is the inner list httpsfv parsed (or SignatureBase was given),
	// serialised for @signature-params when raw is empty.
	list httpsfv.InnerList
}

// param returns m's parameter key.
func (m *inputMember) param(key string) (sfParam, bool) {
	for _, p := range m.params {
		if p.key == key {
			return p, true
		}
	}
	return sfParam{}, false
}

// fieldOf is the field value httpsfv parses for vals: its lines joined
// with ", ".
func fieldOf(vals []string) string {
	if len(vals) == 1 {
		return vals[0]
	}
	return strings.Join(vals, ", ")
}

// isLCAlpha, isDigit and isKeyChar are RFC 9651's character classes.
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isKeyChar(c byte) bool {
	return isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*'
}

// isBase64Char reports whether c may appear in a byte sequence, as
// httpsfv reads one.
func isBase64Char(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || isDigit(c) || c == '+' || c == '/' || c == '='
}

// scanKey returns the end of the key starting at s[i], or -1.
func scanKey(s string, i int) int {
	if i >= len(s) || !(isLCAlpha(s[i]) || s[i] == '*') {
		return -1
	}
	for i++; i < len(s) && isKeyChar(s[i]); i++ {
	}
	return i
}

// skipOWS returns the index of the first byte at or after i that is not
// a space or a tab.
func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// skipSP returns the index of the first byte at or after i that is not
// a space.
func skipSP(s string, i int) int {
	for i < len(s) && s[i] == ' ' {
		i++
	}
	return i
}

// nextMember moves past the separator after a dictionary member ending
// at i: it returns the start of the next member, or len(s) at the end,
// or -1 when what follows is not a separator and a member.
func nextMember(s string, i int) int {
	i = skipOWS(s, i)
	if i == len(s) {
		return i
	}
	if s[i] != ',' {
		return -1
	}
	if i = skipOWS(s, i+1); i == len(s) {
		return -1 // a trailing comma is an error: httpsfv says so
	}
	return i
}

// Bounds of the fast reader; fields beyond them go to httpsfv.
const (
	fastMaxMembers = 8
	fastMaxParams  = 16
)

// parseInputFast reads field, a Signature-Input value, when every member
// is an inner list of plain strings without parameters, in canonical
// form, followed by parameters with canonical integer or escape-free
// string values, and no label or parameter appears twice. The members
// are appended to dst, their components and parameters to comps and
// params, whose backing arrays they share.
func parseInputFast(field string, dst []inputMember, comps []component, params []sfParam) ([]inputMember, bool) {
	s := field
	i := skipSP(s, 0)
	if i == len(s) {
		return nil, false
	}
	for {
		end := scanKey(s, i)
		if end < 0 || end+1 >= len(s) || s[end] != '=' || s[end+1] != '(' {
			return nil, false
		}
		m := inputMember{label: s[i:end], isList: true}
		for _, prev := range dst {
			if prev.label == m.label {
				return nil, false
			}
		}
		if len(dst) == fastMaxMembers {
			return nil, false
		}
		start := end + 1
		i = start + 1
		c0 := len(comps)
		if i < len(s) && s[i] != ')' {
			for {
				if i >= len(s) || s[i] != '"' {
					return nil, false
				}
				j := i + 1
				for j < len(s) && s[j] >= 0x20 && s[j] < 0x7f && s[j] != '"' && s[j] != '\\' {
					j++
				}
				if j >= len(s) || s[j] != '"' {
					return nil, false
				}
				comps = append(comps, component{name: s[i+1 : j], isString: true})
				i = j + 1
				if i < len(s) && s[i] == ' ' && i+1 < len(s) && s[i+1] == '"' {
					i++
					continue
				}
				break
			}
		}
		if i >= len(s) || s[i] != ')' {
			return nil, false
		}
		i++
		m.comps = comps[c0:len(comps):len(comps)]
		p0 := len(params)
		for i < len(s) && s[i] == ';' {
			kEnd := scanKey(s, i+1)
			if kEnd < 0 || kEnd+1 >= len(s) || s[kEnd] != '=' {
				return nil, false
			}
			p := sfParam{key: s[i+1 : kEnd]}
			for _, prev := range params[p0:] {
				if prev.key == p.key {
					return nil, false
				}
			}
			if len(params)-p0 == fastMaxParams {
				return nil, false
			}
			j := kEnd + 1
			switch c := s[j]; {
			case c == '"':
				k := j + 1
				for k < len(s) && s[k] >= 0x20 && s[k] < 0x7f && s[k] != '"' && s[k] != '\\' {
					k++
				}
				if k >= len(s) || s[k] != '"' {
					return nil, false
				}
				p.kind, p.s = kindString, s[j+1:k]
				j = k + 1
			case c == '-' || isDigit(c):
				k := j
				neg := c == '-'
				if neg {
					k++
				}
				d0 := k
				var n int64
				for k < len(s) && isDigit(s[k]) {
					n = n*10 + int64(s[k]-'0')
					k++
				}
				nd := k - d0
				// Canonical: 1 to 15 digits, no leading zero, no "-0".
				if nd == 0 || nd > 15 || (s[d0] == '0' && (nd > 1 || neg)) {
					return nil, false
				}
				if neg {
					n = -n
				}
				p.kind, p.n = kindInt, n
				j = k
			default:
				return nil, false
			}
			// Only another parameter, whitespace, a comma or the end may
			// follow a value here; anything else ('.' making a decimal,
			// say) is httpsfv's to judge.
			if j < len(s) && s[j] != ';' && s[j] != ' ' && s[j] != '\t' && s[j] != ',' {
				return nil, false
			}
			params = append(params, p)
			i = j
		}
		m.params = params[p0:len(params):len(params)]
		m.raw = s[start:i]
		dst = append(dst, m)
		if i = nextMember(s, i); i < 0 {
			return nil, false
		}
		if i == len(s) {
			return dst, true
		}
	}
}

// parseSignatureFast reads field, a Signature value, when it is a single
// member label=:base64: with no parameters, decoding the signature with
// d into buf when it fits (into a new slice otherwise).
func parseSignatureFast(field string, d *b64Decoder, buf []byte) (label string, sig []byte, ok bool) {
	s := field
	i := skipSP(s, 0)
	end := scanKey(s, i)
	if end < 0 || end+1 >= len(s) || s[end] != '=' || s[end+1] != ':' {
		return "", nil, false
	}
	label = s[i:end]
	b64, rest, ok := scanBinary(s, end+2)
	if !ok || skipOWS(s, rest) != len(s) {
		return "", nil, false
	}
	sig, ok = d.decode(b64, buf)
	return label, sig, ok
}

// scanBinary returns the base64 of the byte sequence whose text starts at
// s[i], after its opening ':', and the index after its closing ':'.
func scanBinary(s string, i int) (b64 string, end int, ok bool) {
	j := i
	for j < len(s) && isBase64Char(s[j]) {
		j++
	}
	if j >= len(s) || s[j] != ':' {
		return "", 0, false
	}
	return s[i:j], j + 1, true
}

// b64Decoder decodes base64 text as httpsfv does (standard alphabet,
// padded), keeping a buffer for the text so that decoding a string into
// a caller's buffer allocates nothing.
type b64Decoder struct{ text []byte }

// decode decodes b64 into buf when it fits, into a new slice otherwise.
func (d *b64Decoder) decode(b64 string, buf []byte) ([]byte, bool) {
	d.text = append(d.text[:0], b64...)
	n := base64.StdEncoding.DecodedLen(len(b64))
	if n > len(buf) {
		buf = make([]byte, n)
	}
	n, err := base64.StdEncoding.Decode(buf[:n], d.text)
	if err != nil {
		return nil, false
	}
	return buf[:n], true
}

// digestMember is one member of a Content-Digest field.
type digestMember struct {
	alg, b64 string
}

// parseDigestFast reads field, a Content-Digest value, when every member
// is alg=:base64: without parameters and no algorithm appears twice.
func parseDigestFast(field string, dst []digestMember) ([]digestMember, bool) {
	s := field
	i := skipSP(s, 0)
	if i == len(s) {
		return nil, false
	}
	for {
		end := scanKey(s, i)
		if end < 0 || end+1 >= len(s) || s[end] != '=' || s[end+1] != ':' {
			return nil, false
		}
		m := digestMember{alg: s[i:end]}
		for _, prev := range dst {
			if prev.alg == m.alg {
				return nil, false
			}
		}
		if len(dst) == fastMaxMembers {
			return nil, false
		}
		var ok bool
		if m.b64, i, ok = scanBinary(s, end+2); !ok {
			return nil, false
		}
		dst = append(dst, m)
		if i = nextMember(s, i); i < 0 {
			return nil, false
		}
		if i == len(s) {
			return dst, true
		}
	}
}

// inputsOf converts a Signature-Input dictionary httpsfv parsed.
func inputsOf(d *httpsfv.Dictionary) []inputMember {
	names := d.Names()
	out := make([]inputMember, len(names))
	for i, name := range names {
		out[i].label = name
		mem, _ := d.Get(name)
		il, ok := mem.(httpsfv.InnerList)
		if !ok || il.Params == nil {
			continue
		}
		out[i] = listMember(name, il)
	}
	return out
}

// listMember converts an inner list (with parameters) labelled name.
func listMember(name string, il httpsfv.InnerList) inputMember {
	m := inputMember{label: name, isList: true, list: il, comps: make([]component, len(il.Items))}
	for i, it := range il.Items {
		s, ok := it.Value.(string)
		m.comps[i] = component{name: s, isString: ok, hasParams: it.Params != nil && len(it.Params.Names()) > 0}
	}
	if il.Params != nil {
		names := il.Params.Names()
		m.params = make([]sfParam, len(names))
		for i, k := range names {
			v, _ := il.Params.Get(k)
			p := sfParam{key: k}
			switch v := v.(type) {
			case int64:
				p.kind, p.n = kindInt, v
			case string:
				p.kind, p.s = kindString, v
			}
			m.params[i] = p
		}
	}
	return m
}
