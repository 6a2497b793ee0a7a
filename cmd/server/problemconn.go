package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/replayguard/replayguard/problem"
)

// net/http answers a request it cannot hand to a handler (headers over
// MaxHeaderBytes, a control character in a header value, a malformed
// Host or request line, an unsupported Transfer-Encoding or HTTP
// version) itself, in text/plain, with one write on the connection
// (func (c *conn) serve in net/http/server.go):
//
//	"HTTP/1.1 " + status + errorHeaders + status            (431, 400)
//	"HTTP/1.1 400 Bad Request: " + reason + errorHeaders + "400 Bad Request: " + reason
//	"HTTP/1.1 501 Not Implemented" + errorHeaders + "Unsupported transfer encoding"
//
// problemListener's connections turn exactly such a write into the
// problem+json answer for it. net/http has no hook for these answers
// (golang/go#21548), and a handler never sees the request.
const errorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// maxErrorWrite bounds the writes worth looking at: net/http's error
// answers are short, fixed texts.
const maxErrorWrite = 512

// problemListener wraps a listener so that net/http's own error answers
// on its connections are problem+json, as every other answer of the
// server is. The http.Server must call problemConnState from its
// ConnState (newServer sets it), which tells a connection where a
// response ends.
type problemListener struct{ net.Listener }

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &problemConn{Conn: c}, nil
}

// problemConn is a connection whose first write of each response is
// looked at: net/http's error answers are always written whole, at a
// response's start (after the previous response was written out and
// the connection went idle), and are its last write on the connection.
// Every other write passes through untouched. It also measures each
// request's head as it is read (see head), for refuse.
type problemConn struct {
	net.Conn
	// responding is set from the first byte of a response until
	// net/http reports the connection idle again (problemConnState), so
	// that a response's own bytes (an app's body that happens to spell
	// an error answer) are never taken for one.
	responding atomic.Bool
	// head measures the head of the request being read. Reads are
	// net/http's, one at a time, and it resets head when the connection
	// goes idle, after the last read of the request before.
	head headScan
	// early is the byte net/http's background read took (while a
	// handler ran, to learn whether the client went away), which
	// starts the next request's head; hasEarly says there is one.
	early    [1]byte
	hasEarly bool
	// headLen and lineLen are the length of the last head head measured
	// and of its request line, for refuse on the handler's goroutine; 0
	// until its end was read.
	headLen, lineLen atomic.Int64
}

func (c *problemConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	switch {
	case !c.head.done:
		if c.head.scan(p[:n]) {
			c.lineLen.Store(int64(c.head.line1))
			c.headLen.Store(int64(c.head.n))
		}
	case n == 1 && len(p) == 1:
		// Past a head, only net/http's background read reads a single
		// byte: the next request's first, read before the connection
		// goes idle.
		c.early[0], c.hasEarly = p[0], true
	}
	return n, err
}

// headScan measures a request's head as its bytes are read: from the
// request line's first byte through the empty line that ends the header
// fields, line ends (CRLF, or a bare LF as net/http also takes) included.
// Empty lines before the request line, which net/http skips after a
// POST, are not counted.
type headScan struct {
	n     int  // bytes of the head so far
	lines int  // complete lines so far
	line  int  // bytes of the current line so far
	cr    bool // the current line's last byte so far is a CR
	line1 int  // length of the request line, line end excluded
	done  bool // the head ended, or grew past any head net/http takes
}

// scan reads p, the next bytes of the connection, and reports whether
// they ended the head. Past maxScanBytes it stops without an end.
func (h *headScan) scan(p []byte) bool {
	for len(p) > 0 {
		if h.n == 0 {
			p = bytes.TrimLeft(p, "\r\n")
			if len(p) == 0 {
				return false
			}
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			h.n += len(p)
			h.line += len(p)
			h.cr = p[len(p)-1] == '\r'
			break
		}
		h.n += i + 1
		length := h.line + i
		if i > 0 && p[i-1] == '\r' || i == 0 && h.cr {
			length--
		}
		h.lines++
		switch {
		case h.lines == 1:
			h.line1 = length
		case length == 0:
			h.done = true
			return true
		}
		h.line, h.cr, p = 0, false, p[i+1:]
	}
	if h.n > maxScanBytes {
		h.done = true
	}
	return false
}

// maxScanBytes bounds the bytes headScan looks at: more than any head
// net/http reads, even with a read buffer's worth read before it starts
// counting.
const maxScanBytes = maxHeadBytes + 2*headSlop

func (c *problemConn) Write(p []byte) (int, error) {
	if c.responding.Load() {
		return c.Conn.Write(p)
	}
	c.responding.Store(true)
	answer := problemAnswer(p)
	if answer == nil {
		return c.Conn.Write(p)
	}
	if _, err := c.Conn.Write(answer); err != nil {
		return 0, err
	}
	return len(p), nil
}

