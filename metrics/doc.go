// Package metrics holds Replayguard's Prometheus collectors and a store
// wrapper that times every store call.
//
// The collectors count what the service decides: requests by route
// pattern and status class (handlers' Engine counts them; the gateway
// names its routes with SetRoute), idempotency outcomes (package guard
// counts them where a record is opened and where an execution ends),
// token redemptions, signature and webhook verifications, rate-limit
// refusals, and store calls. Every label takes its values from a fixed
// set or from the configured routes, never from a request's path, key or
// headers, so the number of series is bounded whatever clients send.
// README.md lists every series; docs/grafana/replayguard.json is a
// dashboard over them, and the package's tests check both against the
// registry.
package metrics
