// Package problem is the one place where Replayguard's errors become HTTP
// answers: RFC 9457 application/problem+json bodies with a stable code,
// from one table that maps each sentinel error (of this package and of
// token, replay, idempotency and store) to a status, a code and a title.
//
// Every refusal of the service and of the middleware in package guard is
// written by Write; an application that renders its own error pages finds
// the problem of an error with For. The table:
//
//	400 invalid_request          malformed body, purpose, subject, TTL or record ID; no token sent; an unparseable
//	                             request; a gateway request spelled as servers read their own way; a
//	                             verified webhook delivery without a usable ID (a Stripe body without a string id)
//	400 invalid_idempotency_key  Idempotency-Key is not one sf-string of 1 to 255 characters
//	400 idempotency_key_missing  the route requires an Idempotency-Key
//	401 unauthorized             the Bearer API key is missing or wrong
//	401 token_invalid            malformed, forged, unknown kid, not HS256
//	401 token_expired            exp has passed
//	401 signature_missing        no Signature-Input or Signature; a header a webhook scheme signs or keys on is missing
//	401 signature_invalid        bad syntax, unknown key or alg, wrong signature, missing component, digest mismatch;
//	                             a webhook signature no configured secret verifies over the body
//	401 signature_expired        created (or a webhook's timestamp) outside the window; the problem carries server_time
//	401 replayed_request         this key ID and nonce were seen before
//	403 subject_not_allowed      a subject was asked for without a valid API key
//	403 purpose_mismatch         issued for another purpose (the token stays valid)
//	403 subject_mismatch         bound to another subject (the token stays valid)
//	403 cors_rejected            preflight from an origin that is not allowed
//	404 not_found                no such route
//	404 record_not_found         no live record has the ID or key an operator looked up
//	405 method_not_allowed       the route exists for other methods
//	409 token_used               already redeemed
//	409 request_in_progress      the first request is still running; Retry-After says when to retry
//	409 response_not_stored      the response was over the size cap, so it cannot be replayed
//	409 record_not_processing    renew, complete or release found no processing record (of the token, or by ID)
//	413 payload_too_large        the body is over the route's limit
//	422 idempotency_key_reused   the key was used for another request (method, route or body)
//	429 rate_limited             over the per-IP issue rate; Retry-After says when to retry
//	431 headers_too_large        the request line and header fields are over the server's limit
//	501 unsupported_transfer_encoding  a Transfer-Encoding other than chunked
//	502 upstream_unavailable     the gateway's app could not be reached or did not answer in time
//	503 store_full               a bounded store is full: nothing was done
//	503 store_unavailable        the store did not confirm: nothing was done
//	505 http_version_not_supported  a request line of an HTTP version other than 1.x
//	500 internal_error           a bug: nothing was done
//
// A 5xx answer never means success: a protected handler never runs when
// the store cannot confirm what it needs.
package problem
