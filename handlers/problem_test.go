package handlers_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/token"
)

func TestProblemTable(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{token.ErrBadRequest, 400, "invalid_request"},
		{handlers.ErrBadRequest, 400, "invalid_request"},
		{token.ErrInvalid, 401, "token_invalid"},
		{token.ErrExpired, 401, "token_expired"},
		{handlers.ErrUnauthorized, 401, "unauthorized"},
		{handlers.ErrSubjectNotAllowed, 403, "subject_not_allowed"},
		{token.ErrPurposeMismatch, 403, "purpose_mismatch"},
		{token.ErrSubjectMismatch, 403, "subject_mismatch"},
		{token.ErrUsed, 409, "token_used"},
		{handlers.ErrTooLarge, 413, "payload_too_large"},
		{handlers.ErrRateLimited, 429, "rate_limited"},
		{handlers.ErrUpstreamUnavailable, 502, "upstream_unavailable"},
		{token.ErrStoreFull, 503, "store_full"},
		{token.ErrUnavailable, 503, "store_unavailable"},
		{handlers.ErrNotFound, 404, "not_found"},
		{handlers.ErrMethodNotAllowed, 405, "method_not_allowed"},
		{errors.New("something unexpected"), 500, "internal_error"},
	}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			wrapped := fmt.Errorf("%w: some detail", tc.err)
			p := handlers.ProblemFor(wrapped)
			if p.Status != tc.status || p.Code != tc.code || p.Type != handlers.ProblemTypePrefix+tc.code || p.Title == "" {
				t.Fatalf("ProblemFor(%v) = %+v", wrapped, p)
			}
		})
	}
}

func TestServerErrorsHideInternals(t *testing.T) {
	err := fmt.Errorf("%w: %w", token.ErrUnavailable, errors.New("dial tcp 10.0.0.7:6379: connection refused"))
	p := handlers.ProblemFor(err)
	if strings.Contains(p.Detail, "10.0.0.7") || p.Detail == "" {
		t.Fatalf("detail = %q", p.Detail)
	}
	if p := handlers.ProblemFor(errors.New("secret internals")); strings.Contains(p.Detail, "secret") {
		t.Fatalf("500 detail leaks: %q", p.Detail)
	}
}

func TestClientErrorsExplain(t *testing.T) {
	p := handlers.ProblemFor(fmt.Errorf("%w: purpose must match x", token.ErrBadRequest))
	if p.Detail != "purpose must match x" {
		t.Fatalf("detail = %q", p.Detail)
	}
}

func TestWriteProblem(t *testing.T) {
	rec := httptest.NewRecorder()
	handlers.WriteProblem(rec, httptest.NewRequest(http.MethodPost, "/", nil), handlers.ErrUnauthorized)
	if rec.Code != 401 || rec.Header().Get("Content-Type") != "application/problem+json" || rec.Header().Get("WWW-Authenticate") == "" {
		t.Fatalf("= %d %v", rec.Code, rec.Header())
	}
}
