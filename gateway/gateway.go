package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/fileread"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/tracing"
	"github.com/replayguard/replayguard/webhook"
)

// Headers the gateway sends the app. Client-sent copies are removed from
// every request, routed or not.
const (
	// TokenIDHeader carries the redeemed token's id on PolicyToken routes.
	TokenIDHeader = token.IDHeader
	// ClientKeyIDHeader carries the verified signature's keyid on
	// PolicySignature routes.
	ClientKeyIDHeader = "Replayguard-Client-Key-Id"
	// WebhookIDHeader carries the verified delivery's ID (the key it runs
	// once under, see webhook.Delivery) on PolicyWebhook routes.
	WebhookIDHeader = "Replayguard-Webhook-Id"
)

// MaxSecretFile is the largest secret_file New reads: 1 MiB.
const MaxSecretFile = 1 << 20

// Timeouts towards the app.
const (
	// DefaultTimeout bounds one request to the app, from sending it to
	// the end of the response body.
	DefaultTimeout = 30 * time.Second
	// dialTimeout bounds connecting to the app (and its TLS handshake).
	dialTimeout = 5 * time.Second
)

// Gateway is an http.Handler that protects an app it proxies to: each
// request matching a route gets the route's policy before it reaches the
// app, every other request passes through. Create it with New.
type Gateway struct {
	upstream  *url.URL
	mux       *http.ServeMux
	proxy     *httputil.ReverseProxy
	keeper    *idempotency.Keeper
	tokens    *token.Service
	verifier  *replay.Verifier
	scope     func(*http.Request) string
	window    time.Duration
	clientIP  func(*http.Request) string
	quota     guard.Option // WithCallerQuota
	netQuota  guard.Option // WithAddressQuota
	netBytes  guard.Option // WithAddressBytes
	transport http.RoundTripper
	timeout   time.Duration
	log       *slog.Logger
	metrics   *metrics.Metrics
	getenv    func(string) string
	notBefore time.Time // WithWebhookNotBefore
	// hostRoutes is set when a route's pattern has a host: a request
	// without a Host is refused then (checkTarget).
	hostRoutes bool
	tracer     trace.Tracer                  // WithTracerProvider; nil: not traced
	prop       propagation.TextMapPropagator // WithPropagator
	spellings  spellings                     // the routes by the folded spellings of their paths
}

// Option configures a Gateway.
type Option func(*Gateway)

// WithKeeper keeps the records of PolicyIdempotencyKey,
// PolicyFingerprint and PolicyToken routes with k; a route's lock_ttl,
// retention and max_body override k's. Required when a route has one of
// these policies.
func WithKeeper(k *idempotency.Keeper) Option { return func(g *Gateway) { g.keeper = k } }

// WithTokens redeems the tokens of PolicyToken routes with s. Required
// when a route has that policy.
func WithTokens(s *token.Service) Option { return func(g *Gateway) { g.tokens = s } }

// WithVerifier verifies the signed requests of PolicySignature routes
// with v. Required when a route has that policy.
func WithVerifier(v *replay.Verifier) Option { return func(g *Gateway) { g.verifier = v } }

// WithScope sets whom an idempotency record belongs to (see
// guard.WithScope and guard.ParseScope); a function returning "" falls
// back to the default. Defaults to guard.Credentials(): the credentials
// the request carries (Authorization, Cookie), else the client IP.
func WithScope(f func(*http.Request) string) Option { return func(g *Gateway) { g.scope = f } }

// WithCallerQuota bounds the idempotency records one caller may open on
// PolicyIdempotencyKey and PolicyFingerprint routes, with keyed and
// keyless requests alike: n per the route's retention, counted in lim
// (see guard.WithCallerQuota). Defaults to none.
func WithCallerQuota(lim store.Limiter, n int) Option {
	return func(g *Gateway) { g.quota = guard.WithCallerQuota(lim, n) }
}

// WithAddressQuota bounds the idempotency records every caller from one
// client IP (an IPv6 client's /64) may open together on
// PolicyIdempotencyKey and PolicyFingerprint routes, with keyed and
// keyless requests alike: n per the route's retention, counted in lim
// (see guard.WithAddressQuota). Defaults to none.
func WithAddressQuota(lim store.Limiter, n int) Option {
	return func(g *Gateway) { g.netQuota = guard.WithAddressQuota(lim, n) }
}

// WithAddressBytes bounds the bytes the idempotency records of every
// caller from one client IP (an IPv6 client's /64) may take together on
// PolicyIdempotencyKey and PolicyFingerprint routes, stored responses
// included: n per the route's retention, counted in lim (see
// guard.WithAddressBytes). Defaults to none.
func WithAddressBytes(lim guard.Charger, n int) Option {
	return func(g *Gateway) { g.netBytes = guard.WithAddressBytes(lim, n) }
}

