package token

import (
	"strconv"
	"unicode/utf8"
)

// The claims codec of the hot path. sign used to write the claims segment
// with goccy/go-json's Marshal of jwtClaims, and Parse to read it with
// goccy's Unmarshal and golang-jwt's NumericDate, all by reflection. This
// file writes the same bytes by hand, and reads back only those bytes:
// a claims segment spelled any other way (another member order, floats,
// other escapes, extra members), which only another implementation
// holding a key can sign, takes the old path (decodeClaims).

// appendClaims appends the JSON of c exactly as goccy/go-json's Marshal
// writes jwtClaims with c's values (see signJSON): RegisteredClaims'
// members in field order, empty sub and jti left out (omitempty), exp and
// iat as NumericDate writes them at second precision (whole Unix seconds,
// rounded down), then pur.
func appendClaims(b []byte, c Claims) []byte {
	b = append(b, '{')
	if c.Subject != "" {
		b = append(b, `"sub":`...)
		b = appendJSONString(b, c.Subject)
		b = append(b, ',')
	}
	b = append(b, `"exp":`...)
	b = strconv.AppendInt(b, c.ExpiresAt.Unix(), 10)
	b = append(b, `,"iat":`...)
	b = strconv.AppendInt(b, c.IssuedAt.Unix(), 10)
	if c.ID != "" {
		b = append(b, `,"jti":`...)
		b = appendJSONString(b, c.ID)
	}
	b = append(b, `,"pur":`...)
	b = appendJSONString(b, c.Purpose)
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// literal reports whether appendJSONString writes the ASCII byte c as it
// is. goccy's Marshal escapes HTML: unlike internal/jsonw, '<', '>' and
// '&' are escaped; unlike encoding/json, so are '\b' and '\f' (as \u00XX).
func literal(c byte) bool {
	return c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
}

// appendJSONString appends s quoted as goccy/go-json's Marshal quotes it
// (HTML escaping and UTF-8 normalising on, its defaults): '"' and '\' by
// a backslash; '\n', '\r' and '\t' by their short escapes; other control
// characters, '<', '>' and '&' as \u00XX in lower case; each byte of
// invalid UTF-8 as \ufffd; U+2028 and U+2029 as \u2028 and \u2029.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			i++
			if literal(c) {
				continue
			}
			b = append(b, s[start:i-1]...)
			b = appendEscape(b, c)
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r != utf8.RuneError || size != 1) && r != '\u2028' && r != '\u2029' {
			i += size
			continue
		}
		b = append(b, s[start:i]...)
		if size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendEscape appends the escape of the ASCII byte c, one that literal
// refuses.
func appendEscape(b []byte, c byte) []byte {
	switch c {
	case '"', '\\':
		return append(b, '\\', c)
	case '\n':
		return append(b, '\\', 'n')
	case '\r':
		return append(b, '\\', 'r')
	case '\t':
		return append(b, '\\', 't')
	}
	return append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
}

// parseClaims reads claims JSON that appendClaims wrote, and nothing
// else: ok is false for any input that is not, byte for byte,
// appendClaims of the claims returned, so that a caller can then read it
// the general way. exp and iat come back as time.Unix values, as
// NumericDate decodes integers that a float64 holds exactly. The strings
// share raw's memory unless they contain escapes.
func parseClaims(raw string) (c Claims, exp, iat int64, ok bool) {
	p := claimsParser{rest: raw, ok: true}
	p.expect("{")
	if p.skip(`"sub":`) {
		c.Subject = p.str(false)
		p.expect(",")
	}
	p.expect(`"exp":`)
	exp = p.int()
	p.expect(`,"iat":`)
	iat = p.int()
	if p.skip(`,"jti":`) {
		c.ID = p.str(false)
	}
	p.expect(`,"pur":`)
	c.Purpose = p.str(true)
	p.expect("}")
	return c, exp, iat, p.ok && p.rest == ""
}

// claimsParser consumes rest from the left; ok turns false, for good, at
// the first byte appendClaims would not have written there.
type claimsParser struct {
	rest string
	ok   bool
}

// skip consumes lit if rest starts with it.
func (p *claimsParser) skip(lit string) bool {
	if !p.ok || len(p.rest) < len(lit) || p.rest[:len(lit)] != lit {
		return false
	}
	p.rest = p.rest[len(lit):]
	return true
}

