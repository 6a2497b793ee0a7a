// Package handlers is the standalone Replayguard service's HTTP API: the
// token endpoints that any backend, in any language, calls over HTTP, the
// signature verify endpoint, forward-auth for reverse proxies, CORS for
// browser pages, and the Gin engine cmd/server serves. The middleware that
// protects an application's own routes in Go is package guard; every
// refusal is answered by package problem.
//
// New returns an API; Register (or Mount, which does both) adds to a Gin
// router:
//
//	POST /v1/tokens         issue: optional JSON {"purpose","ttl_seconds","subject"}
//	                        or ?purpose=; 201 {"token","id","purpose","expires_at","expires_in"}
//	POST /v1/tokens/redeem  redeem: Idempotency-Token header or JSON {"token","purpose","subject","record"};
//	                        200 {"status":"redeemed","id","purpose","subject"} once, then 409;
//	                        with WithRecords, a token with a record answers from it:
//	                        200 {"status":"replayed",...,"response":{"status","headers","body"}}
//	POST /v1/tokens/complete  with WithRecords: JSON {"token","lease","response":{"status","headers","body"}}; 204
//	POST /v1/tokens/release   with WithRecords: JSON {"token","lease"}; 204, the token can be redeemed again
//	POST /v1/tokens/renew     with WithRecords: JSON {"token","lease"}; 200 {"status":"renewed","lease_expires_at"}
//	GET /v1/admin/records/{id}, POST /v1/admin/records/lookup, POST /v1/admin/records/{id}/release
//	                        with WithAdminKeys: operators see an idempotency record and release a processing one
//	GET|POST|… /v1/tokens/forward-auth  for nginx auth_request and Traefik ForwardAuth
//	OPTIONS /v1/tokens      CORS preflight for the origins given to WithCORSOrigins
//	POST /v1/signatures/verify  with WithVerifier: JSON {"method","url","headers","body"};
//	                        200 {"status":"verified","keyid","created","nonce"} once per nonce
//	GET /sdk/replayguard.js, .mjs, .src.js, .min.js.map, .js.sri  the browser SDK (sdk.Paths)
//
// Engine wraps the API in a complete Gin engine with GET /healthz,
// GET /readyz, GET /metrics, request IDs, JSON request logs and panic
// recovery: it is what cmd/server serves.
//
// Every endpoint either answers or returns the error it refuses with; one
// function counts the outcome in the metrics and writes the problem, so a
// store that cannot confirm an operation is 503 on every path, never
// success.
package handlers
