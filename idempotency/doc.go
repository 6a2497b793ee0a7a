// Package idempotency runs a piece of work at most once per key and gives
// every duplicate the outcome of the one execution that happened: retries
// after a timeout, queue redeliveries and double submits get the first
// answer instead of a second execution or a bare refusal.
//
// It is not HTTP-specific. A Keeper keeps one record per key in a
// store.Store (memory or Redis):
//
//   - Acquiring a key is one atomic store operation (store.Store.Acquire):
//     exactly one caller opens a processing record under a lease; any
//     other sees that processing record or the completed one, never a gap.
//   - While the execution runs, a heartbeat renews the lease every third
//     of WithLockTTL (default 60s). An execution that dies without
//     finishing leaves a processing record that expires with its lease,
//     after which exactly one retry runs.
//   - The execution ends by completing the record with its Outcome, kept
//     for WithRetention (default 24h), or by releasing it so a retry runs.
//     An outcome body over WithMaxBody (default 1 MiB) is not stored: the
//     record completes without it and duplicates get ErrNotStored.
//
// Do wraps all of it around a function: it completes on success,
// releases on an error or a panic. Start and Run are the same steps one
// at a time, for callers such as the HTTP middleware in package guard
// that must complete the record before they answer.
//
// Duplicates of a running execution get ErrInProgress, duplicates with
// another fingerprint (the same key used for a different request) get
// ErrFingerprintMismatch, and when the store cannot be reached nothing
// runs and the error wraps store.ErrUnavailable: a store outage never lets
// a duplicate through.
//
// # Example
//
// A queue consumer that charges a card once per message, however often
// the message is redelivered:
//
//	keeper := idempotency.New(st) // st: memory.New() or a store/redis Store
//	for msg := range deliveries {
//		sum := sha256.Sum256(msg.Body)
//		out, replayed, err := keeper.Do(ctx, msg.ID, hex.EncodeToString(sum[:]),
//			func(ctx context.Context) (idempotency.Outcome, error) {
//				receipt, err := charge(ctx, msg.Body)
//				if err != nil {
//					return idempotency.Outcome{}, err // released: the redelivery retries
//				}
//				return idempotency.Outcome{Body: receipt}, nil
//			})
//		switch {
//		case errors.Is(err, idempotency.ErrInProgress):
//			msg.Nack() // another worker runs it now: redeliver later
//		case err != nil:
//			msg.Nack()
//		default:
//			reply(msg, out.Body, replayed) // the same receipt every time
//			msg.Ack()
//		}
//	}
//
// examples/queue-consumer is a runnable version.
//
// # Tokens
//
// A single-use token (package token) can carry the record of the one
// execution it authorises, so that a duplicate submit of the same token
// gets that execution's outcome instead of a refusal. The record lives
// beside the token in the store, under store.TokenRecordKey(id), and is
// opened by the redemption itself: RedeemToken is the one function that
// redeems a token that may carry a record (guard.RequireToken, the HTTP
// API and the gateway all call it). In Record mode the Run it returns has
// a heartbeat, for an execution in this process; in Detached mode it has
// a lease to hand out, and another request ends it with ResumeToken, as
// the HTTP API's /v1/tokens/redeem, /complete and /release do.
//
// # Clocks
//
// Leases and retention are durations the store counts on its own clock
// (the memory store's, or the Redis or PostgreSQL server's) from the
// moment it carries out the call, so an instance whose clock disagrees
// with the store's neither shortens nor lengthens them.
package idempotency