// WithFingerprintWindow sets how long PolicyFingerprint routes keep a
// keyless request's response, from its completion, unless the route sets
// window. Defaults to guard.DefaultFingerprintWindow (2s).
func WithFingerprintWindow(d time.Duration) Option {
	return func(g *Gateway) {
		if d > 0 {
			g.window = d
		}
	}
}

// WithClientIP sets how the client's IP is found, for the default
// idempotency scope and for X-Forwarded-For; where f returns "", the
// default applies. Defaults to the host of r.RemoteAddr, or the IP a
// router in front set on the request (cmd/server sets Gin's ClientIP,
// which believes only REPLAYGUARD_TRUSTED_PROXIES); behind a proxy, give
// the address it forwarded.
func WithClientIP(f func(*http.Request) string) Option {
	return func(g *Gateway) {
		if f != nil {
			g.clientIP = func(r *http.Request) string {
				if ip := f(r); ip != "" {
					return ip
				}
				return request.ClientIP(r)
			}
		}
	}
}

// WithTransport sends requests to the app with rt. Defaults to
// NewTransport() with the WithTimeout timeout as its
// ResponseHeaderTimeout. Give an *http.Transport that speaks HTTP/1.1
// only, as NewTransport's does: over HTTP/2, net/http may resend a
// request the app has run (see NewTransport).
func WithTransport(rt http.RoundTripper) Option {
	return func(g *Gateway) {
		if rt != nil {
			g.transport = rt
		}
	}
}

// WithTimeout bounds each request to the app, from sending it to the end
// of the response body; past it the client gets 502
// upstream_unavailable. Defaults to DefaultTimeout (30s); d <= 0 keeps
// the default. The http.Server serving the gateway must allow as much:
// a WriteTimeout under it cuts the app's late answer, or the 502, off
// into an empty reply, and a ReadTimeout under it cuts off slow uploads
// (cmd/server derives both from it).
func WithTimeout(d time.Duration) Option {
	return func(g *Gateway) {
		if d > 0 {
			g.timeout = d
		}
	}
}

// WithLogger sets the logger for upstream failures and the middleware's
// panics. Defaults to slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(g *Gateway) {
		if l != nil {
			g.log = l
		}
	}
}

// WithMetrics counts token redemptions, signature verifications, webhook
// deliveries, idempotency outcomes and caller quota refusals in m (see
// guard.WithMetrics). Whatever the option, ServeHTTP names each request's
// route for the request series of a counting middleware in front of it
// (handlers' Engine, see metrics.SetRoute): the route's pattern, or
// passthrough, redirect or refused, never the path. Defaults to nil:
// nothing is counted.
func WithMetrics(m *metrics.Metrics) Option { return func(g *Gateway) { g.metrics = m } }

// WithGetenv sets how New reads the variables PolicyWebhook routes name
// in secret_env. Defaults to os.Getenv.
func WithGetenv(getenv func(string) string) Option {
	return func(g *Gateway) {
		if getenv != nil {
			g.getenv = getenv
		}
	}
}

// WithWebhookNotBefore makes PolicyWebhook routes refuse, as 401
// signature_expired, deliveries timestamped before t (truncated to the
// second): give the process start when the Keeper's store forgets its
// records on restart (the memory store), so that a delivery that ran
// before the restart cannot run again inside its window. GitHub
// deliveries carry no time and are not refused. Defaults to none (Redis,
// PostgreSQL: the window alone decides).
func WithWebhookNotBefore(t time.Time) Option { return func(g *Gateway) { g.notBefore = t } }

// NewTransport returns the default transport to the app: HTTP/1.1 only
// (as nginx proxies by default), bounded dials, TLS handshakes and waits
// for response headers (DefaultTimeout; New sets the gateway's timeout
// instead), and pooled connections. It never uses an HTTP proxy from the
// environment.
//
// HTTP/1.1 only, because net/http's HTTP/2 client retries on its own in
// ways the gateway cannot limit to requests the app never saw: it resends
// a stream the app reset with PROTOCOL_ERROR, which the app may have run,
// whatever the request's method and headers.
func NewTransport() *http.Transport {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   dialTimeout,
		ResponseHeaderTimeout: DefaultTimeout,
		ExpectContinueTimeout: time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		Protocols:             &protocols,
	}
}

