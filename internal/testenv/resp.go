package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// respError is an error reply (-ERR ...) from a Redis server.
type respError string

func (e respError) Error() string { return string(e) }

// respDo is respDoTimeout with a 2s timeout, for quick commands and polls.
func respDo(ctx context.Context, addr string, args ...string) (any, error) {
	return respDoTimeout(ctx, 2*time.Second, addr, args...)
}

// respDoTimeout sends one command to the Redis (or Sentinel) at addr on a
// new connection and returns its reply: a string for a simple or bulk
// string, an int64, nil for a null, a []any for an array; an error reply
// is returned as a respError. The connection is closed after it, which
// matters for commands about the connection's own writes, such as WAIT:
// use respPipeline for those.
func respDoTimeout(ctx context.Context, timeout time.Duration, addr string, args ...string) (any, error) {
	v, err := respPipeline(ctx, timeout, addr, args)
	if err != nil {
		return nil, err
	}
	return v[0], nil
}

// respPipeline sends cmds, in order, on one new connection to the Redis
// (or Sentinel) at addr and returns their replies (see respDoTimeout); the
// first error reply ends it with that error. It is the few lines of RESP2
// that the helpers here need, so that polling a server neither keeps a
// pool open nor logs through a client library.
func respPipeline(ctx context.Context, timeout time.Duration, addr string, cmds ...[]string) ([]any, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	var b strings.Builder
	for _, args := range cmds {
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
	}
	if _, err := io.WriteString(c, b.String()); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	out := make([]any, len(cmds))
	for i := range cmds {
		v, err := readRESP(r)
		if err != nil {
			return nil, err
		}
		if e, ok := v.(respError); ok {
			return nil, e
		}
		out[i] = v
	}
	return out, nil
}

func readRESP(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("resp: empty line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return respError(line[1:]), nil
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, nil
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = readRESP(r); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	return nil, fmt.Errorf("resp: unexpected reply %q", line)
}

// pingRedis reports whether the server at addr answers PING with PONG
// (not with -LOADING or another error).
func pingRedis(ctx context.Context, addr string) bool {
	v, err := respDo(ctx, addr, "PING")
	return err == nil && v == "PONG"
}

// respMaps turns an array of flat field/value arrays (SENTINEL REPLICAS,
// SENTINEL SENTINELS) into maps.
func respMaps(v any) []map[string]string {
	a, _ := v.([]any)
	out := make([]map[string]string, 0, len(a))
	for _, e := range a {
		out = append(out, respMap(e))
	}
	return out
}

// respMap turns a flat field/value array (SENTINEL MASTER) into a map.
func respMap(v any) map[string]string {
	a, _ := v.([]any)
	m := make(map[string]string, len(a)/2)
	for i := 0; i+1 < len(a); i += 2 {
		k, _ := a[i].(string)
		val, _ := a[i+1].(string)
		m[k] = val
	}
	return m
}

// hasFlag reports whether the comma-separated Sentinel flags hold f.
func hasFlag(flags, f string) bool {
	for _, x := range strings.Split(flags, ",") {
		if x == f {
			return true
		}
	}
	return false
}
