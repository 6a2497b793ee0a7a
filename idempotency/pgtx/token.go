package pgtx

import (
	"context"
	"fmt"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
)

// RedeemToken spends tok, a single-use token issued by tokens on the
// PostgreSQL store (store/postgres) of this database, inside tx: it is
// spent when tx commits and only then, so the order the token authorises
// and the spent token commit together. A concurrent redemption of the same
// token waits for tx (up to the lock timeout of a transaction pgtx
// opened) and then finds it spent, or redeems it if tx rolled back. The
// checks and errors are token.Service.Redeem's; a failure of the
// statement wraps store.ErrUnavailable, and tx is then aborted.
func RedeemToken(ctx context.Context, tx Tx, tokens *token.Service, tok, purpose, subject string) (token.Claims, error) {
	return tokens.RedeemWith(ctx, tok, purpose, subject, func(ctx context.Context, id string, want store.Token) (store.RedeemResult, error) {
		var res int
		err := tx.QueryRow(ctx, `SELECT result FROM replayguard_redeem($1, $2, $3, ''::bytea, 0)`,
			[]byte(id), []byte(want.Purpose), []byte(want.Subject)).Scan(&res)
		if err != nil {
			return 0, fail("redeem", err)
		}
		switch res {
		case 0:
			return store.Absent, nil
		case 1:
			return store.Redeemed, nil
		case 2:
			return store.PurposeMismatch, nil
		case 3:
			return store.SubjectMismatch, nil
		case 4:
			return store.Recorded, nil
		}
		return 0, fail("redeem", fmt.Errorf("unexpected result %d", res))
	})
}