// New returns a Gateway to the app at upstream (an http or https base
// URL; its path prefixes every request's) applying routes. It fails when
// a route's policy lacks what it needs (WithKeeper, WithTokens,
// WithVerifier) or when two patterns conflict.
func New(upstream *url.URL, routes []Route, opts ...Option) (*Gateway, error) {
	if upstream == nil || (upstream.Scheme != "http" && upstream.Scheme != "https") || upstream.Host == "" {
		return nil, errors.New("gateway: the upstream must be an absolute http or https URL")
	}
	g := &Gateway{
		upstream: upstream,
		mux:      http.NewServeMux(),
		window:   guard.DefaultFingerprintWindow,
		timeout:  DefaultTimeout,
		log:      slog.Default(),
		clientIP: request.ClientIP,
		getenv:   os.Getenv,
		prop:     tracing.Propagator(),
	}
	for _, o := range opts {
		o(g)
	}
	if g.transport == nil {
		t := NewTransport()
		t.ResponseHeaderTimeout = g.timeout
		g.transport = t
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      g.transport,
		ModifyResponse: modifyResponse,
		ErrorHandler:   g.upstreamError,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
	if g.tracer != nil {
		g.traceProxy()
	}
	for i, rt := range routes {
		var h http.Handler
		var err error
		if rt.Policy == PolicyWebhook {
			// Its errors name the key and line themselves.
			if h, err = g.webhookPolicy(rt, i); err != nil {
				return nil, fmt.Errorf("gateway: %w", err)
			}
		} else if h, err = g.policy(rt); err != nil {
			return nil, fmt.Errorf("gateway: routes[%d] %q: %w", i, rt.Match, err)
		}
		rr := &route{Route: rt, handler: h}
		if err := register(g.mux, rt.Match, rr); err != nil {
			return nil, fmt.Errorf("gateway: routes[%d]: %w", i, describeRegisterError(err, rt, routes[:i]))
		}
		if err := g.spellings.add(rt, routes[:i], rr); err != nil {
			return nil, fmt.Errorf("gateway: routes[%d]: %w", i, err)
		}
		g.hostRoutes = g.hostRoutes || patternHost(rt.Match) != ""
		if rt.FailOpen {
			g.log.Warn("gateway: a route fails open: while the store cannot be reached, its requests reach the app without a record, so duplicates run again",
				"route", rt.Match, "policy", rt.Policy)
		}
	}
	return g, nil
}

// route is what the gateway's ServeMux holds for a route.
type route struct {
	Route
	handler http.Handler
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.handler.ServeHTTP(w, r) }

// ServeHTTP removes client-sent copies of the headers the gateway vouches
// for and uppercases the method (many apps read "post" as POST), then
// sends r through its route's policy to the app, or straight to the app
// when no route matches. A request that is another spelling of a routed
// path is redirected (307) to the routed one, so a policy cannot be
// bypassed by spelling the path another way: a path ServeMux would
// redirect to a routed pattern (dot segments, repeated slashes, a
// subtree's path without its trailing slash), and a path whose
// percent-decoded form is, or cleans to, a routed one (%2e%2e, %2F).
// A path that frameworks map onto a route in other ways is matched as
// that route, and reaches the app as sent once its policy lets it
// through (foldPath): in any case (Express, ASP.NET), with a trailing
// slash (Express, Rails), a .ext suffix (Rails' format), trailing dots
// or spaces on a segment (Windows), compatibility characters (NFKC:
// ／admin), deeper percent-encoding (%256F), or an encoded ? or #. A path
// that is one route as sent and another such spelling is refused
// (errAmbiguous). Spellings that servers read in ways of their own,
// where matching or redirecting would mean guessing the app's reading,
// are refused with 400 invalid_request, routed or not (checkTarget,
// foldPath): a malformed Host, a missing one when a route has a host
// pattern, and a backslash, semicolon, double-encoded dot, slash,
// backslash or semicolon, or control character in the path (also as
// NFKC lookalikes such as ＼, or encoded deeper), a path that is not
// UTF-8 once decoded (the overlong %c0%af), and a segment of only dots
// and spaces other than . and .. (...). Host patterns match
// whatever the case of the Host header and with a trailing dot
// (SHOP.TEST, shop.test.), as DNS resolves and virtual hosts match them
// alike; the app gets the Host as sent in X-Forwarded-Host.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := checkTarget(r, g.hostRoutes); err != nil {
		metrics.SetRoute(r.Context(), metrics.RouteRefused)
		problem.Write(w, err)
		return
	}
	StripVerifiedHeaders(r.Header)
	if m := strings.ToUpper(r.Method); m != r.Method {
		r = r.WithContext(r.Context())
		r.Method = m
	}
	rt, pattern, redirect, err := g.match(r)
	switch {
	case err != nil:
		metrics.SetRoute(r.Context(), metrics.RouteRefused)
		problem.Write(w, err)
	case redirect != nil:
		metrics.SetRoute(r.Context(), metrics.RouteRedirect)
		redirect.ServeHTTP(w, r)
	case rt != nil:
		metrics.SetRoute(r.Context(), pattern)
		// The policy's scope falls back to the client IP this gateway
		// finds (WithClientIP).
		r2 := request.WithClientIP(r, g.clientIP(r))
		r2.Pattern = pattern
		if g.tracer != nil {
			g.nameSpan(r2, pattern)
		}
		rt.ServeHTTP(w, r2)
	default:
		metrics.SetRoute(r.Context(), metrics.RoutePassthrough)
		g.forward(w, r, false)
	}
}

