package handlers

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
)

// referenceReadVerifyRequest is readVerifyRequest as it was before
// decodeVerifyBody: readJSON, then the checks, over the headers' map. It
// checks the headers in every order at once: when which header is
// refused depends on the map's order, it returns, besides
// problem.ErrBadRequest, every refusal some order gives (alts).
func referenceReadVerifyRequest(r *http.Request) (m replay.Message, alts []string, err error) {
	var body verifyRequest
	if err := readJSON(r, &body, MaxBodyBytes); err != nil {
		return replay.Message{}, nil, err
	}
	if body.Method == "" {
		return replay.Message{}, nil, fmt.Errorf("%w: \"method\" is required", problem.ErrBadRequest)
	}
	if !request.IsToken(body.Method) {
		return replay.Message{}, nil, fmt.Errorf("%w: \"method\" is not an HTTP method", problem.ErrBadRequest)
	}
	u, err := url.Parse(body.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return replay.Message{}, nil, fmt.Errorf("%w: \"url\" must be an absolute http or https URL, such as https://api.example.com/v1/orders?id=7", problem.ErrBadRequest)
	}
	if u.User != nil || u.Fragment != "" || strings.Contains(body.URL, "#") {
		return replay.Message{}, nil, fmt.Errorf("%w: \"url\" must not carry user information or a fragment", problem.ErrBadRequest)
	}
	h := make(http.Header, len(body.Headers))
	names := map[string][]string{} // canonical name -> the names that pass
	for name, value := range body.Headers {
		switch {
		case !request.IsToken(name):
			alts = append(alts, fmt.Errorf("%w: %q is not a header name", problem.ErrBadRequest, name).Error())
		case strings.ContainsAny(value, "\r\n\x00"):
			alts = append(alts, fmt.Errorf("%w: the value of header %q holds a line break or NUL", problem.ErrBadRequest, name).Error())
		default:
			key := http.CanonicalHeaderKey(name)
			names[key] = append(names[key], name)
			h[key] = []string{value}
		}
	}
	for _, ns := range names {
		if len(ns) > 1 { // any of them may come second
			for _, name := range ns {
				alts = append(alts, fmt.Errorf("%w: header %q is given twice (names are case-insensitive); join the values with \", \"", problem.ErrBadRequest, name).Error())
			}
		}
	}
	if len(alts) > 0 {
		return replay.Message{}, alts, problem.ErrBadRequest
	}
	var data []byte
	if body.Body != "" {
		if data, err = base64.StdEncoding.DecodeString(body.Body); err != nil {
			return replay.Message{}, nil, fmt.Errorf("%w: \"body\" is not standard base64", problem.ErrBadRequest)
		}
	}
	return replay.Message{Method: body.Method, URL: u, Header: h, Body: data}, nil, nil
}

