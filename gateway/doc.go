// Package gateway runs Replayguard in front of an app that needs no code
// changes: a reverse proxy (net/http/httputil) that gives each route of a
// routes file a policy before the request reaches the app.
//
// A routes file (ParseRoutes, LoadRoutes) lists Go net/http ServeMux
// patterns and their policies:
//
//	routes:
//	  - match: "POST /orders"          # Go net/http ServeMux pattern syntax
//	    policy: idempotency_key        # token | idempotency_key | signature | fingerprint
//	    required: true                 # idempotency_key: reject requests without a key
//	  - match: "POST /checkout"
//	    policy: token
//	    purpose: checkout
//	  - match: "POST /hooks/stripe"
//	    policy: webhook
//	    scheme: stripe                 # standard | stripe | github | slack
//	    secret_env: STRIPE_WEBHOOK_SECRET
//
// The policies are package guard's middleware around the proxy:
//
//   - idempotency_key: Idempotent runs the app once per
//     Idempotency-Key and replays its response, with
//     Idempotent-Replayed: true, to every duplicate;
//   - fingerprint: the same, and identical keyless requests (double
//     submits) inside a short window get the first one's response;
//   - token: RequireToken redeems the token from the Idempotency-Token header,
//     else the idempotency_token form field, before the app runs; a
//     request without one gets 400 invalid_request. Without the header,
//     the body is read (at most the route's max_body, else 413) to look
//     for the field. The app receives the body as the client sent it and
//     the token's id in Replayguard-Token-Id;
//   - signature: RequireSignature lets a signed request (RFC 9421)
//     through once, inside its window; the app receives the signature's
//     keyid in Replayguard-Client-Key-Id;
//   - webhook: RequireWebhook lets through only deliveries its scheme's
//     provider signed (see package webhook) with one of the route's
//     secrets, read at start from secret_env (comma-separated) or
//     secret_file (one per line), and runs the app once per delivery ID;
//     a redelivery gets the stored response with Idempotent-Replayed:
//     true. The app receives the ID in Replayguard-Webhook-Id. A secret
//     that is missing or malformed stops New with the route's line; no
//     secret is ever logged or put in an error.
//
// Before matching, the method is uppercased: "post" is routed, and
// reaches the app, as POST, since many apps read it so. A request that is
// another spelling of a routed path is redirected (307) to the routed
// one: a path not in canonical form (/x/../orders, //orders), the same
// with its dots or slashes percent-encoded (/x/%2e%2e/orders,
// /x%2F..%2Forders), and a subtree's path without its slash (/api under
// /api/), as ServeMux redirects it. Percent-encoded letters match as
// decoded (/%6Frders is /orders) and reach the app as sent. Host patterns
// match the Host in any case and with a trailing dot (SHOP.TEST,
// shop.test.).
//
// Spellings that servers read each in their own way are refused with 400
// invalid_request, whether or not they would be routed, so that the app
// never gets a path or host other than the one the gateway matched: a
// Host that is not host[:port] ([shop.test], shop.test,evil,
// shop.test:80:80, .shop.test), no Host (HTTP/1.0) when a route has a
// host pattern, and in the path a backslash (\ or %5C, a slash to
// Windows servers and WHATWG URL parsers), a semicolon (; or %3B: Tomcat,
// Jetty and Spring read /x/..;/checkout as /checkout), a double-encoded
// dot, slash, backslash or semicolon (%252e, %252f, %255c, %253b, for
// servers that decode twice) or a percent-encoded control character
// (%00).
//
// Requests that match no route pass through without a policy. Client-sent
// Replayguard-Token-Id, Replayguard-Client-Key-Id and
// Replayguard-Webhook-Id headers are removed from every request
// (StripVerifiedHeaders), and ReverseProxy removes
// hop-by-hop headers and client-sent X-Forwarded-* and Forwarded headers;
// the gateway sets X-Forwarded-For, -Host and -Proto itself. When the app
// cannot be reached or does not answer within WithTimeout, the answer is
// 502 upstream_unavailable; when the client's body cannot be read as it
// streams to the app (a malformed chunked encoding), it is the client's
// 400 invalid_request (413 payload_too_large past a limit set in front
// of the gateway). The gateway speaks HTTP/1.1 to the app. A
// request whose method is not GET, HEAD, OPTIONS or TRACE is sent again
// only when none of it was written (the app closed an idle connection as
// it went out), never after (the app may have run it); for that, its
// Idempotency-Key and X-Idempotency-Key headers go to the app under
// lowercase names.
//
// # Example
//
// Example runs this in front of a test app, with its routes inline:
//
//	routes, err := gateway.LoadRoutes("routes.yaml")
//	if err != nil {
//		return err
//	}
//	app, _ := url.Parse("http://127.0.0.1:3000")
//	gw, err := gateway.New(app, routes,
//		gateway.WithKeeper(idempotency.New(st)),
//		gateway.WithTokens(tokens))
//	if err != nil {
//		return err
//	}
//	http.ListenAndServe(":8080", gw)
//
// cmd/server does this when REPLAYGUARD_UPSTREAM and REPLAYGUARD_ROUTES
// are set, keeping its own paths (/v1/..., /sdk/..., /healthz, /readyz,
// /metrics) for the Replayguard API.
package gateway
