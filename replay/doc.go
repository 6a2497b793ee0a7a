// Package replay verifies HTTP Message Signatures (RFC 9421) with a time
// window and a nonce store, so a signed request is accepted once, only
// inside its window, and only when a known client signed it.
//
// A request carries Signature-Input and Signature fields. Verify picks
// one signature (see Verify), looks its keyid up in a KeySource and
// checks, in this order: the parameters and covered components the
// policy requires, the Content-Digest against the body received, the
// signature itself with the key's own algorithm, the window, and finally
// records the nonce, scoped by key ID, with set-if-absent in a
// store.Store. SignatureBase and ContentDigest are exported for signers.
//
// Verify runs the checks; guard.RequireSignature applies it to an
// application's routes, handlers serves it as POST /v1/signatures/verify
// for backends in other languages, and Signer and Transport sign requests
// on the client side.
//
// # Clocks
//
// The window is checked with the server's clock (WithClock); each nonce is
// kept for as long as the window could still accept its signature, a
// duration the store counts on its own clock, so a store whose clock
// disagrees with the server's neither shortens nor lengthens it.
package replay
