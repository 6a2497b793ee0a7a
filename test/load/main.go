// Command load drives a Replayguard server, or the baseline server in
// ./baseline, with concurrent HTTP requests and reports throughput and
// latency.
//
// Modes (-mode):
//
//	pairs   each worker loops: POST /v1/tokens with an empty body, then
//	        POST /v1/tokens/redeem with the token in the Idempotency-Token
//	        header. Only a 201 followed by a 200 counts as a pair.
//	forged  POST /v1/tokens/redeem with well-formed, unexpired HS256 JWTs
//	        that carry the server's current kid but are signed with another
//	        key; each must be answered 401 token_invalid. The kid comes from
//	        -kid, or from the header of one real token fetched first.
//	noop    POST -noop-path (default /noop), which must answer 204: the
//	        floor of an HTTP round trip, for the baseline server.
//	verify  POST -verify-path (default /v1/signatures/verify) with the
//	        JSON description of a freshly signed request: POST -verify-url
//	        with a small JSON body, signed by replay.NewSigner with
//	        hmac-sha256 (-alg hmac, key ID "bench") or ed25519 (-alg
//	        ed25519, key ID "bench-ed"): created now, a fresh random
//	        nonce, content-digest covered. Only 200 "status":"verified"
//	        counts. The -pool requests are all signed before the timed
//	        phase, so that signing on the client (up to tens of µs each
//	        with ed25519, on the same CPUs as the server) does not count;
//	        each is sent once, and the run ends when they run out.
//	redeem  POST -redeem-path with tokens issued before the timed phase
//	        (-pool of them, at -issue-path), each once: redemption alone,
//	        for the baseline's GETDEL route. Only 200 counts.
//
// Gateway modes, for gateway.sh (see gateway.go): each POSTs -path
// (default /orders) with a small JSON order and counts only 201 answers
// with a Location header, as the app in ./app gives them.
//
//	bare         new orders, sent to the app itself.
//	passthrough  the same, sent to the gateway on a path no route matches.
//	first        the same with a fresh Idempotency-Key on each, for an
//	             idempotency_key route: every answer must be a first
//	             execution (no Idempotent-Replayed).
//	replay       each worker completes one keyed request before the timed
//	             phase and then repeats it: every answer must be its
//	             replay (Idempotent-Replayed: true, the same Location and
//	             body).
//	fp-first     new orders (each body its own) without a key, for a
//	             fingerprint route: no answer may be a replay.
//	fp-replay    as replay, without a key: the repeated body is the key,
//	             on a fingerprint route whose window outlasts the run.
//	wh-first     new orders, each a Standard Webhooks delivery with a new
//	             webhook-id, signed when sent (with the secret "load
//	             webhook-secret" prints), for a webhook route: every answer
//	             must be a first execution.
//	wh-replay    as replay, for a webhook route: each worker's one delivery
//	             is sent again and again, signed anew each time (a later
//	             timestamp, as a provider's redelivery), and every answer
//	             must be its replay.
//
// A run is bounded by -duration and by -max-requests, whichever comes
// first, and stops by itself. Only loopback targets are accepted, and the
// dialer refuses any address outside the loopback range.
//
// It prints a human summary, then one line of JSON (the summary as data);
// -json FILE appends that line to FILE too. The exit status is 1 when the
// run saw a 5xx, a transport error or an unexpected answer, 2 on bad flags.
//
// "load report" turns the JSON lines of several runs plus Go and
// redis-benchmark output into the Markdown tables of BENCHMARKS.md (see
// report.go), "load gateway-report" does the same for the gateway modes
// (see gateway.go), "load clientkeys" prints the REPLAYGUARD_CLIENT_KEYS
// file of the fixed test keys verify mode signs with, "load
// webhook-secret" the secret the webhook modes sign with, and "load
// perfsplit" splits a server's perf profile into categories of CPU time
// (see perfsplit.go). run.sh runs the whole comparison, gateway.sh the
// gateway's, webhook.sh the webhook route's.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) > 1 {
		sub := map[string]func([]string, io.Writer) error{"report": report, "gateway-report": gatewayReport, "perfsplit": perfSplitCmd, "clientkeys": clientKeysCmd, "webhook-secret": webhookSecretCmd}[os.Args[1]]
		if sub != nil {
			if err := sub(os.Args[2:], os.Stdout); err != nil {
				fmt.Fprintf(os.Stderr, "load %s: %v\n", os.Args[1], err)
				os.Exit(2)
			}
			return
		}
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	sum, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
	if err := writeSummary(os.Stdout, cfg.jsonFile, sum); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
	if !sum.Clean {
		os.Exit(1)
	}
}

// Limits on the flags, so that no invocation runs unbounded.
const (
	maxDuration = 10 * time.Minute
	maxWorkers  = 4096
	maxRequests = 100_000_000
)

