package gateway

import "net/http"

// TransportOf returns the transport g sends requests to the app with.
func TransportOf(g *Gateway) http.RoundTripper { return g.transport }
