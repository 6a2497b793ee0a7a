// Package guard protects an application's own routes: net/http
// middleware that lets a request through only with a single-use token
// (RequireToken), at most once per Idempotency-Key with the first response
// replayed to duplicates (Idempotent), only when it carries a fresh
// signature (RequireSignature), or only as a webhook delivery a provider
// signed, once per delivery ID (RequireWebhook). Each is a
// func(http.Handler) http.Handler built by one constructor over one
// Option type; Gin turns any of them, or any other net/http middleware,
// into Gin middleware.
//
//	mux.Handle("POST /checkout", guard.RequireToken(tokens, "checkout")(checkout))
//	mux.Handle("POST /orders", guard.Idempotent(keeper)(createOrder))
//	mux.Handle("POST /v1/partner", guard.RequireSignature(verifier)(receive))
//	mux.Handle("POST /hooks/stripe", guard.RequireWebhook(stripe, keeper)(fulfil))
//
//	r.POST("/orders", guard.Gin(guard.Idempotent(keeper)), createOrder) // Gin
//
// # Tokens
//
// RequireToken redeems the token a request carries before the protected
// handler runs: from the Idempotency-Token header, else from the
// idempotency_token form field, which HiddenField and Field render so that
// server-rendered forms work without JavaScript. The handler finds the
// claims with TokenFrom. WithSubject binds tokens to the signed-in user.
// With WithRecords the response of each token's one request is recorded
// under the token's ID, in the same atomic step that redeems it, and a
// double submit gets the first response again (for a form, the same 303
// to the same order page) with Idempotent-Replayed: true instead of 409
// token_used; a 5xx or a panic gives the token back for a retry.
//
// # Idempotency keys
//
// Idempotent runs a route's handler once per Idempotency-Key
// (draft-ietf-httpapi-idempotency-key-header) and answers every duplicate
// with the stored response of that run. Keys are scoped to the caller (its
// credentials, else its IP: see Credentials and WithScope), the method and
// the route; the request fingerprint (method, route, path, query and
// canonical body) tells a retry from a reused key. WithCallerQuota bounds
// the records one caller may open, WithAddressQuota those of every caller
// at one address and WithAddressBytes their bytes (credentials are not
// checked, so one client can invent many callers, but not many
// addresses).
// The response is buffered and the record completed before the first byte
// goes out; a 5xx or a panic releases the record so the retry runs, a 4xx
// is stored. WithFingerprintWindow collapses keyless double submits inside
// a short window. The records live in an idempotency.Keeper, which holds
// the lease, retention and body cap.
//
// # Signatures
//
// RequireSignature verifies a signed request (HTTP Message Signatures, RFC
// 9421, with a time window and a nonce store, see package replay) before
// the protected handler runs; the verified key ID is in SignatureFrom.
// WithScheme and WithAuthority fix the target URI behind a proxy.
//
// # Webhooks
//
// RequireWebhook receives the deliveries of one provider's scheme
// (Standard Webhooks and Svix, Stripe, GitHub, Slack: see package
// webhook): it verifies the signature over the raw body and the
// timestamp's window first, and only then opens the delivery's record,
// so a forged delivery never reaches the store. The handler runs once per
// route and delivery ID and finds the delivery with WebhookFrom; a
// redelivery gets the stored response with Idempotent-Replayed: true, so
// the provider stops retrying, while a 5xx or a panic releases the record
// for the provider's next attempt.
//
// # Refusals
//
// A refused request gets an RFC 9457 problem (package problem) and the
// handler never runs; in particular it never runs when the store cannot
// confirm the redemption, the record or the nonce (503). WithErrorHandler
// and FailureReason let an HTML application render its own page instead.
// Every middleware reads a request body only within WithMaxBody (1 MiB by
// default) and hands it on intact.
package guard
