package gateway

import "net/http"

// TransportOf returns the transport g sends requests to the app with.
func TransportOf(g *Gateway) http.RoundTripper { return g.transport }

// NeverSent exposes neverSent.
func NeverSent(method string, err error) bool { return neverSent(method, err) }
