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
// reaches the app, as POST, since many apps read it so. Host patterns
// match the Host in any case and with a trailing dot (SHOP.TEST,
// shop.test.).
//
// # Spellings
//
// A policy must not be skipped by spelling a routed path in a way the
// app, or a common framework, maps onto the route. Each spelling is
// matched as the route (its policy applies; let through, the request
// reaches the app as sent), redirected (307) to the routed path, or
// refused with 400 invalid_request whether or not it would be routed,
// where the gateway would have to guess how the app reads it. Examples
// are for the routes "POST /orders" and "/admin/":
//
//	spelling                              example                          read as the route by          gateway
//	another case                          /ORDERS, /Admin/x                Express, ASP.NET, IIS         matched
//	a trailing slash, raw or encoded      /orders/, /orders%2f             Express, Rails, Django        matched
//	a .ext suffix on the last segment     /orders.json, /orders.tar.gz     Rails (.:format), Spring      matched
//	trailing dots or spaces on a segment  /admin./x, /admin%2e/x,          Windows servers (IIS)         matched
//	                                      /admin%20/x, /orders%20
//	compatibility characters (NFKC),      /%EF%BC%8Fadmin/x (／admin/x),  apps that normalise to NFKC   matched
//	Unicode case                          /order%C5%BF (ſ)                 or fold case
//	letters or dots encoded two to four   /%256Frders,                     servers that decode more      matched
//	times                                 /x/%25252e%25252e/orders         than once
//	an encoded ? or #                     /orders%3Fx                      apps that decode first        matched, ends the path
//	dot segments, repeated slashes,       /x/../orders, //orders,          every server; nginx after     307 to the routed path
//	encoded dots or slashes               /x/%2e%2e/orders, /admin%2Fx     decoding
//	a subtree's path without its slash    /admin                           ServeMux                      307 to /admin/
//	not UTF-8 once decoded (overlong)     /admin%c0%afx, /caf%E9           lenient decoders: %c0%af is / 400
//	a segment of only dots and spaces     /.../orders, /x/..%20/orders     Windows: .., . or nothing     400
//	other than . and ..
//	a backslash: raw, encoded (once or    /x/..\orders, /x/..%5Corders,    WHATWG URL parsers, Windows   400
//	more) or as ＼                       /x/..%EF%BC%BCorders
//	a semicolon: raw, encoded or as ；   /x/..;/orders, /admin;/x         Tomcat, Jetty, Spring         400
//	. / \ or ; encoded twice              %252e, %252F, %255C, %253B       servers that decode twice     400
//	a control character, encoded once     /orders%00, /orders%2500         C servers end the path there  400
//	or more
//	anything encoded more than four       /%2525252541                     servers that decode until     400
//	times                                                                  nothing is left
//	one route as sent, another as a       /orders/NEW, with /orders/{id}   either                        400
//	spelling                              and /orders/new
//
// Letters of other scripts that only look alike (Cyrillic о for o) are
// other paths to every framework and pass as such. Two patterns that are
// one path once spelled alike (POST /orders, POST /Orders) conflict. An
// idempotency key's record belongs to the route and its fingerprint
// covers the path as sent, so a retry on another spelling gets 422
// idempotency_key_reused. A Host that is not host[:port] ([shop.test],
// shop.test,evil, shop.test:80:80, .shop.test) is refused too, and so is
// a request without a Host (HTTP/1.0) when a route has a host pattern.
//
// Requests that match no route pass through without a policy. Client-sent
// Replayguard-Token-Id, Replayguard-Client-Key-Id and
// Replayguard-Webhook-Id headers are removed from every request
// (StripVerifiedHeaders), and so are hop-by-hop headers and client-sent
// X-Forwarded-For, -Host and -Proto, Forwarded, X-Real-IP and
// True-Client-IP (which chi's RealIP believes first), in any case and
// with underscores for hyphens; the gateway sets X-Forwarded-For, -Host
// and -Proto and X-Real-IP (the client IP, as in X-Forwarded-For)
// itself. When the app
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
