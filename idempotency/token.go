package idempotency

import (
	"context"
	"fmt"

	"github.com/replayguard/replayguard/store"
)

// StartToken redeems token id for want and opens its processing record
// in one atomic store operation, for an execution in this process. Like
// Start, exactly one of these happens:
//
//   - the token was live and matched: res is store.Redeemed and run is
//     non-nil; a heartbeat renews the lease until the caller ends run
//     with Complete (which also consumes the token for good) or Release
//     (which gives the token back, so a retry can redeem it);
//   - the token has a record: res is store.Recorded; once completed,
//     stored is its outcome (with ErrNotStored, and without its body,
//     when the body was not stored); while processing, err is
//     ErrInProgress;
//   - the token is absent or does not match want: res is store.Absent,
//     store.PurposeMismatch or store.SubjectMismatch, run is nil and err
//     is nil; the caller turns res into its own refusal;
//   - the store failed: err is ErrUnavailable or ErrStoreFull, and
//     nothing was redeemed.
//
// An empty id is ErrInvalidKey.
func (k *Keeper) StartToken(ctx context.Context, id string, want store.Token) (run *Run, stored Outcome, res store.RedeemResult, err error) {
	owner, err := newOwner()
	if err != nil {
		return nil, Outcome{}, 0, err
	}
	stored, res, err = k.OpenToken(ctx, id, want, owner)
	if err != nil || res != store.Redeemed {
		return nil, stored, res, err
	}
	return k.newRun(store.TokenRecordKey(id), owner, nil), Outcome{}, res, nil
}

// OpenToken is StartToken without a heartbeat, for an execution that ends
// in another request or process: the HTTP API opens the record on redeem
// and completes it when the backend calls back. owner names the
// execution (deterministic, so that the call back can name it again); its
// record is leased for the Keeper's lock TTL and not renewed, and ended
// with CompleteToken or ReleaseToken. An empty owner redeems the token
// without opening a record, while a token that has one is still answered
// from it (store.Recorded). The results are StartToken's.
func (k *Keeper) OpenToken(ctx context.Context, id string, want store.Token, owner string) (stored Outcome, res store.RedeemResult, err error) {
	if id == "" {
		return Outcome{}, 0, fmt.Errorf("%w: the token ID is empty", ErrInvalidKey)
	}
	res, rec, err := k.store.RedeemRecord(ctx, id, want, owner, k.now().Add(k.lockTTL))
	switch {
	case err != nil:
		return Outcome{}, 0, storeError(err)
	case res == store.Recorded:
		stored, err = found(rec)
		return stored, res, err
	}
	return Outcome{}, res, nil
}

// CompleteToken completes owner's processing record of token id with out
// (an empty owner: whoever's processing record it is, see store.Store),
// as Run.Complete does (the body is left out when over the cap; kept for
// the retention), and consumes the token. It returns ErrNotProcessing
// when there is no such record: none was opened, it was completed or
// released already, or its lease ended; and ErrUnavailable when the
// store did not confirm.
func (k *Keeper) CompleteToken(ctx context.Context, id, owner string, out Outcome) error {
	return k.complete(ctx, store.TokenRecordKey(id), owner, out, ErrNotProcessing)
}

// ReleaseToken deletes owner's processing record of token id (an empty
// owner: whoever's), so that the
// token, while it lives, can be redeemed again for a retry. Its errors
// are CompleteToken's.
func (k *Keeper) ReleaseToken(ctx context.Context, id, owner string) error {
	return k.release(ctx, store.TokenRecordKey(id), owner, ErrNotProcessing)
}
