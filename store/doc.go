// Package store defines the storage contract behind Replayguard.
//
// The contract uses only built-in types so that implementations
// (store/memory, store/redis) never import the packages that use them.
// Every implementation is checked by the one conformance suite in
// store/storetest.
//
// # Keys
//
// A store holds three kinds of entries, each under its own keys:
//
//   - tokens, under their ID (Put, Redeem);
//   - nonces, under NonceKey(scope, nonce) (Put): set-if-absent markers
//     with nothing to redeem;
//   - records of an execution (Acquire, Renew, Complete, Release, and
//     Lookup for operators), under a caller's key, or a token's own record
//     under TokenRecordKey(id), which Redeem opens beside the token.
//
// Keys beginning with "\x00" are the store's own: a caller's token ID or
// record key never begins with it.
//
// # Time
//
// Every expiry is a duration from the moment the store carries the call
// out, measured by the store's own clock (the Redis or PostgreSQL
// server's, the process's for the memory store), never an instant
// computed on the caller's clock: how long an entry lives does not depend
// on how far the caller's clock is from the store's. A duration <= 0 acts
// as if the entry were set and reached its expiry at once.
//
// The instants Lookup reports, a record's Created and Expires, are read
// from the same clock: compared with the caller's clock, they are off by
// the skew between the two.
//
// # Errors
//
// Every error a store returns is ErrFull or wraps ErrUnavailable: the
// store did not confirm the operation, its outcome is unknown, and the
// caller must treat it as a failure. Outcomes that are answers (a token
// absent, a record held by another owner) are results with a nil error.
package store
