package handlers

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/internal/jsonw"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
)

// verifyRequest is the body of POST /v1/signatures/verify: the request a
// backend received, as it received it.
type verifyRequest struct {
	Method  string            `json:"method"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

type verifyResponse struct {
	Status  string `json:"status"`
	KeyID   string `json:"keyid"`
	Created int64  `json:"created"`
	Nonce   string `json:"nonce"`
}

// appendJSON appends r exactly as json.Marshal writes it (c.JSON's
// answer), without reflection.
func (r verifyResponse) appendJSON(b []byte) []byte {
	b = append(b, `{"status":`...)
	b = appendJSONString(b, r.Status)
	b = append(b, `,"keyid":`...)
	b = appendJSONString(b, r.KeyID)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, r.Created, 10)
	b = append(b, `,"nonce":`...)
	b = appendJSONString(b, r.Nonce)
	return append(b, '}')
}

// appendJSONString appends s quoted as json.Marshal quotes it: by jsonw
// when s is printable ASCII without '<', '>' or '&' (nonces and key IDs
// are), where the two agree, else by json.Marshal itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	return jsonw.Quoted(b, s)
}

// verifySignature serves POST /v1/signatures/verify.
func (a *API) verifySignature(c *gin.Context) (string, error) {
	if a.verifier == nil {
		fail(c, fmt.Errorf("%w: signature verification is not configured on this server", problem.ErrNotFound))
		return "", nil // not a verification: not counted
	}
	if !a.allowed(c.Request) {
		return "", problem.ErrUnauthorized
	}
	m, err := readVerifyRequest(c.Request)
	if err != nil {
		return "", err
	}
	res, err := a.verifier.Verify(c.Request.Context(), m)
	if err != nil {
		return "", err
	}
	noStore(c)
	writeJSON(c, http.StatusOK, verifyResponse{Status: "verified", KeyID: res.KeyID, Created: res.Created.Unix(), Nonce: res.Nonce}.appendJSON)
	return "verified", nil
}

// readVerifyRequest decodes and checks the body of POST
// /v1/signatures/verify into the message to verify. The body is decoded
// by decodeVerifyBody when it has the usual shape, else by readJSON,
// which gives the answers every malformed or unusual body always had.
func readVerifyRequest(r *http.Request) (replay.Message, error) {
	data, err := request.ReadBody(r, MaxBodyBytes)
	if err != nil {
		return replay.Message{}, err
	}
	body, ok := decodeVerifyBody(data)
	if !ok {
		// ReadBody put the body back: readJSON reads it again.
		var v verifyRequest
		if err := readJSON(r, &v, MaxBodyBytes); err != nil {
			return replay.Message{}, err
		}
		body = verifyFields{method: v.Method, url: v.URL, body: v.Body, headers: make([]headerField, 0, len(v.Headers))}
		for name, value := range v.Headers {
			body.headers = append(body.headers, headerField{name, value})
		}
	}
	return body.message()
}

// verifyFields is a decoded verify body: verifyRequest with its headers
// in the order they came (map order when readJSON decoded them).
type verifyFields struct {
	method, url, body string
	headers           []headerField
}

// headerField is one member of a verify body's "headers".
type headerField struct{ name, value string }

// message checks f and returns the message to verify.
func (f *verifyFields) message() (replay.Message, error) {
	if f.method == "" {
		return replay.Message{}, fmt.Errorf("%w: \"method\" is required", problem.ErrBadRequest)
	}
	if !request.IsToken(f.method) {
		return replay.Message{}, fmt.Errorf("%w: \"method\" is not an HTTP method", problem.ErrBadRequest)
	}
	u, err := url.Parse(f.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return replay.Message{}, fmt.Errorf("%w: \"url\" must be an absolute http or https URL, such as https://api.example.com/v1/orders?id=7", problem.ErrBadRequest)
	}
	if u.User != nil || u.Fragment != "" || strings.Contains(f.url, "#") {
		return replay.Message{}, fmt.Errorf("%w: \"url\" must not carry user information or a fragment", problem.ErrBadRequest)
	}
	h := make(http.Header, len(f.headers))
	values := make([]string, len(f.headers)) // one array for all the one-value slices
	for i, hf := range f.headers {
		name, value := hf.name, hf.value
		if !request.IsToken(name) {
			return replay.Message{}, fmt.Errorf("%w: %q is not a header name", problem.ErrBadRequest, name)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return replay.Message{}, fmt.Errorf("%w: the value of header %q holds a line break or NUL", problem.ErrBadRequest, name)
		}
		key := canonicalHeaderKey(name)
		if _, dup := h[key]; dup {
			return replay.Message{}, fmt.Errorf("%w: header %q is given twice (names are case-insensitive); join the values with \", \"", problem.ErrBadRequest, name)
		}
		values[i] = value
		h[key] = values[i : i+1 : i+1]
	}
	var data []byte
	if f.body != "" {
		if data, err = base64.StdEncoding.DecodeString(f.body); err != nil {
			return replay.Message{}, fmt.Errorf("%w: \"body\" is not standard base64", problem.ErrBadRequest)
		}
	}
	return replay.Message{Method: f.method, URL: u, Header: h, Body: data}, nil
}

// canonicalHeaderKey is http.CanonicalHeaderKey for a token, without
// allocating for the fields every signed request has, which net/http
// does not intern and Node's clients send in lower case.
func canonicalHeaderKey(name string) string {
	for _, k := range signatureFields {
		if len(name) == len(k) && strings.EqualFold(name, k) {
			return k
		}
	}
	return http.CanonicalHeaderKey(name)
}

// signatureFields are the fields canonicalHeaderKey interns.
var signatureFields = [...]string{"Signature-Input", "Signature", "Content-Digest"}

// maxFastHeaders bounds the headers decodeVerifyBody reads, which it
// checks for repeats pairwise.
const maxFastHeaders = 32

// decodeVerifyBody decodes data, a verify body, when it is one JSON
// object holding some of the four members, each once, under its exact
// name, with string values, "headers" an object of strings under
// distinct names: what clients send. What it decodes is then exactly
// what readJSON decodes. It reports false, leaving the body to readJSON,
// on anything else: malformed JSON, unknown, repeated, escaped or
// differently cased member names, null, an escaped surrogate or invalid
// UTF-8 (which encoding/json replaces), more than maxFastHeaders headers,
// anything after the object.
func decodeVerifyBody(data []byte) (verifyFields, bool) {
	var f verifyFields
	s := string(data) // the strings decoded without escapes share it
	i := skipJSONSpace(s, 0)
	if i == len(s) || s[i] != '{' {
		return verifyFields{}, false
	}
	var seen uint8
	for i = skipJSONSpace(s, i+1); ; {
		// A member name: one of the four, exactly, without escapes.
		if i == len(s) || s[i] != '"' {
			return verifyFields{}, false
		}
		end := strings.IndexByte(s[i+1:], '"')
		if end < 0 {
			return verifyFields{}, false
		}
		name := s[i+1 : i+1+end]
		if i = skipJSONSpace(s, i+end+2); i == len(s) || s[i] != ':' {
			return verifyFields{}, false
		}
		i = skipJSONSpace(s, i+1)
		var bit uint8
		ok := false
		switch name {
		case "method":
			bit = 1
			f.method, i, ok = jsonString(s, i)
		case "url":
			bit = 2
			f.url, i, ok = jsonString(s, i)
		case "headers":
			bit = 4
			f.headers, i, ok = jsonHeaders(s, i)
		case "body":
			bit = 8
			f.body, i, ok = jsonString(s, i)
		}
		if !ok || seen&bit != 0 {
			return verifyFields{}, false
		}
		seen |= bit
		if i = skipJSONSpace(s, i); i == len(s) {
			return verifyFields{}, false
		}
		if s[i] == '}' {
			break
		}
		if s[i] != ',' {
			return verifyFields{}, false
		}
		i = skipJSONSpace(s, i+1)
	}
	if skipJSONSpace(s, i+1) != len(s) {
		return verifyFields{}, false
	}
	return f, true
}

// jsonHeaders decodes the object of strings starting at s[i], with
// distinct names, and returns the index after it.
func jsonHeaders(s string, i int) ([]headerField, int, bool) {
	if i == len(s) || s[i] != '{' {
		return nil, 0, false
	}
	hs := make([]headerField, 0, 8)
	if i = skipJSONSpace(s, i+1); i < len(s) && s[i] == '}' {
		return hs, i + 1, true
	}
	for {
		name, j, ok := jsonString(s, i)
		if !ok {
			return nil, 0, false
		}
		if j = skipJSONSpace(s, j); j == len(s) || s[j] != ':' {
			return nil, 0, false
		}
		value, j, ok := jsonString(s, skipJSONSpace(s, j+1))
		if !ok || len(hs) == maxFastHeaders {
			return nil, 0, false
		}
		for _, h := range hs {
			if h.name == name { // encoding/json keeps the last
				return nil, 0, false
			}
		}
		hs = append(hs, headerField{name, value})
		if j = skipJSONSpace(s, j); j == len(s) {
			return nil, 0, false
		}
		switch s[j] {
		case '}':
			return hs, j + 1, true
		case ',':
			i = skipJSONSpace(s, j+1)
		default:
			return nil, 0, false
		}
	}
}

// jsonString decodes the JSON string starting at s[i] and returns the
// index after it. Without escapes it is a substring of s.
func jsonString(s string, i int) (string, int, bool) {
	if i >= len(s) || s[i] != '"' {
		return "", 0, false
	}
	ascii := true
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			v := s[i+1 : j]
			if !ascii && !utf8.ValidString(v) {
				return "", 0, false
			}
			return v, j + 1, true
		case c == '\\':
			return jsonUnescape(s, i+1)
		case c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", 0, false
}

// jsonUnescape decodes the JSON string whose text starts at s[i], after
// its opening quote, and returns the index after it.
func jsonUnescape(s string, i int) (string, int, bool) {
	// Its decoded form is no longer than its text, up to the closing
	// quote.
	end := i
	for end < len(s) && s[end] != '"' {
		if s[end] == '\\' {
			end++
		}
		end++
	}
	var b strings.Builder
	b.Grow(min(end, len(s)) - i)
	for j := i; j < len(s); {
		c := s[j]
		switch {
		case c == '"':
			// Escapes only add whole characters, never complete or
			// break raw ones: b is valid exactly when the raw text is.
			if !utf8.ValidString(b.String()) {
				return "", 0, false
			}
			return b.String(), j + 1, true
		case c < 0x20:
			return "", 0, false
		case c != '\\':
			b.WriteByte(c)
			j++
			continue
		}
		if j+1 == len(s) {
			return "", 0, false
		}
		switch e := s[j+1]; e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, ok := jsonw.Hex4(s[j+2:])
			if !ok || utf16.IsSurrogate(r) {
				return "", 0, false
			}
			b.WriteRune(r)
			j += 4
		default:
			return "", 0, false
		}
		j += 2
	}
	return "", 0, false
}

// skipJSONSpace returns the index of the first byte at or after i that is
// not JSON whitespace.
func skipJSONSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}
