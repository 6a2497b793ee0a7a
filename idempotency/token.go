package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
)

// Mode says what RedeemToken opens for the execution a redemption starts.
type Mode int

const (
	// NoRecord redeems the token without opening a record. A token that
	// already has one is still answered from it.
	NoRecord Mode = iota
	// Record opens the token's record for an execution in this process:
	// a heartbeat renews its lease until the Run ends.
	Record
	// Detached opens the token's record for an execution that ends in
	// another request, which names the Run's Lease to ResumeToken. The
	// lease is not renewed by a heartbeat: it ends after the Keeper's lock
	// TTL unless that request renews it (Run.Renew), and the record
	// outlives it by the grace (WithGrace).
	Detached
)

// Redemption is what RedeemToken did.
type Redemption struct {
	// Claims are the token's verified claims.
	Claims token.Claims
	// Replayed is true when the token's record answered: Outcome is the
	// outcome its one execution recorded, and nothing was redeemed.
	Replayed bool
	// Outcome is the recorded outcome when Replayed.
	Outcome Outcome
	// Run holds the record this redemption opened (Record and Detached
	// modes); end it with Complete, Release or Abandon. nil otherwise.
	Run *Run
}

// RedeemToken redeems tok, a token issued by tokens for purpose and
// subject, and records the execution it starts beside it, in the store's
// one atomic step (token.Service.RedeemRecord), so that a duplicate of the
// token gets that execution's outcome instead of a refusal:
//
//   - the token has a completed record: Replayed, with its Outcome (even
//     after the token's exp, for a late duplicate); with ErrNotStored
//     when the outcome's body was over the cap;
//   - its record is processing: ErrInProgress;
//   - else the token is redeemed: in Record and Detached modes Run holds
//     the new processing record. Complete consumes the token for good;
//     Release, or a lease that ends (a crash), gives it back for one
//     retry;
//   - else the token's own refusal (token.ErrUsed, token.ErrExpired,
//     token.ErrPurposeMismatch, …), or the store's error (wrapping
//     store.ErrUnavailable, or store.ErrFull): nothing was redeemed.
//
// With ErrInProgress and ErrNotStored, the Redemption still holds the
// token's Claims, so that the caller can name the record it met
// (store.TokenRecordKey of the claims' ID).
//
// The Keeper must keep its records in the store tokens uses: a token's
// record lives beside the token. The Keeper's lease, retention and body
// cap apply.
func (k *Keeper) RedeemToken(ctx context.Context, tokens *token.Service, tok, purpose, subject string, mode Mode) (Redemption, error) {
	var owner, lease string
	var err error
	switch mode {
	case Record:
		owner, err = newOwner()
	case Detached:
		if lease, err = newOwner(); err == nil {
			owner = detachedOwner(lease)
		}
	}
	if err != nil {
		return Redemption{}, err
	}
	expires := k.now().Add(k.lockTTL)
	c, rec, recorded, err := tokens.RedeemRecord(ctx, tok, purpose, subject, owner, k.recordTTL())
	if err != nil {
		return Redemption{}, err
	}
	if recorded {
		out, err := found(rec)
		switch {
		case errors.Is(err, ErrInProgress):
			return Redemption{Claims: c}, fmt.Errorf("%w: the token's first request is still being processed; retry after Retry-After seconds to get its response", ErrInProgress)
		case errors.Is(err, ErrNotStored):
			return Redemption{Claims: c}, fmt.Errorf("%w: the token's request was processed, but its response was too large to store, so it cannot be repeated", ErrNotStored)
		case err != nil:
			return Redemption{}, err
		}
		return Redemption{Claims: c, Replayed: true, Outcome: out}, nil
	}
	red := Redemption{Claims: c}
	key := store.TokenRecordKey(c.ID)
	switch mode {
	case Record:
		red.Run = k.newRun(key, owner, expires, nil)
	case Detached:
		red.Run = k.detachedRun(key, owner, expires, ErrNotProcessing)
		red.Run.lease = lease
	}
	return red, nil
}

// ResumeToken returns the Run of token tok's processing record that a
// Detached redemption opened with lease, so that another request can
// Complete or Release it. tok may have expired since: the work it started
// may have outlived it. An empty lease resumes whatever execution holds
// the record (see store.Store.Complete): a backend that outlived its lease
// may then end the record a duplicate reopened. Complete and Release
// return ErrNotProcessing when the record is not that lease's processing
// record. A lease that RedeemToken could not have given is ErrBadLease.
func (k *Keeper) ResumeToken(tokens *token.Service, tok, lease string) (*Run, error) {
	if lease != "" && (len(lease) != 32 || strings.Trim(lease, "0123456789abcdef") != "") {
		return nil, fmt.Errorf("%w: a lease is the 32 hex digits the redemption answered", ErrBadLease)
	}
	c, err := tokens.Parse(tok)
	if err != nil && !errors.Is(err, token.ErrExpired) {
		return nil, err
	}
	owner := ""
	if lease != "" {
		owner = detachedOwner(lease)
	}
	r := k.detachedRun(store.TokenRecordKey(c.ID), owner, k.now(), ErrNotProcessing)
	r.lease = lease
	return r, nil
}

// detachedOwner is the owner of the record a Detached redemption opens:
// the lease it gives out.
func detachedOwner(lease string) string { return "api:" + lease }
