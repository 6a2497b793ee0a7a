package pgtx_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/idempotency/pgtx"
	"github.com/replayguard/replayguard/store/postgres"
	"github.com/replayguard/replayguard/token"
)

// TestRedeemTokenCommitsWithTheOrder: a token spent inside the business
// transaction is spent when it commits and only then.
func TestRedeemTokenCommitsWithTheOrder(t *testing.T) {
	f := newFixture(t)
	st := postgres.New(f.pool)
	t.Cleanup(func() { _ = st.Close() })
	key := token.Key{ID: "k", Secret: []byte(strings.Repeat("s", 32))}
	svc, err := token.New(st, []token.Key{key}, token.WithMachineID(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	issue := func() string {
		is, err := svc.Issue(ctx, token.IssueRequest{Purpose: "checkout"})
		if err != nil {
			t.Fatal(err)
		}
		return is.Token
	}
	for name, db := range f.dbs() {
		t.Run(name, func(t *testing.T) {
			tok := issue()
			order := func(undo error) error {
				_, _, err := pgtx.Do(ctx, db, name+":"+tok[len(tok)-12:]+":"+errString(undo), "fp", func(ctx context.Context, tx pgtx.Tx) (idempotency.Outcome, error) {
					if _, err := pgtx.RedeemToken(ctx, tx, svc, tok, "checkout", ""); err != nil {
						return idempotency.Outcome{}, err
					}
					if err := tx.Exec(ctx, `INSERT INTO orders (item) VALUES ('with a token')`); err != nil {
						return idempotency.Outcome{}, err
					}
					return idempotency.Outcome{Status: 201}, undo
				})
				return err
			}
			before := f.orders(t)
			// A transaction that rolls back keeps the token.
			if err := order(errors.New("payment declined")); err == nil {
				t.Fatal("the failed order succeeded")
			}
			if f.orders(t) != before {
				t.Fatal("the failed order left a row")
			}
			// One that commits spends it with the order.
			if err := order(nil); err != nil {
				t.Fatalf("order = %v", err)
			}
			if f.orders(t) != before+1 {
				t.Fatal("no order row")
			}
			if _, err := svc.Redeem(ctx, tok, "checkout", ""); !errors.Is(err, token.ErrUsed) {
				t.Fatalf("the token after the committed order = %v, want ErrUsed", err)
			}
			// The token's own refusals come through.
			if _, _, err := pgtx.Do(ctx, db, name+":other", "fp", func(ctx context.Context, tx pgtx.Tx) (idempotency.Outcome, error) {
				_, err := pgtx.RedeemToken(ctx, tx, svc, issue(), "login", "")
				return idempotency.Outcome{}, err
			}); !errors.Is(err, token.ErrPurposeMismatch) {
				t.Fatalf("another purpose = %v, want ErrPurposeMismatch", err)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return "failed"
}