// match finds r's route, or the redirect to its routed spelling. Both
// come from the ServeMux: ServeMux.Handler answers a path it would
// redirect (one not in canonical form, or a subtree's path without its
// slash) with a redirect handler and the pattern of the path it redirects
// to, which is a route's, as the mux holds nothing else. ServeMux cleans
// the path as sent, without decoding it, while an app (or a server in
// front of it, such as nginx) may decode %2e%2e or %2F before it resolves
// dot segments: so the decoded path, escaped again, is looked up too, and
// a request whose decoded path is routed or redirected to a route is
// redirected there. Every other spelling of a route's path is found in
// the folded mux, under its folded path (foldPath) or that path without
// a .ext suffix (extCuts); a path routed as sent is looked up there too,
// and refused when it is the spelling of another route. ServeMux
// compares hosts exactly (ignoring the port), so the lookups see the
// Host in canonical form (canonicalHost).
func (g *Gateway) match(r *http.Request) (rt *route, pattern string, redirect http.Handler, err error) {
	if host := canonicalHost(r.Host); host != r.Host {
		r = r.WithContext(r.Context())
		r.Host = host
	}
	h, pattern := g.mux.Handler(r)
	rt, _ = h.(*route)
	if r.Method == http.MethodConnect {
		if rt == nil {
			pattern = ""
		}
		return rt, pattern, nil, nil
	}
	key, err := foldPath(r.URL.Path)
	if err != nil {
		return nil, "", nil, err
	}
	spelled, err := g.spellings.route(r, key)
	if err != nil {
		return nil, "", nil, err
	}
	if rt != nil {
		if spelled != nil && spelled != rt {
			return nil, "", nil, errAmbiguous
		}
		return rt, pattern, nil, nil
	}
	if pattern != "" {
		return nil, "", h, nil
	}
	decoded := &url.URL{Path: r.URL.Path, RawQuery: r.URL.RawQuery}
	if decoded.EscapedPath() != r.URL.EscapedPath() {
		r2 := r.WithContext(r.Context())
		r2.URL = decoded
		h, pattern = g.mux.Handler(r2)
		if _, ok := h.(*route); ok {
			// The decoded path is routed, hence canonical: a Location
			// that cannot start with //.
			return nil, "", http.RedirectHandler(decoded.String(), http.StatusTemporaryRedirect), nil
		}
		if pattern != "" {
			return nil, "", h, nil
		}
	}
	if spelled != nil {
		return spelled, spelled.Match, nil, nil
	}
	return nil, "", nil, nil
}

// canonicalHost is host (a Host header: a name or IP literal with an
// optional port) lowercased and without trailing dots on its name, the
// spelling route patterns use for a host that DNS and virtual hosting
// treat as the same (SHOP.TEST, shop.test., shop.test.:80).
func canonicalHost(host string) string {
	host = strings.ToLower(host)
	name, port := host, ""
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		name, port = host[:i], host[i:]
	}
	return strings.TrimRight(name, ".") + port
}

// StripVerifiedHeaders removes the headers only the gateway may set
// (TokenIDHeader, ClientKeyIDHeader, WebhookIDHeader) from h, in every
// spelling an app might read as them: any case, and with underscores for
// hyphens, which CGI-style servers (PHP, Rack, WSGI) turn into the same
// variable.
func StripVerifiedHeaders(h http.Header) {
	for name := range h {
		n := strings.ReplaceAll(strings.ToLower(name), "_", "-")
		if n == "replayguard-token-id" || n == "replayguard-client-key-id" || n == "replayguard-webhook-id" {
			delete(h, name)
		}
	}
}

// clientAddressHeaders are the headers through which apps and their
// middleware learn the client's address, host and scheme from a proxy in
// front (chi's RealIP believes True-Client-IP, then X-Real-IP, then
// X-Forwarded-For), in lowercase with hyphens.
var clientAddressHeaders = []string{"x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "forwarded", "x-real-ip", "true-client-ip"}

// stripClientAddress removes client-sent clientAddressHeaders from h in
// every spelling an app might read as them: any case, and with
// underscores for hyphens (X_Real_IP is HTTP_X_REAL_IP to PHP, Rack and
// WSGI), which ReverseProxy leaves (it removes the canonical
// X-Forwarded-* and Forwarded only).
func stripClientAddress(h http.Header) {
	for name := range h {
		for _, want := range clientAddressHeaders {
			if sameHeader(name, want) {
				delete(h, name)
				break
			}
		}
	}
}

// sameHeader reports whether header name is want (lowercase, with
// hyphens) in any case, with underscores for hyphens.
func sameHeader(name, want string) bool {
	if len(name) != len(want) {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		case c == '_':
			c = '-'
		}
		if c != want[i] {
			return false
		}
	}
	return true
}

