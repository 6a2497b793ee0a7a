package main

import (
	"bytes"
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
// Every other write passes through untouched.
type problemConn struct {
	net.Conn
	// responding is set from the first byte of a response until
	// net/http reports the connection idle again (problemConnState), so
	// that a response's own bytes (an app's body that happens to spell
	// an error answer) are never taken for one.
	responding atomic.Bool
}

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
	}
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
