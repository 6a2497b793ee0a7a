// Package request holds the steps every HTTP part of Replayguard takes
// on an incoming request the same way: reading its body within a limit,
// finding the client's IP and its network, and checking RFC 9110 tokens.
package request

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/replayguard/replayguard/problem"
)

// ReadBody reads r's body, at most limit bytes, and puts it back in
// r.Body, unread, with a GetBody that gives it again (so a proxy can send
// it once more). A request without a body, or with an empty one, gives
// nil. A body over limit is problem.ErrTooLarge, whatever its
// Content-Length says; a body that cannot be read is
// problem.ErrBadRequest.
func ReadBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	tooLarge := func() error {
		return fmt.Errorf("%w: the body is over %d bytes, the most this route reads", problem.ErrTooLarge, limit)
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, BodyError(err)
	}
	if int64(len(data)) > limit {
		return nil, tooLarge()
	}
	_ = r.Body.Close()
	if len(data) == 0 {
		r.Body, r.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
		return nil, nil
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	return data, nil
}

// BodyError is the problem for err, an error reading a request's body
// from its client: problem.ErrTooLarge for a body over an
// http.MaxBytesReader's limit, else problem.ErrBadRequest with err's
// text (a malformed chunked encoding, a body cut short), or a fixed text
// for an error of the connection (a read timeout), whose text names the
// server's own address.
func BodyError(err error) error {
	if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return fmt.Errorf("%w: the body is over %d bytes", problem.ErrTooLarge, mbe.Limit)
	}
	if ne, ok := errors.AsType[net.Error](err); ok {
		if ne.Timeout() {
			return fmt.Errorf("%w: the body did not arrive in time", problem.ErrBadRequest)
		}
		return fmt.Errorf("%w: the connection failed while the body was read", problem.ErrBadRequest)
	}
	return fmt.Errorf("%w: reading the body: %v", problem.ErrBadRequest, err)
}

type clientIPKey struct{}

// WithClientIP returns a shallow copy of r that carries ip as its
// client's IP, for a router that knows better than r.RemoteAddr (one that
// believes its trusted proxies' X-Forwarded-For, as gin's ClientIP does).
func WithClientIP(r *http.Request, ip string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), clientIPKey{}, ip))
}

// ClientIP returns the IP of r's client: the one WithClientIP set, else
// the host of r.RemoteAddr.
func ClientIP(r *http.Request) string {
	if ip, _ := r.Context().Value(clientIPKey{}).(string); ip != "" {
		return ip
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// Network returns the network an IP belongs to, for counting clients: an
// IPv4 address is its own network, an IPv6 one is counted per /64 (as
// "2001:db8::/64"), the block one host gets, so that a host cannot dodge
// a bound by rotating its interface ID. A string that is no IP is
// returned as it is.
func Network(ip string) string {
	addr := net.ParseIP(ip)
	if addr == nil || addr.To4() != nil {
		return ip
	}
	return addr.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// IsToken reports whether s is an RFC 9110 token, the syntax of methods
// and header names.
func IsToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tchar[s[i]] {
			return false
		}
	}
	return true
}

// tchar marks the bytes RFC 9110 allows in a token.
var tchar = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// ValidFieldValue reports whether v may be an HTTP field value: no
// control characters but horizontal tab.
func ValidFieldValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if b := v[i]; b < ' ' && b != '\t' || b == 0x7f {
			return false
		}
	}
	return true
}
