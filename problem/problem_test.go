package problem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/webhook"
)

func TestProblemTable(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{token.ErrBadRequest, 400, "invalid_request"},
		{problem.ErrBadRequest, 400, "invalid_request"},
		{webhook.ErrNoID, 400, "invalid_request"},
		{webhook.ErrMissing, 401, "signature_missing"},
		{webhook.ErrInvalid, 401, "signature_invalid"},
		{webhook.ErrExpired, 401, "signature_expired"},
		{token.ErrInvalid, 401, "token_invalid"},
		{token.ErrExpired, 401, "token_expired"},
		{problem.ErrUnauthorized, 401, "unauthorized"},
		{problem.ErrSubjectNotAllowed, 403, "subject_not_allowed"},
		{token.ErrPurposeMismatch, 403, "purpose_mismatch"},
		{token.ErrSubjectMismatch, 403, "subject_mismatch"},
		{token.ErrUsed, 409, "token_used"},
		{problem.ErrTooLarge, 413, "payload_too_large"},
		{problem.ErrRateLimited, 429, "rate_limited"},
		{problem.ErrHeadersTooLarge, 431, "headers_too_large"},
		{problem.ErrTransferEncoding, 501, "unsupported_transfer_encoding"},
		{problem.ErrHTTPVersion, 505, "http_version_not_supported"},
		{problem.ErrUpstreamUnavailable, 502, "upstream_unavailable"},
		{store.ErrFull, 503, "store_full"},
		{store.ErrUnavailable, 503, "store_unavailable"},
		{problem.ErrNotFound, 404, "not_found"},
		{problem.ErrMethodNotAllowed, 405, "method_not_allowed"},
		{errors.New("something unexpected"), 500, "internal_error"},
	}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			wrapped := fmt.Errorf("%w: some detail", tc.err)
			p := problem.For(wrapped)
			if p.Status != tc.status || p.Code != tc.code || p.Type != problem.TypePrefix+tc.code || p.Title == "" {
				t.Fatalf("For(%v) = %+v", wrapped, p)
			}
			if got := problem.Code(wrapped); got != tc.code {
				t.Fatalf("Code(%v) = %q, want %q", wrapped, got, tc.code)
			}
		})
	}
}

func TestServerErrorsHideInternals(t *testing.T) {
	err := fmt.Errorf("%w: %w", store.ErrUnavailable, errors.New("dial tcp 10.0.0.7:6379: connection refused"))
	p := problem.For(err)
	if strings.Contains(p.Detail, "10.0.0.7") || p.Detail == "" {
		t.Fatalf("detail = %q", p.Detail)
	}
	if p := problem.For(errors.New("secret internals")); strings.Contains(p.Detail, "secret") {
		t.Fatalf("500 detail leaks: %q", p.Detail)
	}
}

func TestClientErrorsExplain(t *testing.T) {
	p := problem.For(fmt.Errorf("%w: purpose must match x", token.ErrBadRequest))
	if p.Detail != "purpose must match x" {
		t.Fatalf("detail = %q", p.Detail)
	}
}

func TestWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	problem.Write(rec, problem.ErrUnauthorized)
	if rec.Code != 401 || rec.Header().Get("Content-Type") != "application/problem+json" || rec.Header().Get("WWW-Authenticate") == "" {
		t.Fatalf("= %d %v", rec.Code, rec.Header())
	}
	// The body is for curl and logs as much as for JSON parsers: HTML's
	// characters are written as they are, not as \u003c escapes.
	if want := `"detail":"send Authorization: Bearer <API key>"`; !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("body = %s, want it to hold %s", rec.Body, want)
	}
}

func TestIdempotencyProblems(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{idempotency.ErrKeyMissing, 400, "idempotency_key_missing"},
		{idempotency.ErrInvalidKey, 400, "invalid_idempotency_key"},
		{idempotency.ErrFingerprintMismatch, 422, "idempotency_key_reused"},
		{idempotency.ErrInProgress, 409, "request_in_progress"},
		{idempotency.ErrNotStored, 409, "response_not_stored"},
		{idempotency.ErrNotProcessing, 409, "record_not_processing"},
		{store.ErrUnavailable, 503, "store_unavailable"},
		{store.ErrFull, 503, "store_full"},
		{idempotency.ErrCorrupt, 500, "internal_error"},
	}
	for _, tc := range tests {
		for _, err := range []error{tc.err, fmt.Errorf("%w: detail", tc.err)} {
			p := problem.For(err)
			if p.Status != tc.status || p.Code != tc.code || p.Detail == "" {
				t.Errorf("For(%v) = %+v, want %d %s", err, p, tc.status, tc.code)
			}
		}
	}
}