// policy builds the handler chain of a route: its policy's middleware
// around the proxy.
func (g *Gateway) policy(rt Route) (http.Handler, error) {
	common := []guard.Option{guard.WithLogger(g.log), guard.WithMetrics(g.metrics)}
	switch rt.Policy {
	case PolicyIdempotencyKey, PolicyFingerprint:
		if g.keeper == nil {
			return nil, errors.New("policy " + rt.Policy + " needs an idempotency.Keeper (WithKeeper)")
		}
		keeper := g.routeKeeper(rt)
		opts := append(common, g.keyOptions(rt)...)
		opts = append(opts,
			guard.WithKeyRequired(rt.Required),
			guard.UnsafeFailOpen(rt.FailOpen),
			guard.WithMaxBody(int64(keeper.MaxBody())))
		for _, q := range []guard.Option{g.quota, g.netQuota, g.netBytes} {
			if q != nil {
				opts = append(opts, q)
			}
		}
		if rt.Policy == PolicyFingerprint {
			window := rt.Window
			if window <= 0 {
				window = g.window
			}
			opts = append(opts, guard.WithFingerprintWindow(window))
		}
		return guard.Idempotent(keeper, opts...)(g.recorded()), nil
	case PolicyToken:
		if g.tokens == nil {
			return nil, errors.New("policy token needs a token.Service (WithTokens)")
		}
		if g.keeper == nil {
			return nil, errors.New("policy token needs an idempotency.Keeper (WithKeeper) for its records")
		}
		// The response is recorded under the token's ID, with the route's
		// lease, retention and body cap, so a duplicate submit gets the
		// first response (the same 303, say) instead of 409 token_used.
		// A tokenless body is read within max_body for the form field and
		// reaches the app unread.
		keeper := g.routeKeeper(rt)
		opts := append(common, guard.WithRecords(keeper), guard.WithMaxBody(int64(keeper.MaxBody())))
		return guard.RequireToken(g.tokens, rt.Purpose, opts...)(g.recorded()), nil
	case PolicySignature:
		if g.verifier == nil {
			return nil, errors.New("policy signature needs a replay.Verifier (WithVerifier)")
		}
		return guard.RequireSignature(g.verifier, common...)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			g.forward(w, r, false)
		})), nil
	}
	return nil, fmt.Errorf("unknown policy %q", rt.Policy)
}

// keyOptions are the options of an idempotency route's middleware that
// decide its record keys: the scope, and the methods it records.
func (g *Gateway) keyOptions(rt Route) []guard.Option {
	opts := []guard.Option{guard.WithScope(g.scope)}
	if m := patternMethod(rt.Match); m != "" {
		opts = append(opts, guard.WithMethods(m))
	}
	return opts
}

// RecordKey returns the store key of the idempotency record the gateway
// opens (or finds) for r, a request as a client would send it: routed as
// ServeHTTP routes it, to a PolicyIdempotencyKey or PolicyFingerprint
// route, and keyed as that route's middleware keys it (guard.RecordKey:
// its Idempotency-Key, the caller's scope from r's headers or client IP,
// the method and the route). r is never sent anywhere and its body is not
// read. The client IP is the one WithClientIP finds for r (by default the
// host of r.RemoteAddr, or one set with the IP a router found). With the
// key, idempotency.Keeper.Lookup shows the record and Release ends it.
// Errors wrap problem.ErrBadRequest when no such route records r (or r's
// spelling is one ServeHTTP refuses or redirects), else they are
// guard.RecordKey's.
func (g *Gateway) RecordKey(r *http.Request) (string, error) {
	if err := checkTarget(r, g.hostRoutes); err != nil {
		return "", err
	}
	r = r.WithContext(r.Context()) // ServeHTTP's changes, on a copy
	r.Header = r.Header.Clone()
	StripVerifiedHeaders(r.Header)
	r.Method = strings.ToUpper(r.Method)
	rt, pattern, redirect, err := g.match(r)
	switch {
	case err != nil:
		return "", err
	case redirect != nil:
		return "", fmt.Errorf("%w: %s %s is redirected to its routed spelling: look up the routed path", problem.ErrBadRequest, r.Method, r.URL.Path)
	case rt == nil:
		return "", fmt.Errorf("%w: no route matches %s %s: the gateway keeps no record of it", problem.ErrBadRequest, r.Method, r.URL.Path)
	case rt.Policy != PolicyIdempotencyKey && rt.Policy != PolicyFingerprint:
		return "", fmt.Errorf("%w: route %q has policy %s, which keeps no record by Idempotency-Key (a token's record is found by its token, a webhook delivery's by the record ID its log line carries)", problem.ErrBadRequest, pattern, rt.Policy)
	}
	r2 := request.WithClientIP(r, g.clientIP(r))
	r2.Pattern = pattern
	return guard.RecordKey(r2, g.keyOptions(rt.Route)...)
}

