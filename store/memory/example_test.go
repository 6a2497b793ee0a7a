package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// Example keeps a token, a nonce and a record in the embedded store:
// each set-if-absent succeeds once, and a token redeems once.
func Example() {
	st := memory.New(memory.WithMaxEntries(10_000))
	defer st.Close()
	ctx := context.Background()
	tok := store.Token{Purpose: "checkout"}

	created, _ := st.Put(ctx, "42", tok, time.Minute)
	res, _, _ := st.Redeem(ctx, "42", tok, "", 0)
	again, _, _ := st.Redeem(ctx, "42", tok, "", 0)
	fmt.Println(created, res, again)

	fresh, _ := st.Put(ctx, store.NonceKey("partner-1", "n-1"), store.Token{}, time.Minute)
	replayed, _ := st.Put(ctx, store.NonceKey("partner-1", "n-1"), store.Token{}, time.Minute)
	fmt.Println(fresh, !replayed)

	_, acquired, _ := st.Acquire(ctx, "order-7", "fingerprint", "owner-1", time.Minute)
	rec, second, _ := st.Acquire(ctx, "order-7", "fingerprint", "owner-2", time.Minute)
	fmt.Println(acquired, second, rec.Owner)
	// Output:
	// true redeemed absent
	// true true
	// true false owner-1
}
