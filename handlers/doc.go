// Package handlers puts Replayguard's single-use tokens on HTTP: the token
// API (issue and redeem), the standalone server's engine, a Guard
// middleware that protects an application's own routes, a
// SignatureGuard middleware for signed requests (RFC 9421, see package
// replay), and an IdempotencyGuard middleware that replays the response
// of a request's one execution to its duplicates (see package
// idempotency).
//
// # Token API
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
//	POST /v1/tokens/complete  with WithRecords: JSON {"token","response":{"status","headers","body"}}; 204
//	POST /v1/tokens/release   with WithRecords: JSON {"token"}; 204, the token can be redeemed again
//	OPTIONS /v1/tokens      CORS preflight for the origins given to WithCORSOrigins
//	POST /v1/signatures/verify  with WithVerifier: JSON {"method","url","headers","body"};
//	                        200 {"status":"verified","keyid","created","nonce"} once per nonce
//
// Engine wraps the API in a complete Gin engine with GET /healthz,
// GET /readyz, GET /metrics, request IDs, JSON request logs and panic
// recovery: it is what cmd/server serves.
//
// # Guard
//
// A Guard redeems the token a request carries before the protected
// handler runs. RequireToken is the Gin middleware and RequireTokenHandler
// the net/http one (func(http.Handler) http.Handler); both call the same
// Redeem. The token comes from the Idempotency-Token header (TokenHeader),
// else from the idempotency_token form field (TokenField), which
// HiddenField and Guard.Field render so that server-rendered forms work
// without JavaScript. The redeemed claims are available to the handler
// through TokenFrom. WithSubjectFunc binds tokens to the signed-in user;
// WithErrorHandler and FailureReason let an HTML app render its own page
// for a refused request.
//
// With WithTokenRecords(keeper) the Guard records the response of each
// token's one request, under the token's ID, in the same atomic step that
// redeems it: a double submit then gets the first response again (for a
// form, the same 303 to the same order page) with Idempotent-Replayed:
// true instead of 409 token_used. A 5xx or a panic gives the token back
// for a retry; a duplicate while the first runs gets 409
// request_in_progress. It shares its recording core with IdempotencyGuard.
//
// # SignatureGuard
//
// A SignatureGuard verifies a signed request (HTTP Message Signatures,
// RFC 9421, with a time window and a nonce store) before the protected
// handler runs: RequireSignature (Gin) and RequireSignatureHandler
// (net/http) both call Verify. The body is read, at most
// replay.MaxBodyBytes, to check its Content-Digest and handed on intact;
// the verified key ID is available through SignatureFrom. WithScheme and
// WithAuthority fix the target URI behind a proxy.
//
// # IdempotencyGuard
//
// An IdempotencyGuard runs a route's handler once per Idempotency-Key
// (draft-ietf-httpapi-idempotency-key-header) and answers every duplicate
// with the stored response of that run, marked Idempotent-Replayed: true.
// Idempotent (Gin) and IdempotentHandler (net/http) share one core over
// an idempotency.Keeper, which holds the lease, retention and body cap:
//
//	keeper := idempotency.New(st) // 60s lease, 24h retention, 1 MiB bodies
//	orders := handlers.NewIdempotencyGuard(keeper, handlers.WithScope(handlers.ScopeHeader("Authorization")))
//	r.POST("/orders", orders.Idempotent(), createOrder)
//
// Keys are scoped to the caller, the method and the route; the request
// fingerprint (method, route, path, query and canonical body) tells a
// retry from a reused key. The response is buffered and the record
// completed before the first byte goes out; a 5xx or a panic releases the
// record so the retry runs, a 4xx is stored. WithFingerprintMode collapses
// keyless double submits inside a short window.
//
// # Errors
//
// Every refusal is an RFC 9457 application/problem+json answer with a
// stable code; the type URI is ProblemTypePrefix followed by the code,
// e.g. urn:replayguard:problem:token_used. ProblemFor holds the one table
// that maps errors to statuses and codes:
//
//	400 invalid_request      malformed body, purpose, subject or TTL; no token sent
//	400 invalid_idempotency_key  Idempotency-Key is not one sf-string of 1 to 255 characters
//	400 idempotency_key_missing  the route requires an Idempotency-Key
//	401 unauthorized         REPLAYGUARD_API_KEYS is set and the Bearer key is missing or wrong
//	401 token_invalid        malformed, forged, unknown kid, not HS256
//	401 token_expired        exp has passed
//	401 signature_missing    no Signature-Input or Signature
//	401 signature_invalid    bad syntax, unknown key or alg, wrong signature, missing component, digest mismatch
//	401 signature_expired    created outside the window; the problem carries server_time
//	401 replayed_request     this key ID and nonce were seen before
//	403 subject_not_allowed  a subject was asked for without a valid API key
//	403 purpose_mismatch     issued for another purpose (the token stays valid)
//	403 subject_mismatch     bound to another subject (the token stays valid)
//	403 cors_rejected        preflight from an origin that is not allowed
//	404 not_found            no such route
//	405 method_not_allowed   the route exists for other methods
//	409 token_used           already redeemed
//	409 request_in_progress  the key's first request is still running; Retry-After says when to retry
//	409 response_not_stored  the key's response was over the size cap, so it cannot be replayed
//	409 record_not_processing  complete or release found no processing record of the token
//	413 payload_too_large    body over MaxBodyBytes (64 KiB; replay.MaxBodyBytes for SignatureGuard, WithMaxRequestBody for IdempotencyGuard)
//	422 idempotency_key_reused  the key was used for another request (method, route or body)
//	429 rate_limited         over the per-IP issue rate; Retry-After says when to retry
//	503 store_full           the bounded memory store is full
//	503 store_unavailable    the store did not confirm: nothing was done
//	500 internal_error       a bug: nothing was done
//
// A 5xx answer never means success. In particular a protected handler
// never runs when the store cannot confirm the redemption.
//
// # Example
//
// A Gin application that serves the token API for its JavaScript clients
// and protects its checkout with a hidden form field:
//
//	package main
//
//	import (
//		"html/template"
//		"log"
//		"net/http"
//
//		"github.com/gin-gonic/gin"
//
//		"github.com/replayguard/replayguard/handlers"
//		"github.com/replayguard/replayguard/store/memory"
//		"github.com/replayguard/replayguard/token"
//	)
//
//	var page = template.Must(template.New("page").Parse(`<!doctype html>
//	<form method="post" action="/checkout">
//	  {{ .Field }}
//	  <button>Pay</button>
//	</form>`))
//
//	func main() {
//		st := memory.New() // single instance; use store/redis to scale out
//		defer st.Close()
//		key, err := token.GenerateKey() // use token.ParseKeys in production
//		if err != nil {
//			log.Fatal(err)
//		}
//		svc, err := token.New(st, []token.Key{key}, token.WithMachineID(1))
//		if err != nil {
//			log.Fatal(err)
//		}
//
//		r := gin.New()
//		_ = r.SetTrustedProxies(nil) // believe no X-Forwarded-For: the rate limit keys on the peer
//		handlers.Mount(r, svc, handlers.WithIssueRate(st, handlers.DefaultIssueRate))
//
//		guard := handlers.NewGuard(svc)
//		r.GET("/checkout", func(c *gin.Context) {
//			field, err := guard.Field(c.Request, "checkout")
//			if err != nil {
//				handlers.WriteProblem(c.Writer, c.Request, err)
//				return
//			}
//			_ = page.Execute(c.Writer, map[string]any{"Field": field})
//		})
//		r.POST("/checkout", guard.RequireToken("checkout"), func(c *gin.Context) {
//			claims, _ := handlers.TokenFrom(c.Request.Context())
//			c.String(http.StatusOK, "paid once (token %s)", claims.ID)
//		})
//		log.Fatal(r.Run("127.0.0.1:8081"))
//	}
//
// With net/http the protected route is
//
//	mux.Handle("POST /checkout", guard.RequireTokenHandler("checkout")(pay))
//
// A second POST of the same form is refused with 409 token_used before
// the checkout handler runs.
package handlers
