package handlers

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/gin-gonic/gin"

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
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusOK, verifyResponse{Status: "verified", KeyID: res.KeyID, Created: res.Created.Unix(), Nonce: res.Nonce})
	return "verified", nil
}

// readVerifyRequest decodes and checks the body of POST
// /v1/signatures/verify into the message to verify.
func readVerifyRequest(r *http.Request) (replay.Message, error) {
	var body verifyRequest
	if err := readJSON(r, &body, MaxBodyBytes); err != nil {
		return replay.Message{}, err
	}
	if body.Method == "" {
		return replay.Message{}, fmt.Errorf("%w: \"method\" is required", problem.ErrBadRequest)
	}
	if !request.IsToken(body.Method) {
		return replay.Message{}, fmt.Errorf("%w: \"method\" is not an HTTP method", problem.ErrBadRequest)
	}
	u, err := url.Parse(body.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return replay.Message{}, fmt.Errorf("%w: \"url\" must be an absolute http or https URL, such as https://api.example.com/v1/orders?id=7", problem.ErrBadRequest)
	}
	if u.User != nil || u.Fragment != "" || strings.Contains(body.URL, "#") {
		return replay.Message{}, fmt.Errorf("%w: \"url\" must not carry user information or a fragment", problem.ErrBadRequest)
	}
	h := make(http.Header, len(body.Headers))
	for name, value := range body.Headers {
		if !request.IsToken(name) {
			return replay.Message{}, fmt.Errorf("%w: %q is not a header name", problem.ErrBadRequest, name)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return replay.Message{}, fmt.Errorf("%w: the value of header %q holds a line break or NUL", problem.ErrBadRequest, name)
		}
		key := http.CanonicalHeaderKey(name)
		if _, dup := h[key]; dup {
			return replay.Message{}, fmt.Errorf("%w: header %q is given twice (names are case-insensitive); join the values with \", \"", problem.ErrBadRequest, name)
		}
		h[key] = []string{value}
	}
	var data []byte
	if body.Body != "" {
		if data, err = base64.StdEncoding.DecodeString(body.Body); err != nil {
			return replay.Message{}, fmt.Errorf("%w: \"body\" is not standard base64", problem.ErrBadRequest)
		}
	}
	return replay.Message{Method: body.Method, URL: u, Header: h, Body: data}, nil
}
