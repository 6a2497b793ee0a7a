package idempotency

import "time"

// SetTicker replaces the heartbeat's ticker of k, so tests tick by hand.
func SetTicker(k *Keeper, f func(d time.Duration) (<-chan time.Time, func())) { k.ticker = f }

// EncodeOutcome and DecodeOutcome expose the stored form to tests.
var (
	EncodeOutcome = encodeOutcome
	DecodeOutcome = decodeOutcome
)