// webhookPolicy builds the handler chain of PolicyWebhook route rt,
// routes[i]: guard.RequireWebhook, with a verifier over the route's
// secrets, around the proxy. Its records are the gateway Keeper's with
// the route's overrides, kept at least twice the window (see
// guard.RequireWebhook). Errors name the route's key and line, and the
// variable or file of the secrets, never a secret.
func (g *Gateway) webhookPolicy(rt Route, i int) (http.Handler, error) {
	if g.keeper == nil {
		return nil, fmt.Errorf("routes[%d] %q: policy webhook needs an idempotency.Keeper (WithKeeper)", i, rt.Match)
	}
	key, secrets, err := g.secrets(rt, i)
	if err != nil {
		return nil, err
	}
	scheme, err := webhook.ParseScheme(rt.Scheme)
	if err != nil {
		return nil, rt.fail(i, "scheme", "%v", err)
	}
	v, err := webhook.New(scheme, secrets, webhook.WithWindow(rt.Window), webhook.WithNotBefore(g.notBefore))
	if err != nil {
		return nil, rt.fail(i, key, "%s: %v", secretSource(rt), err)
	}
	keeper := g.routeKeeper(rt)
	opts := []guard.Option{guard.WithLogger(g.log), guard.WithMetrics(g.metrics), guard.WithMaxBody(int64(keeper.MaxBody()))}
	return guard.RequireWebhook(v, keeper, opts...)(g.recorded()), nil
}

// secrets reads the secrets of webhook route rt, routes[i]: from the
// variable secret_env names (comma-separated), or from secret_file (one
// per line); surrounding white space is trimmed and blanks are skipped.
// key is the routes file's key they came from.
func (g *Gateway) secrets(rt Route, i int) (key string, secrets []string, err error) {
	var text string
	switch {
	case rt.SecretEnv != "" && rt.SecretFile != "":
		return "secret_env", nil, rt.fail(i, "secret_env", "set secret_env or secret_file, not both")
	case rt.SecretEnv != "":
		key, text = "secret_env", g.getenv(rt.SecretEnv)
		secrets = splitSecrets(text, ",")
	case rt.SecretFile != "":
		key = "secret_file"
		data, err := fileread.AtMost(rt.SecretFile, MaxSecretFile)
		if err != nil {
			return key, nil, rt.fail(i, key, "%v", err) // names the path
		}
		secrets = splitSecrets(string(data), "\n")
	default:
		return "secret_env", nil, rt.fail(i, "secret_env", "policy webhook needs secret_env or secret_file")
	}
	if len(secrets) == 0 {
		if key == "secret_env" {
			return key, nil, rt.fail(i, key, "the environment variable %s is not set or holds no secret", rt.SecretEnv)
		}
		return key, nil, rt.fail(i, key, "%s holds no secret", rt.SecretFile)
	}
	return key, secrets, nil
}

// secretSource names where rt's secrets come from, for messages.
func secretSource(rt Route) string {
	if rt.SecretEnv != "" {
		return "the environment variable " + rt.SecretEnv
	}
	return rt.SecretFile
}

// splitSecrets splits text at sep, trimming white space and skipping
// blanks.
func splitSecrets(text, sep string) []string {
	var out []string
	for _, s := range strings.Split(text, sep) {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// routeKeeper is the gateway's Keeper with the route's overrides.
func (g *Gateway) routeKeeper(rt Route) *idempotency.Keeper {
	return g.keeper.With(
		idempotency.WithLockTTL(rt.LockTTL),
		idempotency.WithRetention(rt.Retention),
		idempotency.WithMaxBody(rt.MaxBody),
	)
}

// recorded is the proxy for routes whose response is recorded.
func (g *Gateway) recorded() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.forward(w, r, true) })
}

// forward sends r to the app. On routes whose response is recorded
// (detached), the request to the app is not canceled when the client
// goes away: the app's answer is recorded for the client's retry instead
// of being cut off half way, leaving the app's work done but unrecorded.
// Their writer also hides Flush, so that a streamed (chunked) answer is
// still buffered and recorded whole.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, detached bool) {
	ctx := r.Context()
	if detached {
		ctx = context.WithoutCancel(ctx)
		w = noFlush{w}
	}
	if g.tracer != nil {
		var end func()
		ctx, end = g.startUpstream(ctx, r)
		defer end()
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if detached {
		defer func() {
			// ReverseProxy aborts with http.ErrAbortHandler when the
			// app's answer breaks off after its status was sent: the
			// app ran, so its record must not be released for a retry.
			if v := recover(); v != nil {
				abandon(w)
				panic(v)
			}
		}()
	}
	if r.Body != nil && r.Body != http.NoBody {
		b := &clientBody{ReadCloser: r.Body}
		ctx = context.WithValue(ctx, clientBodyKey{}, b)
		r = r.WithContext(ctx)
		r.Body = b
	} else {
		r = r.WithContext(ctx)
	}
	g.proxy.ServeHTTP(w, r)
}

