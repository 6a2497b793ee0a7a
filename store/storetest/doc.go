// Package storetest is the conformance suite every store.Store runs.
//
// Each implementation calls Run from its own tests with a factory for
// fresh, isolated instances, so that memory, miniredis, Redis and Redis
// Cluster are held to exactly the same semantics.
//
// A store's test file runs it like this (ExampleRun), with a manual
// Clock for a store that takes one:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Instance {
//			clock := storetest.NewClock(time.Now())
//			s := mystore.New(mystore.WithClock(clock.Now)) // fresh and isolated: its own key prefix, schema or database
//			return storetest.Instance{Store: s, Limiter: s, Now: clock.Now, Advance: clock.Advance, TTL: ttlOf(s)}
//		})
//	}
//
// A store on a server that expires entries by its own clock (Redis,
// PostgreSQL) gives Now: time.Now and Advance: time.Sleep instead;
// Advance then waits.
package storetest
