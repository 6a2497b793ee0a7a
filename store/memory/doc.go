// Package memory is the embedded, single-instance store: sharded maps of
// expiring entries, bounded in size, swept by a janitor goroutine.
//
// Tokens, nonces and records share the maps and the bound
// (WithMaxEntries): each is one entry, and every operation on it is atomic
// under its shard's lock. Nonce keys (store.NonceKey) begin with "\x00n"
// and record keys with "\x00r", which no token ID does, so the three never
// collide. A token's own record (store.Store.Redeem) lives under
// store.TokenRecordKey(id), "\x00t" + id, in the token's shard: one lock
// covers the token and its record. Records under "\x00r" (Acquire's) may
// take at most half of each bound; a token's record counts with the
// tokens, so that idempotency records cannot starve a token route.
//
// It is the default when no Redis is configured. Everything it holds is
// lost on restart and is not shared between processes, so run one
// instance only. It imports nothing of Replayguard but the store contract.
package memory
