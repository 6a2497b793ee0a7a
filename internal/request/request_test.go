package request_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/problem"
)

// TestBodyError: an error reading a body from the client is the
// client's: 413 past a limit, else 400, with a detail that never names
// the server's address.
func TestBodyError(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 8080}
	tests := []struct {
		name   string
		err    error
		want   error
		detail string
	}{
		{"a body over a MaxBytesReader's limit", &http.MaxBytesError{Limit: 4}, problem.ErrTooLarge, "the body is over 4 bytes"},
		{"a malformed chunked encoding", errors.New("malformed chunked encoding"), problem.ErrBadRequest, "reading the body: malformed chunked encoding"},
		{"a body cut short", io.ErrUnexpectedEOF, problem.ErrBadRequest, "reading the body: unexpected EOF"},
		{"a read timeout", &net.OpError{Op: "read", Net: "tcp", Addr: addr, Err: os.ErrDeadlineExceeded}, problem.ErrBadRequest, "the body did not arrive in time"},
		{"a reset connection", &net.OpError{Op: "read", Net: "tcp", Addr: addr, Err: syscall.ECONNRESET}, problem.ErrBadRequest, "the connection failed while the body was read"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := request.BodyError(tc.err)
			p := problem.For(err)
			if !errors.Is(err, tc.want) || p.Detail != tc.detail {
				t.Fatalf("= %v (detail %q), want %v with %q", err, p.Detail, tc.want, tc.detail)
			}
			if strings.Contains(p.Detail, "10.0.0.5") {
				t.Fatalf("the detail names the server's address: %q", p.Detail)
			}
		})
	}
}