// expect consumes lit, which must come next.
func (p *claimsParser) expect(lit string) {
	p.ok = p.skip(lit)
}

// maxDigits bounds an integer claim: 15 decimal digits are below 2^53,
// so a float64 holds them exactly, as NumericDate needs.
const maxDigits = 15

// int consumes an integer as strconv.AppendInt writes it: no plus sign,
// no leading zero, no "-0"; at most maxDigits digits.
func (p *claimsParser) int() int64 {
	if !p.ok {
		return 0
	}
	s := p.rest
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	digits := i
	var v int64 // wraps past maxDigits, and is then refused
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		v = v*10 + int64(s[i]-'0')
		i++
	}
	n := i - digits
	if n == 0 || n > maxDigits || s[digits] == '0' && (n > 1 || digits > 0) {
		p.ok = false
		return 0
	}
	p.rest = s[i:]
	if digits > 0 {
		return -v
	}
	return v
}

// str consumes a string as appendJSONString writes it, empty only if
// empty is true (appendClaims leaves empty sub and jti out).
func (p *claimsParser) str(empty bool) string {
	if !p.skip(`"`) {
		p.ok = false
		return ""
	}
	s := p.rest
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"':
			p.ok = i > 0 || empty
			p.rest = s[i+1:]
			return s[:i]
		case c == '\\':
			return p.unescape(i)
		case c < utf8.RuneSelf:
			if !literal(c) {
				p.ok = false
				return ""
			}
			i++
		default:
			size, ok := literalRune(s[i:])
			if !ok {
				p.ok = false
				return ""
			}
			i += size
		}
	}
	p.ok = false
	return ""
}

// literalRune decodes the non-ASCII rune that s starts with and reports
// whether appendJSONString writes it as it is: valid UTF-8 other than
// U+2028 and U+2029.
func literalRune(s string) (int, bool) {
	r, size := utf8.DecodeRuneInString(s)
	return size, (r != utf8.RuneError || size != 1) && r != '\u2028' && r != '\u2029'
}

// unescape finishes str for a string whose first escape is at rest[i],
// copying it into a string of its own.
func (p *claimsParser) unescape(i int) string {
	s := p.rest
	b := make([]byte, 0, len(s))
	b = append(b, s[:i]...)
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"':
			p.rest = s[i+1:]
			return string(b)
		case c == '\\':
			var n int
			b, n = appendUnescaped(b, s[i:])
			if n == 0 {
				p.ok = false
				return ""
			}
			i += n
		case c < utf8.RuneSelf:
			if !literal(c) {
				p.ok = false
				return ""
			}
			b = append(b, c)
			i++
		default:
			size, ok := literalRune(s[i:])
			if !ok {
				p.ok = false
				return ""
			}
			b = append(b, s[i:i+size]...)
			i += size
		}
	}
	p.ok = false
	return ""
}

// appendUnescaped appends the character of the escape that s starts with
// and returns the escape's length, or 0 when appendEscape or
// appendJSONString would not have written that escape for it.
func appendUnescaped(b []byte, s string) ([]byte, int) {
	if len(s) < 2 {
		return b, 0
	}
	switch s[1] {
	case '"', '\\':
		return append(b, s[1]), 2
	case 'n':
		return append(b, '\n'), 2
	case 'r':
		return append(b, '\r'), 2
	case 't':
		return append(b, '\t'), 2
	case 'u':
		if len(s) < 6 {
			return b, 0
		}
		switch u := s[2:6]; u {
		case "2028", "2029":
			return utf8.AppendRune(b, 0x2020+rune(u[3]-'0')), 6
		case "003c", "003e", "0026":
			return append(b, unhex(u[2])<<4|unhex(u[3])), 6
		}
		// A control character without a short escape: \u0000 to \u001f.
		if s[2:4] != "00" || s[4] > '1' || s[4] < '0' || unhex(s[5]) > 0xF {
			return b, 0
		}
		c := (s[4]-'0')<<4 | unhex(s[5])
		if c == '\n' || c == '\r' || c == '\t' {
			return b, 0
		}
		return append(b, c), 6
	}
	return b, 0
}

// unhex returns the value of a lower-case hex digit, or 0xFF.
func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return 0xFF
}