// config is one run's settings.
type config struct {
	url         string
	mode        string
	label       string
	name        string
	workers     int
	duration    time.Duration
	maxRequests int64
	timeout     time.Duration

	issuePath   string
	redeemPath  string
	noopPath    string
	tokenField  string
	tokenHeader string
	kid         string
	forgedPool  int
	verifyPath  string
	verifyURL   string
	alg         string
	keyID       string
	pool        int
	path        string

	watch     string
	jsonFile  string
	readyFile string
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.url, "url", "http://127.0.0.1:8080", "base URL of the server (loopback only)")
	fs.StringVar(&c.mode, "mode", "pairs", "pairs, forged, noop, verify or redeem; for the gateway: bare, passthrough, first, replay, fp-first, fp-replay, wh-first or wh-replay")
	fs.StringVar(&c.label, "label", "", "name of the target in the summary (default: the URL's host)")
	fs.StringVar(&c.name, "name", "", "name of the mode in the summary and the report, such as pairs-1conn for a pairs run at -workers 1 (default: the mode, with /alg in verify mode)")
	fs.IntVar(&c.workers, "workers", 64, "concurrent workers, each with at most one request in flight")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long to run (at most 10m)")
	fs.Int64Var(&c.maxRequests, "max-requests", 20_000_000, "stop after this many requests, whichever comes first")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "timeout of one request")
	fs.StringVar(&c.issuePath, "issue-path", "/v1/tokens", "path that issues a token")
	fs.StringVar(&c.redeemPath, "redeem-path", "/v1/tokens/redeem", "path that redeems a token")
	fs.StringVar(&c.noopPath, "noop-path", "/noop", "path that answers 204, for -mode noop")
	fs.StringVar(&c.tokenField, "token-field", "token", "JSON field of the issue answer that holds the token")
	fs.StringVar(&c.tokenHeader, "token-header", "Idempotency-Token", "request header that carries the token to redeem")
	fs.StringVar(&c.kid, "kid", "", "kid of forged tokens (default: read from one real token issued first)")
	fs.IntVar(&c.forgedPool, "forged-pool", 4096, "distinct forged tokens to cycle through")
	fs.StringVar(&c.verifyPath, "verify-path", "/v1/signatures/verify", "path that verifies a signed request, for -mode verify")
	fs.StringVar(&c.verifyURL, "verify-url", "https://api.example.com/v1/orders?id=7", "URL of the signed requests that -mode verify describes (never dialed)")
	fs.StringVar(&c.alg, "alg", "hmac", "algorithm of -mode verify: hmac (hmac-sha256) or ed25519")
	fs.StringVar(&c.keyID, "keyid", "", "key ID of -mode verify (default: bench for hmac, bench-ed for ed25519)")
	fs.IntVar(&c.pool, "pool", 50_000, "requests prepared before the timed phase in -mode verify (signed) and redeem (issued); each is sent once")
	fs.StringVar(&c.path, "path", "/orders", "path the gateway modes POST to")
	fs.StringVar(&c.watch, "watch", "", "name:pid,... processes whose CPU time to report (Linux /proc)")
	fs.StringVar(&c.jsonFile, "json", "", "also append the JSON summary line to this file")
	fs.StringVar(&c.readyFile, "ready-file", "", "create this file when the timed phase starts, after the preparation (for scripts that profile the server during the run)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch _, gw := gatewayModes[c.mode]; {
	case gw:
	case c.mode == "pairs", c.mode == "forged", c.mode == "noop", c.mode == "verify", c.mode == "redeem":
	default:
		return nil, fmt.Errorf("-mode %q: want pairs, forged, noop, verify, redeem, bare, passthrough, first, replay, fp-first, fp-replay, wh-first or wh-replay", c.mode)
	}
	if !strings.HasPrefix(c.path, "/") {
		return nil, fmt.Errorf("-path %q: want an absolute path", c.path)
	}
	if _, ok := verifyAlgs[c.alg]; !ok {
		return nil, fmt.Errorf("-alg %q: want hmac or ed25519", c.alg)
	}
	if c.pool < 1 || c.pool > 10_000_000 {
		return nil, errors.New("-pool must lie within [1, 10000000]")
	}
	if c.workers < 1 || c.workers > maxWorkers {
		return nil, fmt.Errorf("-workers must lie within [1, %d]", maxWorkers)
	}
	if c.duration <= 0 || c.duration > maxDuration {
		return nil, fmt.Errorf("-duration must lie within (0, %v]", maxDuration)
	}
	if c.maxRequests < 1 || c.maxRequests > maxRequests {
		return nil, fmt.Errorf("-max-requests must lie within [1, %d]", maxRequests)
	}
	if c.timeout <= 0 || c.timeout > time.Minute {
		return nil, errors.New("-timeout must lie within (0, 1m]")
	}
	if c.forgedPool < 1 || c.forgedPool > 1<<20 {
		return nil, errors.New("-forged-pool must lie within [1, 1048576]")
	}
	host, err := checkLoopbackURL(c.url)
	if err != nil {
		return nil, err
	}
	if c.label == "" {
		c.label = host
	}
	if _, err := parseWatch(c.watch); err != nil {
		return nil, err
	}
	return c, nil
}