// clientBody is a request body as read from the client, which keeps the
// error a read of it returned: while the body streams to the app, that
// error (a malformed chunked encoding, a body over a limit, a client
// that went away) fails the request to the app, and upstreamError must
// not take it for the app's.
type clientBody struct {
	io.ReadCloser
	err atomic.Pointer[error]
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

// clientBodyKey is the context key of the request's *clientBody, which
// ReverseProxy's ErrorHandler finds under the wrappers of the request it
// gets (its outgoing one).
type clientBodyKey struct{}

// bodyError returns the error a read of r's body from the client
// returned while forward sent it, or nil.
func bodyError(r *http.Request) error {
	if b, ok := r.Context().Value(clientBodyKey{}).(*clientBody); ok {
		if err := b.err.Load(); err != nil {
			return *err
		}
	}
	return nil
}

// abandon leaves the record of the response being written to w
// processing until its lease ends (guard.AbandonRecord): the app may have
// carried the request out, so neither storing the failure nor releasing
// the record for an immediate retry is right.
func abandon(w http.ResponseWriter) {
	if nf, ok := w.(noFlush); ok {
		w = nf.ResponseWriter
	}
	guard.AbandonRecord(w)
}

// neverSent reports whether err, the transport's error for a request
// with method method, proves that no byte of the request reached the app,
// so that a recorded route can release its record for an immediate retry.
// It holds only for methods whose requests the transport never resends
// once written (see sendOnce): a GET can fail on a retry's dial after its
// first attempt was written. With HTTP/1 (NewTransport), the proof is an
// error of getting a connection, before any request is written on it:
//
//   - a dial error (refused, unreachable, DNS, the dial timeout), or one
//     reaching an HTTP proxy (net.OpError "dial" and "proxyconnect");
//   - a TLS handshake with the app that timed out.
//
// Everything else may follow a request the app received: a reset or EOF
// after writing, a timeout waiting for the answer, and even a TLS
// certificate error, which a renegotiation (off in NewTransport, possible
// in another transport) can raise while the answer is read.
func neverSent(method string, err error) bool {
	if safeMethod(method) {
		return false
	}
	if op, ok := errors.AsType[*net.OpError](err); ok && (op.Op == "dial" || op.Op == "proxyconnect") {
		return true
	}
	// Unexported in net/http: should its text change, the error only
	// counts as possibly sent again.
	return err.Error() == "net/http: TLS handshake timeout"
}

// noFlush is a ResponseWriter without Flush, Hijack or Unwrap.
type noFlush struct{ http.ResponseWriter }

// rewrite builds the request to the app: the upstream's URL, the
// X-Forwarded-* and X-Real-IP headers from what the gateway saw
// (client-sent ones, and Forwarded and True-Client-IP, are removed in
// every spelling: stripClientAddress), the verified facts, and the
// request ID. A request whose method is not safe is made one the
// transport never resends (sendOnce).
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(g.upstream)
	if !safeMethod(pr.Out.Method) {
		sendOnce(pr.Out)
	}
	stripClientAddress(pr.Out.Header)
	pr.SetXForwarded()
	if ip := g.clientIP(pr.In); ip != "" {
		pr.Out.Header.Set("X-Forwarded-For", ip)
		pr.Out.Header["X-Real-Ip"] = []string{ip} // canonical: Set would canonicalise on every request
	} else {
		pr.Out.Header.Del("X-Forwarded-For")
	}
	StripVerifiedHeaders(pr.Out.Header)
	ctx := pr.In.Context()
	if c, ok := guard.TokenFrom(ctx); ok {
		pr.Out.Header.Set(TokenIDHeader, c.ID)
	}
	if s, ok := guard.SignatureFrom(ctx); ok {
		pr.Out.Header.Set(ClientKeyIDHeader, s.KeyID)
	}
	if d, ok := guard.WebhookFrom(ctx); ok {
		pr.Out.Header.Set(WebhookIDHeader, d.ID)
	}
	if id := problem.RequestID(ctx); id != "" {
		pr.Out.Header.Set(problem.RequestIDHeader, id)
	}
}

// safeMethod reports whether net/http's Transport may resend a request
// with method m whatever its headers: GET, HEAD, OPTIONS and TRACE.
func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions || m == http.MethodTrace
}

// idempotencyHeaders are the headers that make net/http's Transport
// treat a request of any method as replayable.
var idempotencyHeaders = []string{"Idempotency-Key", "X-Idempotency-Key"}

