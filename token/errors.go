package token

import "errors"

// Sentinel errors returned by this package. Wrapped errors carry detail;
// compare with errors.Is. package problem maps each to an HTTP status and
// a problem code in one table. A store that did not confirm an operation
// is reported with the store's own error, which wraps
// store.ErrUnavailable (or is store.ErrFull).
var (
	// ErrInvalid: the token is malformed, oversized, not HS256, signed
	// with an unknown kid or a wrong key, or lacks a required claim.
	ErrInvalid = errors.New("token: invalid")
	// ErrExpired: the token's exp has passed (beyond the leeway).
	ErrExpired = errors.New("token: expired")
	// ErrUsed: the signature is good but no live token has its ID: it was
	// redeemed already (or its store entry is gone).
	ErrUsed = errors.New("token: already used")
	// ErrPurposeMismatch: the token was issued for another purpose. The
	// token stays valid.
	ErrPurposeMismatch = errors.New("token: purpose mismatch")
	// ErrSubjectMismatch: the token is bound to another subject, or to a
	// subject when none was given, or to none when one was given. The
	// token stays valid.
	ErrSubjectMismatch = errors.New("token: subject mismatch")
	// ErrBadRequest: an issue or redeem request is malformed (bad purpose,
	// TTL or subject).
	ErrBadRequest = errors.New("token: bad request")
	// ErrNoMachineID was returned by New on a host without a private
	// IPv4 address.
	//
	// Deprecated: New no longer returns it: it falls back to a random
	// machine ID (see WithMachineID and Service.MachineID).
	ErrNoMachineID = errors.New("token: no machine ID")
	// ErrBadKeys: a signing key specification is malformed.
	ErrBadKeys = errors.New("token: bad signing keys")
)
