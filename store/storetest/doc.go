// Package storetest is the conformance suite every store.Store runs.
//
// Each implementation calls Run from its own tests with a factory for
// fresh, isolated instances, so that memory, miniredis, Redis and Redis
// Cluster are held to exactly the same semantics.
//
// A store's test file runs it like this, with the real clock for a server
// that expires entries by its own (Advance then waits):
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Instance {
//			s := mystore.New(…) // fresh and isolated: its own key prefix, schema or database
//			return storetest.Instance{Store: s, Limiter: s, Now: time.Now, Advance: time.Sleep, TTL: ttlOf(s)}
//		})
//	}
package storetest
