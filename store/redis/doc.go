// Package redis is the shared store: tokens, nonces, idempotency records and
// rate-limit counters kept in Redis, so that any number of Replayguard instances can serve one set of
// tokens. It works with any go-redis client: a single server, Sentinel
// (failover), Ring or Redis Cluster.
//
// Each operation is one command, atomic on the server:
//
//   - Put is SET key value NX PX ttl, for tokens and nonces alike;
//   - Redeem is one Lua script (redeem.lua) that answers from the token's
//     live record, or compares purpose and subject and then deletes the
//     token or opens a processing record beside it;
//   - Acquire is one Lua script (acquire.lua) that returns the live
//     idempotency record under a key or, when there is none, opens a
//     processing one, in one round trip;
//   - Renew, Complete and Release are one Lua script each (renew.lua,
//     complete.lua, release.lua) that check the record's owner and state
//     before moving its expiry, storing the response, or deleting it;
//   - Lookup is one Lua script (lookup.lua) that reads the record with its
//     remaining lifetime (PTTL) and the server's clock (TIME), and changes
//     nothing;
//   - Allow is go-redis/redis_rate's GCRA script.
//
// With WithMinReplicas, a call that changed something sends WAIT on the
// same connection afterwards (see Replication below).
//
// A token lives under prefix + "t:{" + id + "}". The braces are a Cluster
// hash tag: every key a script touches for one token shares its slot. Its
// value is purpose + "\n" + subject. A nonce (store.NonceKey) lives under
// prefix + "n:" + len(scope) + ":" + scope + ":" + nonce.
//
// An idempotency record lives under prefix + "r:{" + key + "}", and a
// token's own record (store.TokenRecordKey) under prefix + "r:{" + id +
// "}t", in the token's slot. It is a hash: s is "p" while processing and
// "c" once completed, f the fingerprint, o the owner, r the response
// bytes and t when it was opened (microseconds since the Unix epoch, from
// the server's TIME; records opened by releases before Lookup have none).
// It expires with its lease (PEXPIRE), and once completed at the end of
// its retention, which replaces the lease.
//
// # Clocks
//
// Every expiry is a duration from the moment Redis carries the command
// out, counted on the Redis server's clock: tokens and nonces are set with
// a relative TTL (SET NX PX), records get theirs with PEXPIRE, and rate
// limits run on the server's clock too. The application's clock never
// decides how long anything lives, so skew between an instance's and the
// server's clocks can neither shorten a nonce's retention (letting a
// replay through) nor change how long a stored token lives. Durations are sent in
// whole milliseconds, rounded up; one <= 0 stores no token or nonce, and
// deletes a record at once. The instants Lookup reports are the server's
// too: a record's t, and its expiry as the server's TIME plus its PTTL.
//
// # Failure
//
// Every call runs under the store's timeout (WithTimeout, 500ms by
// default) and any failure is an error, never a success: an unreachable
// Redis makes redemption fail closed. go-redis applies a context's
// deadline to network reads and writes only when ContextTimeoutEnabled is
// set, so set it; otherwise a call to a server that has stopped answering
// blocks until the client's ReadTimeout (3s by default, per attempt):
//
//	client := goredis.NewUniversalClient(&goredis.UniversalOptions{
//		Addrs:                 []string{"127.0.0.1:6379"},
//		ContextTimeoutEnabled: true, // bound I/O by the store's timeout
//	})
//	s := redis.New(client, redis.WithPrefix("myapp:"))
//	defer s.Close() // closes client too
//
// The store owns the client it is given: Close closes it.
//
// # Replication
//
// Redis replicates asynchronously. If a primary fails over, writes it
// acknowledged just before may be lost: a token redeemed in that window
// can be redeemed once more, a recorded nonce accepted again, and a
// token just issued can vanish. The window is the replication lag,
// usually milliseconds. WithMinReplicas closes it for the replicas it
// counts: a change is reported only once that many replicas have
// acknowledged it (WAIT), and fails with ErrNotReplicated otherwise.
// For Sentinel, give New a goredis.NewFailoverClient with
// ContextTimeoutEnabled; for Cluster, a ClusterClient whose masters have
// replicas.
package redis
