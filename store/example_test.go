package store_test

import (
	"errors"
	"fmt"

	"github.com/replayguard/replayguard/store"
)

// Example shows the keys and the errors every store shares: a nonce's
// key never collides with a token ID, and every failure a store reports
// wraps ErrUnavailable, so one errors.Is tells a caller to fail closed.
func Example() {
	fmt.Println(store.IsNonceKey(store.NonceKey("partner-1", "n-1")), store.Reserved("647244799014862949"))
	err := store.Unavailable("redis: redeem", errors.New("i/o timeout"))
	fmt.Println(errors.Is(err, store.ErrUnavailable), errors.Is(store.ErrClosed, store.ErrUnavailable))
	fmt.Println(err)
	// Output:
	// true false
	// true true
	// store: unavailable: redis: redeem: i/o timeout
}