// ReadFrom keeps the connection's own ReadFrom (sendfile, splice) for
// response bodies, which net/http uses when the connection has one.
func (c *problemConn) ReadFrom(r io.Reader) (int64, error) {
	c.responding.Store(true)
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// CloseWrite half-closes the connection as net/http does after a 431, so
// that the client reads the answer before the connection is reset.
func (c *problemConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// problemConnState is the http.Server's ConnState: a connection that is
// idle has written its last response whole, so its next write starts a
// response.
func problemConnState(c net.Conn, state http.ConnState) {
	if pc, ok := c.(*problemConn); ok && state == http.StateIdle {
		pc.responding.Store(false)
		pc.head = headScan{}
		if pc.hasEarly {
			pc.head.scan(pc.early[:])
			pc.hasEarly = false
		}
		pc.headLen.Store(0)
		pc.lineLen.Store(0)
	}
}

// connKey is the request context key of the request's *problemConn.
type connKey struct{}

// problemConnContext is the http.Server's ConnContext: it gives refuse
// the connection a request came on.
func problemConnContext(ctx context.Context, c net.Conn) context.Context {
	if pc, ok := c.(*problemConn); ok {
		return context.WithValue(ctx, connKey{}, pc)
	}
	return ctx
}

// refuse answers, before h, the requests net/http hands on that the
// server refuses as it refuses those net/http answers itself, with
// problem+json and Connection: close, so that they reach neither the API
// nor, in gateway mode, the app:
//
//   - PRI * HTTP/2.0, the HTTP/2 connection preface's first line, which
//     net/http lets through (without the rest of the preface too), so
//     that a handler may take the connection over for HTTP/2; as for
//     every other HTTP/2 request line, 505 http_version_not_supported;
//   - a head over maxHeadBytes on a kept-alive connection: net/http
//     counts a head from where it starts reading it, which on a
//     kept-alive connection is after a read (of up to 4 KiB) that waits
//     for the request's first bytes, so it lets such a head run that much
//     over; 431 headers_too_large. The head is measured as it is read
//     (problemConn); its request line's length must match r's, which it
//     does unless the request was pipelined and read in part along with
//     the one before: then net/http's count is the only one.
func refuse(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var err error
		switch {
		case r.ProtoMajor != 1:
			err = problem.ErrHTTPVersion
		case headTooLarge(r):
			err = problem.ErrHeadersTooLarge
		default:
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		problem.Write(w, err)
	})
}

// headTooLarge reports whether r's head, as its connection measured it,
// is over maxHeadBytes.
func headTooLarge(r *http.Request) bool {
	pc, ok := r.Context().Value(connKey{}).(*problemConn)
	if !ok {
		return false
	}
	n, line := pc.headLen.Load(), pc.lineLen.Load()
	return n > maxHeadBytes && line == int64(len(r.Method)+len(r.RequestURI)+len(r.Proto)+2)
}

// problemAnswer returns the problem+json answer for p when p is one of
// net/http's error answers, else nil: same status, with
// application/problem+json, Cache-Control: no-store, Connection: close
// and Content-Length, and the problem package's body (a 400's reason,
// when net/http gave one, as its detail).
func problemAnswer(p []byte) []byte {
	const prefix = "HTTP/1.1 "
	// net/http's error answers are 4xx and 5xx: most responses stop at
	// their status's first digit.
	if len(p) <= len(prefix) || len(p) > maxErrorWrite || (p[len(prefix)] != '4' && p[len(prefix)] != '5') ||
		!bytes.HasPrefix(p, []byte(prefix)) {
		return nil
	}
	status, body, ok := bytes.Cut(p[len(prefix):], []byte(errorHeaders))
	if !ok {
		return nil
	}
	var err error
	switch s := string(status); {
	case s == "431 Request Header Fields Too Large" && string(body) == s:
		err = problem.ErrHeadersTooLarge
	case s == "400 Bad Request" && string(body) == s:
		err = problem.ErrBadRequest
	case s == "501 Not Implemented" && string(body) == "Unsupported transfer encoding":
		err = problem.ErrTransferEncoding
	case string(body) == s:
		// statusError: "<code> <text>: <reason>", twice.
		code, reason, ok := cutStatusError(s)
		switch {
		case !ok:
			return nil
		case code == http.StatusBadRequest:
			err = fmt.Errorf("%w: %s", problem.ErrBadRequest, reason)
		case code == http.StatusHTTPVersionNotSupported:
			err = problem.ErrHTTPVersion
		default:
			return nil
		}
	default:
		return nil
	}
	pr := problem.For(err)
	var jsb bytes.Buffer
	enc := json.NewEncoder(&jsb) // as problem.Write encodes: no HTML escaping, a final newline
	enc.SetEscapeHTML(false)
	if enc.Encode(pr) != nil {
		return nil
	}
	js := jsb.Bytes()
	var b bytes.Buffer
	b.Grow(256 + len(js))
	b.WriteString(prefix + strconv.Itoa(pr.Status) + " " + http.StatusText(pr.Status) + "\r\n")
	b.WriteString("Content-Type: application/problem+json\r\n")
	b.WriteString("Cache-Control: no-store\r\n")
	b.WriteString("Connection: close\r\n")
	b.WriteString("Date: " + time.Now().UTC().Format(http.TimeFormat) + "\r\n")
	b.WriteString("Content-Length: " + strconv.Itoa(len(js)) + "\r\n\r\n")
	b.Write(js)
	return b.Bytes()
}

// cutStatusError splits net/http's statusError status line,
// "<code> <status text>: <reason>", into its code and reason.
func cutStatusError(s string) (code int, reason string, ok bool) {
	if len(s) < 4 || s[3] != ' ' {
		return 0, "", false
	}
	code, err := strconv.Atoi(s[:3])
	if err != nil {
		return 0, "", false
	}
	reason, ok = strings.CutPrefix(s[4:], http.StatusText(code)+": ")
	return code, reason, ok && reason != ""
}
