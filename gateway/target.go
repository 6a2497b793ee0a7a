package gateway

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/replayguard/replayguard/problem"
)

// Why checkTarget refuses a request; each is problem.ErrBadRequest (400
// invalid_request) with the reason as its detail.
var (
	errHostMalformed = fmt.Errorf("%w: malformed Host header: want a host name, an IPv4 address or an IPv6 address in brackets, with at most one port of digits", problem.ErrBadRequest)
	errHostMissing   = fmt.Errorf("%w: a Host header is required: this gateway routes by host", problem.ErrBadRequest)
	errBackslash     = fmt.Errorf("%w: the path contains a backslash (\\ or %%5C), which some servers read as a slash", problem.ErrBadRequest)
	errSemicolon     = fmt.Errorf("%w: the path contains a semicolon (; or %%3B), which some servers read as the start of path parameters, so that /x/..;/ is /x/../", problem.ErrBadRequest)
	errDoubleEncoded = fmt.Errorf("%w: the path contains a percent-encoded %%2e, %%2f, %%5c or %%3b (as %%252e), which servers that decode twice read as . / \\ or ;", problem.ErrBadRequest)
	errControl       = fmt.Errorf("%w: the path contains a control character (%%00 to %%1F, or %%7F)", problem.ErrBadRequest)
)

// checkTarget refuses a request-target or Host that no real client sends
// and that the app, or a server in front of it, may read as another path
// or host than the one the gateway matched, so that a route's policy
// would be gone around. It does not guess how the app reads them:
//
//   - a Host that is not host[:port] (brackets only around an IPv6
//     literal, no comma, one port of digits, no empty labels): nginx reads
//     shop.test:80:80 as shop.test, others [shop.test] or .shop.test;
//   - no Host (HTTP/1.0, or an empty header) when a route has a host
//     pattern: the request cannot match a host route, yet the app may
//     serve it as that host (its default);
//   - a backslash in the path, raw or as %5C: Windows servers, WHATWG URL
//     parsers (Node.js's URL) and some frameworks read it as a slash;
//   - a semicolon in any path segment, raw or as %3B: Tomcat, Jetty and
//     Spring drop ;parameters from segments, so /x/..;/checkout is
//     /checkout to them (Spring Security's default firewall refuses it
//     too);
//   - a double-encoded dot, slash, backslash or semicolon (%252e, %252f,
//     %255c, %253b): servers that decode twice read them as the
//     character;
//   - a control character, which only arrives percent-encoded (%00):
//     servers written in C may end the path there.
//
// The path is checked decoded (Request.URL.Path), so %5C and %3B are
// caught as \ and ;, and %252e as %2e.
func checkTarget(r *http.Request, hostRoutes bool) error {
	switch {
	case r.Host == "":
		if hostRoutes {
			return errHostMissing
		}
	case !validHost(r.Host):
		return errHostMalformed
	}
	p := r.URL.Path
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\':
			return errBackslash
		case c == ';':
			return errSemicolon
		case c < 0x20 || c == 0x7f:
			return errControl
		case c == '%' && i+2 < len(p) && encodesSpecial(p[i+1], p[i+2]):
			return errDoubleEncoded
		}
	}
	return nil
}

// encodesSpecial reports whether %ab encodes '.', '/', '\' or ';'.
func encodesSpecial(a, b byte) bool {
	b |= 0x20 // lowercase a letter; digits are unchanged
	switch a {
	case '2':
		return b == 'e' || b == 'f'
	case '3':
		return b == 'b'
	case '5':
		return b == 'c'
	}
	return false
}

// validHost reports whether host is a Host header a client sends: a
// name of letters, digits, '-' and '_' in non-empty dot-separated labels
// (an IPv4 address is one), with at most one trailing dot, or an IPv6
// address without a zone in brackets; then optionally ':' and a port of 1
// to 5 digits up to 65535.
func validHost(host string) bool {
	name := host
	if strings.HasPrefix(host, "[") {
		end := strings.IndexByte(host, ']')
		if end < 0 {
			return false
		}
		ip, err := netip.ParseAddr(host[1:end])
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return false
		}
		rest := host[end+1:]
		if rest == "" {
			return true
		}
		port, ok := strings.CutPrefix(rest, ":")
		return ok && validPort(port)
	}
	if i := strings.IndexByte(host, ':'); i >= 0 {
		if !validPort(host[i+1:]) {
			return false
		}
		name = host[:i]
	}
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 {
		return false
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// validPort reports whether port is 1 to 5 digits up to 65535.
func validPort(port string) bool {
	if port == "" || len(port) > 5 {
		return false
	}
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return false
		}
	}
	n, err := strconv.Atoi(port)
	return err == nil && n <= 65535
}

// patternHost is the host of a ServeMux pattern ("POST shop.test/cart"
// has shop.test), or "".
func patternHost(pattern string) string {
	rest := pattern
	if i := strings.IndexAny(rest, " \t"); i >= 0 {
		rest = strings.TrimLeft(rest[i:], " \t")
	}
	host, _, _ := strings.Cut(rest, "/")
	return host
}