func TestSignatureProblems(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{replay.ErrMissing, 401, "signature_missing"},
		{replay.ErrInvalid, 401, "signature_invalid"},
		{replay.ErrExpired, 401, "signature_expired"},
		{replay.ErrReplayed, 401, "replayed_request"},
		{store.ErrUnavailable, 503, "store_unavailable"},
	}
	for _, tc := range tests {
		t.Run(tc.code, func(t *testing.T) {
			err := fmt.Errorf("%w: some detail", tc.err)
			p := problem.For(err)
			if p.Status != tc.status || p.Code != tc.code || p.Type != problem.TypePrefix+tc.code || p.Title == "" || p.Detail == "" {
				t.Fatalf("For(%v) = %+v", err, p)
			}
			rec := httptest.NewRecorder()
			problem.Write(rec, err)
			if wa := rec.Header().Get("WWW-Authenticate"); (tc.status == 401) != strings.HasPrefix(wa, "Signature") {
				t.Errorf("WWW-Authenticate = %q", wa)
			}
		})
	}

	t.Run("signature_expired carries the server time in UTC and the reason", func(t *testing.T) {
		at := time.Date(2026, 11, 22, 11, 30, 5, 123, time.FixedZone("CET", 3600))
		err := fmt.Errorf("verify: %w", &replay.ExpiredError{ServerTime: at, Reason: replay.ErrExpired.Error() + ": created 360s before the server's time"})
		p := problem.For(err)
		if p.Code != "signature_expired" || p.ServerTime != "2026-11-22T10:30:05Z" || p.Detail != "created 360s before the server's time" {
			t.Fatalf("For = %+v", p)
		}
		rec := httptest.NewRecorder()
		problem.Write(rec, err)
		var body map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body["server_time"] != "2026-11-22T10:30:05Z" {
			t.Fatalf("body = %s (%v)", rec.Body, err)
		}
	})

	t.Run("other problems have no server_time member", func(t *testing.T) {
		rec := httptest.NewRecorder()
		problem.Write(rec, replay.ErrReplayed)
		if strings.Contains(rec.Body.String(), "server_time") {
			t.Fatalf("body = %s", rec.Body)
		}
	})
}

// For is the one table from errors to HTTP answers. A store that cannot
// confirm is 503 with a fixed detail: the store's own error never reaches
// the client.
func ExampleFor() {
	for _, err := range []error{
		token.ErrUsed,
		fmt.Errorf("%w: dial tcp 10.0.0.7:6379: connection refused", store.ErrUnavailable),
	} {
		p := problem.For(err)
		fmt.Println(p.Status, p.Type)
		fmt.Printf("  detail: %q\n", p.Detail)
	}
	// Output:
	// 409 urn:replayguard:problem:token_used
	//   detail: "the token was already redeemed; fetch a new token for a new request"
	// 503 urn:replayguard:problem:store_unavailable
	//   detail: "the store did not confirm the operation; nothing was done; retry later"
}

// TestStoreFailuresReadTheSameOnEveryPath: a store failure is one row of
// the table whatever path met it, so a token route's 503 no longer speaks
// of an idempotency record, and a full store is store_full for tokens,
// nonces and records alike.
func TestStoreFailuresReadTheSameOnEveryPath(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code string
	}{
		{store.Unavailable("redis: redeem", errors.New("i/o timeout")), "store_unavailable"},
		{fmt.Errorf("%w: redis: acquire: OOM command not allowed", store.ErrFull), "store_full"},
		{store.ErrFull, "store_full"},
		{store.ErrClosed, "store_unavailable"},
	} {
		p := problem.For(tc.err)
		if p.Code != tc.code || p.Status != 503 || strings.Contains(strings.ToLower(p.Detail), "idempotency") || strings.Contains(strings.ToLower(p.Detail), "token") {
			t.Errorf("For(%v) = %+v, want %s with a detail that names no kind of entry", tc.err, p, tc.code)
		}
	}
}

// TestOperatorProblems: the refusals of the operators' endpoints.
func TestOperatorProblems(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		code   string
	}{
		{problem.ErrRecordNotFound, 404, "record_not_found"},
		{idempotency.ErrBadRecordID, 400, "invalid_request"},
		{idempotency.ErrNotProcessing, 409, "record_not_processing"},
	} {
		for _, err := range []error{tc.err, fmt.Errorf("%w: detail", tc.err)} {
			if p := problem.For(err); p.Status != tc.status || p.Code != tc.code || p.Detail == "" {
				t.Errorf("For(%v) = %+v, want %d %s", err, p, tc.status, tc.code)
			}
		}
	}
}

// TestRecordID: the key of the record a request met rides in the value
// WithRequestID puts in its context, and comes back as the record's
// printable ID; without WithRequestID, SetRecordKey does nothing.
func TestRecordID(t *testing.T) {
	problem.SetRecordKey(context.Background(), "idem:x") // no request ID: no panic
	ctx := problem.WithRequestID(context.Background(), "req-1")
	if id := problem.RecordID(ctx); id != "" {
		t.Fatalf("RecordID before any record = %q", id)
	}
	problem.SetRecordKey(context.WithValue(ctx, struct{}{}, 1), store.TokenRecordKey("648159969924932521")) // a derived context
	if id, rid := problem.RecordID(ctx), problem.RequestID(ctx); id != "token:648159969924932521" || rid != "req-1" {
		t.Fatalf("RecordID = %q, RequestID = %q", id, rid)
	}
	if id := problem.RecordID(context.Background()); id != "" {
		t.Fatalf("RecordID without a request ID = %q", id)
	}
}
