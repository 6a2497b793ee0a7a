package redis

import (
	"strings"
	"testing"
)

// TestUnexpectedReplyTellsTheShapeOnly: a malformed reply may hold a
// stored response; the error names its shape, never its bytes.
func TestUnexpectedReplyTellsTheShapeOnly(t *testing.T) {
	err := unexpectedReply("acquire", []any{int64(0), "c", "fp", "owner", "Set-Cookie: session=s3cret", nil})
	got := err.Error()
	if strings.Contains(got, "s3cret") || strings.Contains(got, "owner") {
		t.Fatalf("the error reveals the reply's content: %s", got)
	}
	if want := "store: unavailable: redis: acquire: unexpected script reply [0 string(1 bytes) string(2 bytes) string(5 bytes) string(26 bytes) <nil>]"; got != want {
		t.Fatalf("error = %q, want %q", got, want)
	}
}