// sendOnce stops net/http's Transport from sending out again once any of
// it was written: the app may have run it. Over HTTP/1 (the only
// protocol NewTransport speaks) the Transport resends a request on a new
// connection after a reused keep-alive connection failed:
//
//   - when nothing of it was written to the connection (the app closed
//     the idle connection just as the request went out), if its body is
//     empty or can be had again with GetBody. The app never saw it, so
//     this retry is kept: GetBody stays (the bodies guard's middlewares
//     read set it: the idempotency, signature, webhook and token
//     policies'), and a body
//     streamed from the client gets one that works while none of the body
//     has been read (unreadBody), as is the case then: the Transport
//     sends the headers of such a body before reading it.
//   - when the connection broke after the request was written, before
//     any byte of the answer, if the request is replayable: its method is
//     GET, HEAD, OPTIONS or TRACE, or, with a body that is empty or has a
//     GetBody, it carries Idempotency-Key or X-Idempotency-Key
//     (Request.isReplayable). The app may have run it, so this retry must
//     not happen for other methods.
//
// So the two headers move to lowercase names: the Transport looks for them
// under their canonical names only, while header names are
// case-insensitive to every app, so the app gets the headers, the body and
// the framing the client sent, and the request is no longer replayable.
// (Dropping GetBody instead would also stop the first, safe retry, and
// would not help a request without a body.) Requests of the safe methods
// are resent either way, by design of HTTP.
func sendOnce(out *http.Request) {
	for _, name := range idempotencyHeaders {
		if vs, ok := out.Header[name]; ok {
			delete(out.Header, name)
			lower := strings.ToLower(name)
			out.Header[lower] = append(out.Header[lower], vs...)
		}
	}
	if out.Body != nil && out.Body != http.NoBody && out.GetBody == nil {
		b := &unreadBody{ReadCloser: out.Body}
		out.Body = b
		out.GetBody = b.again
	}
}

// errBodyRead is unreadBody.again's error once the body was read.
var errBodyRead = errors.New("gateway: the request body was read, it cannot be sent again")

// unreadBody is a request body streamed from the client that can be sent
// again as long as none of it has been read.
type unreadBody struct {
	io.ReadCloser
	read atomic.Bool
}

func (b *unreadBody) Read(p []byte) (int, error) {
	b.read.Store(true)
	return b.ReadCloser.Read(p)
}

// Close closes the body once it was read. Unread, it stays open for
// again: the Transport closes the body of an attempt that failed before
// it resends the request, and ReverseProxy closes the client's body
// itself when it returns.
func (b *unreadBody) Close() error {
	if !b.read.Load() {
		return nil
	}
	return b.ReadCloser.Close()
}

// again is the body's GetBody: the body itself while unread.
func (b *unreadBody) again() (io.ReadCloser, error) {
	if b.read.Load() {
		return nil, errBodyRead
	}
	return b, nil
}

// modifyResponse drops the app's X-Request-ID when the gateway sent one:
// the response already carries it.
func modifyResponse(resp *http.Response) error {
	if resp.Request != nil && resp.Request.Header.Get(problem.RequestIDHeader) != "" {
		resp.Header.Del(problem.RequestIDHeader)
	}
	return nil
}

// upstreamError answers a request the app did not answer: 502
// upstream_unavailable. The error (an address, a timeout) is logged, not
// sent. When the request provably never reached the app (neverSent: no
// connection could be made), the 502 releases a recorded route's record
// so that a retry runs; when it may have reached it (a timeout, a
// connection broken after sending), the record is abandoned instead:
// duplicates get 409 until its lease ends. A request whose body could
// not be read from the client while it streamed to the app failed by the
// client's fault, not the app's: it is answered as the body's error
// (request.BodyError: 400 invalid_request, or 413 payload_too_large for
// a body over a limit), and its record is abandoned too, since the app
// got part of it.
func (g *Gateway) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if berr := bodyError(r); berr != nil {
		g.log.LogAttrs(r.Context(), slog.LevelDebug, "request body not read from the client",
			slog.String("request_id", problem.RequestID(r.Context())),
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.String("error", berr.Error()))
		abandon(w)
		problem.Write(w, request.BodyError(berr))
		return
	}
	level := slog.LevelWarn
	if errors.Is(r.Context().Err(), context.Canceled) {
		level = slog.LevelDebug // the client went away
	}
	g.log.LogAttrs(r.Context(), level, "upstream request failed",
		slog.String("request_id", problem.RequestID(r.Context())),
		slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.String("error", err.Error()))
	if !neverSent(r.Method, err) {
		// A timeout or a broken connection after the request was sent:
		// the app may have carried it out.
		abandon(w)
	}
	problem.Write(w, fmt.Errorf("%w: %w", problem.ErrUpstreamUnavailable, err))
}

// patternMethod is the method of a ServeMux pattern, or "".
func patternMethod(pattern string) string {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		return pattern[:i]
	}
	return ""
}
