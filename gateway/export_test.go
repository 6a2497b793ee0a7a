package gateway

import "net/http"

// TransportOf returns the transport g sends requests to the app with.
func TransportOf(g *Gateway) http.RoundTripper { return g.transport }

// NeverSent exposes neverSent.
func NeverSent(method string, err error) bool { return neverSent(method, err) }

// FoldPath exposes foldPath.
func FoldPath(path string) (string, error) { return foldPath(path) }

// FoldPattern exposes foldPattern.
func FoldPattern(pattern string) (string, error) { return foldPattern(pattern) }

// ExtCuts exposes extCuts.
func ExtCuts(p string) []string {
	cut, n := extCuts(p)
	return cut[:n]
}

// Match returns the pattern of r's route in g, "redirect", or "" when
// r passes through or is refused.
func Match(g *Gateway, r *http.Request) string {
	rt, pattern, redirect, err := g.match(r)
	switch {
	case err != nil:
		return ""
	case redirect != nil:
		return "redirect"
	case rt == nil:
		return ""
	}
	return pattern
}
