package handlers

import (
	"errors"
	"fmt"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
)

// checkForRecord is token.Service.Check for a redemption that answers
// from the token's record (the Guard's record mode, the API with
// WithRecords): a token whose exp has passed but that is otherwise good
// for purpose and subject comes back with expired set, so that its
// record, if it has one, still answers a late duplicate. Such a token
// must never be redeemed: look it up with no owner and refuse it with
// token.ErrExpired unless the answer is store.Recorded (redemptionError
// does).
func checkForRecord(svc *token.Service, tok, purpose, subject string) (c token.Claims, expired bool, err error) {
	c, err = svc.Check(tok, purpose, subject)
	if !errors.Is(err, token.ErrExpired) {
		return c, false, err
	}
	if purpose == "" {
		purpose = token.DefaultPurpose
	}
	ec, perr := svc.ParseExpired(tok)
	if perr != nil || ec.Purpose != purpose || ec.Subject != subject {
		return token.Claims{}, false, err
	}
	return ec, true, nil
}

// redemptionError is the refusal of a redemption through a Keeper that
// did not answer from the record: the Keeper's error (409
// request_in_progress with Retry-After, 409 response_not_stored, both
// told in terms of the token), else token.ErrExpired for a token
// checkForRecord found expired, else the token's own error for res (nil
// when it was redeemed).
func redemptionError(svc *token.Service, c token.Claims, expired bool, res store.RedeemResult, err error) error {
	switch {
	case errors.Is(err, idempotency.ErrInProgress):
		return retryAfterError{fmt.Errorf("%w: the token's first request is still being processed; retry after Retry-After seconds to get its response", idempotency.ErrInProgress), inProgressRetryAfter}
	case errors.Is(err, idempotency.ErrNotStored):
		return fmt.Errorf("%w: the token's request was processed, but its response was too large to store, so it cannot be repeated", idempotency.ErrNotStored)
	case err != nil:
		return err
	case expired:
		return token.ErrExpired
	}
	return svc.RedeemError(c, res)
}