// verifyBodySeeds are verify bodies: signed requests as json.Marshal and
// as Node's JSON.stringify write them, the same respelled in every way
// decodeVerifyBody leaves to readJSON, and malformed ones.
func verifyBodySeeds(t testing.TB) [][]byte {
	signer, err := replay.NewSigner("partner-1", replay.AlgHMACSHA256, []byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, "https://api.example.com/v1/orders?id=7", strings.NewReader(`{"item":"book"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Note", "<café & 🍰>")
	if err := signer.Sign(req); err != nil {
		t.Fatal(err)
	}
	headers := map[string]string{}
	for name := range req.Header {
		headers[name] = req.Header.Get(name)
	}
	body := base64.StdEncoding.EncodeToString([]byte(`{"item":"book"}`))
	good, err := json.Marshal(verifyRequest{Method: "POST", URL: req.URL.String(), Headers: headers, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	// As Node writes it: lower-case names, no escaping of <, > and &.
	var node bytes.Buffer
	enc := json.NewEncoder(&node)
	enc.SetEscapeHTML(false)
	lower := map[string]string{}
	for name, v := range headers {
		lower[strings.ToLower(name)] = v
	}
	if err := enc.Encode(map[string]any{"method": "POST", "url": req.URL.String(), "headers": lower, "body": body}); err != nil {
		t.Fatal(err)
	}
	g := string(good)
	respell := func(old, new string) []byte { return []byte(strings.Replace(g, old, new, 1)) }
	seeds := [][]byte{good, node.Bytes(), []byte(" \r\n\t" + g + " \n")}
	for _, s := range [][]byte{
		// Valid, but not what decodeVerifyBody reads.
		respell(`"method"`, `"Method"`),
		respell(`"method"`, `"METHOD"`),
		respell(`"url"`, `"\u0075rl"`),
		respell(`"headers"`, `"headerſ"`),
		respell(`{"body"`, `{"method":"GET","body"`),
		respell(`{"body"`, `{"headers":{"X-A":"1"},"body"`),
		respell(`{"body"`, `{"trailers":{},"body"`),
		respell(`"Content-Type":"application/json"`, `"Content-Type":"application/json","Content-Type":"text/plain"`),
		respell(`"Content-Type":"application/json"`, `"Content-Type":"application/json","content-type":"text/plain"`),
		respell(`"Content-Type":"application/json"`, `"Content-Type":null`),
		respell(`"Content-Type":"application/json"`, `"Content-Type":"\ud83c\udf70"`),
		respell(`"Content-Type":"application/json"`, `"Content-Type":"\ud83c"`),
		respell(`"Content-Type":"application/json"`, `"Content-Type":"\u00e9\u0000\/\b\f\n\r\t"`),
		respell(`"Content-Type":"application/json"`, "\"Content-Type\":\"a\xffb\""),
		respell(`"Content-Type":"application/json"`, "\"Content-Type\":\"\xed\xa0\x80\""),
		respell(`"Content-Type":"application/json"`, "\"Content-Type\":\"a\tb\""),
		respell(`"Content-Type":"application/json"`, `"Content Type":"x","X-B":"a\r\nb"`),
		respell(`"method":"POST"`, `"method":null`),
		respell(`"method":"POST"`, `"method":1`),
		respell(`"headers":{`, `"headers":null,"x":{`),
		respell(`"body":"`, `"body":"!`),
		respell(`"url":"https://`, `"url":"https://user@`),
		[]byte(g + "}"),
		[]byte(g + "]"),
		[]byte(g + "{}"),
		[]byte(g + " x"),
		[]byte("\ufeff" + g),
		[]byte(g + "\u00a0"),
		// Malformed, or short of a field.
		nil,
		[]byte(" "),
		[]byte("\u00a0"),
		[]byte("{}"),
		[]byte("null"),
		[]byte(`[]`),
		[]byte(`{"method":"POST"`),
		[]byte(`{"method":"POST",}`),
		[]byte(`{"method":"PO ST","url":"https://a.example/"}`),
		[]byte(`{"method":"POST","url":"/v1"}`),
		[]byte(`{"method":"POST","url":"https://a.example/","headers":{"X-A":"1","x-a":"2","X-B":"\n"}}`),
		[]byte(`{"method":"POST","url":"https://a.example/","headers":{},"body":""}`),
		[]byte(`{"method":"POST","url":"https://a.example/","headers":{"a":"\u"}}`),
	} {
		seeds = append(seeds, s)
	}
	return seeds
}

// FuzzReadVerifyRequestMatchesReadJSON holds readVerifyRequest to the
// decoding it replaced (referenceReadVerifyRequest): for any body, the
// same message, or the same refusal, word for word (for a refused
// header, one that some order of the old map gives). Run it with
//
//	go test -fuzz=FuzzReadVerifyRequestMatchesReadJSON ./handlers/
//
// The seeds run in the normal suite.
func FuzzReadVerifyRequestMatchesReadJSON(f *testing.F) {
	for _, s := range verifyBodySeeds(f) {
		f.Add(s)
	}
	newRequest := func(data []byte) *http.Request {
		return httptest.NewRequest(http.MethodPost, "/v1/signatures/verify", bytes.NewReader(data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gotErr := readVerifyRequest(newRequest(data))
		want, alts, wantErr := referenceReadVerifyRequest(newRequest(data))
		switch {
		case alts != nil:
			if gotErr == nil || !slices.Contains(alts, gotErr.Error()) || problem.Code(gotErr) != problem.Code(wantErr) {
				t.Fatalf("readVerifyRequest = %v, want one of %q", gotErr, alts)
			}
		case wantErr != nil || gotErr != nil:
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || problem.Code(gotErr) != problem.Code(wantErr) ||
				errors.Is(gotErr, problem.ErrTooLarge) != errors.Is(wantErr, problem.ErrTooLarge) {
				t.Fatalf("readVerifyRequest = %v, want %v", gotErr, wantErr)
			}
		default:
			if got.Method != want.Method || !reflect.DeepEqual(got.URL, want.URL) || !reflect.DeepEqual(got.Header, want.Header) || !bytes.Equal(got.Body, want.Body) {
				t.Fatalf("readVerifyRequest = %+v\nwant %+v", got, want)
			}
		}
	})
}

// TestDecodeVerifyBodyReadsWhatClientsSend makes sure the fast decoder
// is the one that runs on usual bodies (so that the fuzz test compares
// it, not readJSON with itself), and leaves unusual ones to readJSON.
func TestDecodeVerifyBodyReadsWhatClientsSend(t *testing.T) {
	seeds := verifyBodySeeds(t)
	tests := []struct {
		name string
		body []byte
		want bool
	}{
		{"json.Marshal's", seeds[0], true},
		{"Node's", seeds[1], true},
		{"with whitespace around", seeds[2], true},
		{"escapes", []byte(`{"method":"POST","headers":{"a\"b":"\u00e9\u0000\/\b\f\n\r\t\\"}}`), true},
		{"non-ASCII", []byte(`{"headers":{"X-A":"café 🍰"}}`), true},
		{"no members", []byte(`{}`), false},
		{"a member in another case", []byte(`{"Method":"POST"}`), false},
		{"an escaped member name", []byte(`{"\u006dethod":"POST"}`), false},
		{"an unknown member", []byte(`{"method":"POST","x":1}`), false},
		{"a repeated member", []byte(`{"method":"POST","method":"GET"}`), false},
		{"a repeated header", []byte(`{"headers":{"a":"1","a":"2"}}`), false},
		{"null", []byte(`{"method":null}`), false},
		{"an escaped surrogate pair", []byte(`{"method":"\ud83c\udf70"}`), false},
		{"invalid UTF-8", []byte("{\"method\":\"\xff\"}"), false},
		{"a control character", []byte("{\"method\":\"\t\"}"), false},
		{"a second value", []byte(`{"method":"POST"} {}`), false},
		{"a stray brace after", []byte(`{"method":"POST"}}`), false},
		{"too many headers", []byte(`{"headers":{` + strings.Repeat(`"a":"",`, maxFastHeaders) + `"b":""}}`), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, ok := decodeVerifyBody(tc.body)
			if ok != tc.want {
				t.Fatalf("decodeVerifyBody(%s) ok = %v, want %v", tc.body, ok, tc.want)
			}
			if !ok {
				return
			}
			var want verifyRequest
			if err := json.Unmarshal(tc.body, &want); err != nil {
				t.Fatal(err)
			}
			got := verifyRequest{Method: f.method, URL: f.url, Body: f.body}
			if f.headers != nil || want.Headers != nil {
				got.Headers = map[string]string{}
			}
			for _, h := range f.headers {
				got.Headers[h.name] = h.value
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decodeVerifyBody = %+v, encoding/json %+v", got, want)
			}
		})
	}
}

// TestVerifyAnswerIsWhatJSONMarshalWrites compares the hand-written
// verify answer with encoding/json's (c.JSON's before), byte for byte.
func TestVerifyAnswerIsWhatJSONMarshalWrites(t *testing.T) {
	for _, r := range []verifyResponse{
		{Status: "verified", KeyID: "partner-1", Created: 1772600767, Nonce: "n0nce-_~"},
		{Status: "verified", KeyID: `k "1" \ <&>`, Created: -1, Nonce: "\x00\b\f\n\r\t\x1f\x7f"},
		{Status: "verified", KeyID: "café \u2028\u2029", Created: 0, Nonce: "\xff\xfe"},
		{},
	} {
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.appendJSON(nil); string(got) != string(want) {
			t.Errorf("appendJSON = %s\nwant         %s", got, want)
		}
	}
}

// TestCanonicalHeaderKeyIsNetHTTPs checks canonicalHeaderKey against
// http.CanonicalHeaderKey for tokens.
func TestCanonicalHeaderKeyIsNetHTTPs(t *testing.T) {
	for _, name := range []string{
		"signature-input", "SIGNATURE-INPUT", "Signature-Input", "sIgNaTuRe", "content-digest",
		"Content-Type", "x-a", "signature-inputs", "signature_input", "a-b-c", "--", "x",
	} {
		if got, want := canonicalHeaderKey(name), http.CanonicalHeaderKey(name); got != want {
			t.Errorf("canonicalHeaderKey(%q) = %q, want %q", name, got, want)
		}
	}
}
