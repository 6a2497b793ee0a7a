// Package metrics holds Replayguard's Prometheus collectors and a store
// wrapper that times every store call.
package metrics
