package guard

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
)

// WithMethods sets the methods Idempotent applies to; requests with other
// methods pass through untouched. Defaults to POST and PATCH, as the
// draft recommends (PUT and DELETE are idempotent already).
func WithMethods(methods ...string) Option {
	return func(s *settings) {
		s.methods = map[string]bool{}
		for _, m := range methods {
			s.methods[strings.ToUpper(m)] = true
		}
	}
}

// WithKeyRequired says whether Idempotent refuses a request without an
// Idempotency-Key with 400 idempotency_key_missing (true) or lets it
// through to the handler without a record (false). Defaults to true
// (recommended for APIs whose clients you control). Fingerprint mode
// (WithFingerprintWindow) handles keyless requests itself.
func WithKeyRequired(required bool) Option { return func(s *settings) { s.required = required } }

// WithScope sets whom a stored key belongs to (Idempotent): f returns the
// caller's identity (a user or tenant ID, say), and one caller's key never
// reaches another caller's record. A function returning "" falls back to
// the default. Defaults to Credentials(): the credentials the request
// carries, else the client IP (the host of r.RemoteAddr, or gin's ClientIP
// through Gin).
func WithScope(f func(*http.Request) string) Option { return func(s *settings) { s.scope = f } }

// credentialHeaders are the headers that carry a caller's credentials in
// every scope Credentials makes.
var credentialHeaders = []string{"Authorization", "Cookie"}

// Credentials returns the scope function that identifies a caller by a
// SHA-256 of the credentials its request carries: the Authorization and
// Cookie headers and the headers named in extra (an API key or tenant
// header, say), those that are present. A request that carries none of
// them returns "", so the client IP identifies it.
//
// Credentials come first because a stored response must never reach
// anyone but the caller that made the request: two users behind one NAT
// or proxy share an IP but not a session, and a mobile client whose IP
// changes between retries keeps its credentials, and so its replay. The
// price: a retry whose credentials changed (a refreshed bearer token, a
// rotated session cookie) is a new caller and runs again. For a stable
// identity, scope by the account your application knows (WithScope) or by
// a header a trusted proxy sets with it.
func Credentials(extra ...string) func(*http.Request) string {
	names := append([]string(nil), credentialHeaders...)
	for _, n := range extra {
		if n = http.CanonicalHeaderKey(n); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return func(r *http.Request) string {
		var b []byte
		for _, name := range names {
			vs := r.Header.Values(name)
			if len(vs) == 0 {
				continue
			}
			b = appendField(b, name)
			b = binary.AppendUvarint(b, uint64(len(vs)))
			for _, v := range vs {
				b = appendField(b, v)
			}
		}
		if b == nil {
			return ""
		}
		sum := sha256.Sum256(b)
		return "cred:" + hex.EncodeToString(sum[:])
	}
}

// defaultScope is Credentials().
var defaultScope = Credentials()

// DefaultScope is the setting ParseScope reads as the default scope.
const DefaultScope = "credentials"

// ParseScope returns the scope function a setting names: DefaultScope
// ("credentials", or "") for Credentials(), which is nil, the default;
// "header:Name" for Credentials(Name), the credentials and that header.
// "client_ip", the default of earlier versions, reads as DefaultScope: the
// client IP alone would hand one caller's response to another behind the
// same NAT, so it applies only to requests without credentials.
func ParseScope(spec string) (func(*http.Request) string, error) {
	spec = strings.TrimSpace(spec)
	switch name, ok := strings.CutPrefix(spec, "header:"); {
	case spec == "" || spec == DefaultScope || spec == "client_ip":
		return nil, nil
	case ok && request.IsToken(name):
		return Credentials(name), nil
	}
	return nil, fmt.Errorf("idempotency scope %q: want credentials or header:<Header-Name>", spec)
}

// WithIgnoredFields leaves these fields out of Idempotent's request
// fingerprint: top-level members of a JSON object body, fields of a form
// body (url-encoded or multipart) and query parameters. Use it for values
// a client changes on every retry, such as a client timestamp, so that a
// retry is not refused as idempotency_key_reused. Defaults to none.
func WithIgnoredFields(names ...string) Option {
	return func(s *settings) {
		for _, n := range names {
			s.ignore[n] = true
		}
	}
}

// WithReleaseStatus sets which responses release a record instead of
// being stored (Idempotent, RequireWebhook, and RequireToken with
// WithRecords): a released request runs again on retry, a stored one is
// answered from the record. Defaults to every 5xx status (recommended: a transient failure
// is not replayed for a day); 4xx responses are stored. A panic always
// releases.
func WithReleaseStatus(releases func(status int) bool) Option {
	return func(s *settings) {
		if releases != nil {
			s.releases = releases
		}
	}
}

// releaseServerErrors is the default release policy: every 5xx.
func releaseServerErrors(status int) bool { return status >= 500 }

// WithCallerQuota bounds the records one caller (its scope, see
// WithScope) may open with Idempotent, keyed and fingerprinted requests
// alike: at most n per the Keeper's retention, counted in lim (the
// store's limiter: memory, Redis or PostgreSQL), so that one caller can
// never take a bounded store's room for records from everyone else. A
// request past it is refused with 429 rate_limited and Retry-After before
// its handler runs; duplicates of the caller's existing keys and
// fingerprints are still answered from their records. Since a record
// lives at most the retention, a caller holds at most about 2n live
// records. A fingerprint record counts as a keyed one although it lives
// only the fingerprint window: the bound is on the records a caller
// opens, so that holding them briefly is no way around it. Defaults to
// none (recommended with an unbounded store sized for the traffic;
// cmd/server sets it on the memory store).
func WithCallerQuota(lim store.Limiter, n int) Option {
	return func(s *settings) { s.quota, s.quotaN = lim, n }
}

// WithAddressQuota bounds the records every caller from one network
// address (the client IP; an IPv6 client's /64) may open together with
// Idempotent, keyed and fingerprinted requests alike: at most n per
// the Keeper's retention, counted in lim as WithCallerQuota's are, so
// a caller past it gets 429 rate_limited with Retry-After before its
// handler runs, and its duplicates are still answered. WithCallerQuota
// alone counts per scope, and a scope is made of the credentials a
// request carries, which nothing here checks: one client inventing a
// new Authorization for each request is a new caller each time, but
// not a new address. Set n above the per-caller quota, since callers
// behind one NAT or proxy share an address, and well below what the
// store holds. The client IP is the one the router found (trust your
// proxies, or every caller shares the proxy's address). Defaults to
// none (cmd/server sets it on the memory store).
func WithAddressQuota(lim store.Limiter, n int) Option {
	return func(s *settings) { s.netQuota, s.netN = lim, n }
}

// Charger is a store.Limiter that can also count an event of any
// weight, such as a stored response's bytes. The memory store is one
// (memory.Store.Charge).
type Charger interface {
	store.Limiter
	// Charge counts an event of weight n for key against l, in the bucket
	// Allow counts in (n over l.Burst counts as l.Burst), even when less
	// than n is left: the bucket then owes the rest, and Allow refuses
	// key until it has refilled. fits reports whether n was left. err
	// wraps store.ErrUnavailable, for system failures only.
	Charge(ctx context.Context, key string, l store.Limit, n int) (fits bool, err error)
}

// WithAddressBytes bounds the bytes that the records of every caller from
// one network address (as WithAddressQuota counts it) may take together
// with Idempotent, keyed and fingerprinted requests alike: at most n per
// the Keeper's retention, counted in lim. A record counts its stored
// response (status, headers and body) and about 400 bytes for itself,
// when it completes. A response that does not fit what is left is not
// stored: the record completes without it, as with a body over the
// Keeper's cap, so its duplicates get 409 response_not_stored. It counts
// all the same, so the address's next requests get 429 rate_limited
// with Retry-After before their handlers run, until its bytes have
// refilled; duplicates are still answered. WithAddressQuota alone counts
// records, and a bounded store's room is bytes too: at the memory store's
// default sizes (64 MiB for records), one address answered 100 KB each
// fills it with a few hundred records, far below any useful count. Since
// a record lives at most the retention, one address's records take at
// most about 2n bytes. Defaults to none (cmd/server sets it on the memory
// store).
func WithAddressBytes(lim Charger, n int) Option {
	return func(s *settings) { s.bytesLim, s.bytesN = lim, n }
}

// recordBytes is about what a record takes in a store besides its
// response: the memory store counts some 380 bytes (its overhead, key,
// fingerprint and owner), Redis a little less.
const recordBytes = 400

// UnsafeFailOpen, when open is true, lets Idempotent run the handler
// without a record when the store cannot be reached (or is full), so
// duplicates run again during an outage. Defaults to false (recommended):
// the handler does not run and the answer is 503.
func UnsafeFailOpen(open bool) Option { return func(s *settings) { s.failOpen = open } }

// WithFingerprintWindow turns on Idempotent's fingerprint mode, for
// clients that send no Idempotency-Key: the key is derived from the
// caller, the route and the request fingerprint, and the response is kept
// for window from the first request's completion, so an identical request
// inside the window (an accidental double submit) gets the stored
// response with Idempotent-Replayed: true. Requests that carry a key are
// handled by it as usual. Defaults to off; window <= 0 means
// DefaultFingerprintWindow (2s).
func WithFingerprintWindow(window time.Duration) Option {
	return func(s *settings) {
		if window <= 0 {
			window = DefaultFingerprintWindow
		}
		s.window = window
	}
}

// Idempotent is middleware that runs next once per Idempotency-Key and
// answers every duplicate with the stored response of that one run,
// keeping its records with k (k's lease, retention and body cap apply):
//
//   - requests with other methods than POST and PATCH pass through (see
//     WithMethods);
//   - a missing key is 400 idempotency_key_missing (see WithKeyRequired,
//     WithFingerprintWindow), a malformed one 400 invalid_idempotency_key;
//   - the key is scoped to the caller (its credentials, else its IP: see
//     Credentials and WithScope), the method and the
//     route (the ServeMux pattern, r.Pattern, else the request path);
//   - the request is fingerprinted: a SHA-256 of the method, route, path,
//     query and body in canonical form (JSON re-encoded with sorted keys,
//     form fields in canonical order, WithIgnoredFields left out); the
//     same key with another fingerprint is 422 idempotency_key_reused; a
//     JSON body that could read two ways (a member named twice in one
//     object, also in two cases such as "qty" and "QTY", text that is
//     not UTF-8 or escapes a lone surrogate) is 400 invalid_request;
//   - a duplicate while the first runs gets 409 request_in_progress with
//     Retry-After; after it, the stored status, headers and body, byte
//     for byte, with Idempotent-Replayed: true;
//   - when the store cannot be reached, next does not run: 503
//     store_unavailable (see UnsafeFailOpen).
//
// The response is buffered and the record completed (or released, for a
// 5xx, see WithReleaseStatus) before the first byte is sent, so a client
// that got an answer never gets 409 for its retry. The cost is that the
// client sees nothing until the handler returns. A response whose body
// grows past the Keeper's cap (or that the handler flushes) is streamed:
// the record completes without its body at that moment, the bytes go out
// as they are written, and duplicates get 409 response_not_stored.
// Set-Cookie, Date, hop-by-hop headers and the headers outer middleware
// set (such as X-Request-ID) are not stored; trailers are neither stored
// nor replayed. A panic in next releases the record and is answered with
// 500 internal_error (or aborts the connection when the response was
// already streaming). Hijacking the connection is refused. The request's
// context is not canceled when the lease is lost (the handler outlived
// the lock TTL without a heartbeat reaching the store): the response
// still goes out, unrecorded. The request body is read up to WithMaxBody
// to fingerprint it, and handed on intact.
func Idempotent(k *idempotency.Keeper, opts ...Option) func(http.Handler) http.Handler {
	s := newSettings(opts)
	keys := recordsOf{Records: keeperRecords{k}, retention: k.Retention()}
	var fingerprints *recordsOf
	if s.window > 0 {
		// Counted in the quotas as keyed records are (see WithCallerQuota).
		fingerprints = &recordsOf{Records: keeperRecords{k.With(idempotency.WithRetention(s.window))}, retention: k.Retention()}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.idempotent(w, r, keys, fingerprints, next)
		})
	}
}

// IdempotentIn is Idempotent with its records kept in rec, such as a
// PostgreSQL transaction of the application's (package
// idempotency/pgtx), which then decides what a lease, a retention and a
// failure mean. The rules for keys, scopes, fingerprints and answers are
// Idempotent's; WithFingerprintWindow, WithCallerQuota, WithAddressQuota
// and WithAddressBytes, which need a Keeper, are ignored.
func IdempotentIn(rec Records, opts ...Option) func(http.Handler) http.Handler {
	s := newSettings(opts)
	keys := recordsOf{Records: rec}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.idempotent(w, r, keys, nil, next)
		})
	}
}

// recordsOf is where one kind of Idempotent's records live, with the
// period its quotas count in (0: no quota): the keyed records' retention.
type recordsOf struct {
	Records
	retention time.Duration
}

// idempotent is Idempotent's core: it calls next at most once, with a
// capturing writer when a record was opened. fingerprints keeps the
// records of fingerprint mode, nil when it is off.
func (s *settings) idempotent(w http.ResponseWriter, r *http.Request, keys recordsOf, fingerprints *recordsOf, next http.Handler) {
	if !s.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	keeper, kind, key := keys, "key", ""
	switch values := r.Header.Values(idempotency.KeyHeader); {
	case len(values) > 1:
		s.refuse(w, r, fmt.Errorf("%w: send one %s header, not %d", idempotency.ErrInvalidKey, idempotency.KeyHeader, len(values)))
		return
	case len(values) == 1:
		k, err := idempotency.ParseKey(values[0])
		if err != nil {
			s.refuse(w, r, err)
			return
		}
		key = k
	case fingerprints != nil:
		keeper, kind = *fingerprints, "fingerprint"
	case s.required:
		s.refuse(w, r, fmt.Errorf("%w: this route requires an %s header, such as %s: \"8e03978e-40d5-43e8-bc93-6894a57f9324\"", idempotency.ErrKeyMissing, idempotency.KeyHeader, idempotency.KeyHeader))
		return
	default:
		next.ServeHTTP(w, r)
		return
	}
	body, err := request.ReadBody(r, s.maxBody)
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	rt := route(r)
	fp, err := fingerprint(r, rt, body, s.ignore)
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	if kind == "fingerprint" {
		key = fp
	}
	scope := s.scopeOf(r)
	policy := metrics.PolicyIdempotencyKey
	if kind == "fingerprint" {
		policy = metrics.PolicyFingerprint
	}
	run, stored, err := s.start(keeper, policy, r, recordKey(kind, scope, r.Method, rt, key), fp)
	if err == nil && run != nil {
		run, err = s.overQuota(r, run, scope, keeper.retention)
	}
	switch {
	case err == nil && run == nil:
		writeStored(w, stored)
	case s.failOpen && (errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrFull)):
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "idempotency store unavailable; running the handler without a record (UnsafeFailOpen)",
			slog.String("request_id", problem.RequestID(r.Context())), slog.String("error", err.Error()))
		next.ServeHTTP(w, r)
	case err != nil:
		s.refuse(w, r, err)
	default:
		s.record(w, run, policy, keeper.MaxBody(), next)
	}
}

// overQuota counts a new record of scope's against WithAddressBytes
// (whether any are left), then WithCallerQuota, then WithAddressQuota,
// and, when it is past one or cannot be counted, releases it and returns
// the refusal. The caller's quota comes before its address's, so that a
// caller past it does not use up its address's. With WithAddressBytes,
// the run it returns counts the record's bytes when it completes.
func (s *settings) overQuota(r *http.Request, run Run, scope string, period time.Duration) (Run, error) {
	if period <= 0 {
		return run, nil
	}
	network := request.Network(request.ClientIP(r))
	byteKey := "record-bytes-net:" + network
	err := quota(r, s.bytesLim, s.bytesN, period, byteKey, "the callers at this address have stored as many response bytes as they may together")
	endpoint := metrics.RateLimitAddressQuota
	if err == nil {
		err = quota(r, s.quota, s.quotaN, period, "records:"+scope, "this caller holds as many idempotency records as it may")
		endpoint = metrics.RateLimitCallerQuota
	}
	if err == nil {
		err = quota(r, s.netQuota, s.netN, period, "records-net:"+network, "the callers at this address hold as many idempotency records as they may together")
		endpoint = metrics.RateLimitAddressQuota
	}
	if err != nil {
		if errors.Is(err, problem.ErrRateLimited) {
			s.metrics.RateLimited(endpoint)
		}
		_ = run.Release(r.Context())
		return nil, err
	}
	if s.bytesLim == nil || s.bytesN <= 0 {
		return run, nil
	}
	return chargedRun{Run: run, lim: s.bytesLim, key: byteKey, limit: store.Limit{Rate: s.bytesN, Burst: s.bytesN, Period: period}}, nil
}

// chargedRun is a Run whose completion counts the record's bytes against
// WithAddressBytes, and leaves the response out when they do not fit.
type chargedRun struct {
	Run
	lim   Charger
	key   string
	limit store.Limit
}

// Complete counts out's bytes and the record's, and completes the record
// with out, or without its headers and body when they did not fit (or
// could not be counted). It counts even when ctx is done, as the record
// completes then too.
func (c chargedRun) Complete(ctx context.Context, out idempotency.Outcome) error {
	if fits, err := c.lim.Charge(context.WithoutCancel(ctx), c.key, c.limit, recordBytes+outcomeBytes(out)); err != nil || !fits {
		out = idempotency.Outcome{Status: out.Status, BodyOmitted: true}
	}
	return c.Run.Complete(ctx, out)
}

// outcomeBytes is about what out takes in a record: its body, and its
// headers with a few bytes of framing each.
func outcomeBytes(out idempotency.Outcome) int {
	n := 8 + len(out.Body)
	for name, vs := range out.Header {
		n += 2 + len(name)
		for _, v := range vs {
			n += 2 + len(v)
		}
	}
	return n
}

// quota counts one record under key in lim, n per period, and returns
// the refusal, whose detail begins with what, when it is past them.
func quota(r *http.Request, lim store.Limiter, n int, period time.Duration, key, what string) error {
	if lim == nil || n <= 0 {
		return nil
	}
	ok, retry, err := lim.Allow(r.Context(), key, store.Limit{Rate: n, Burst: n, Period: period})
	switch {
	case err != nil:
		return err
	case !ok:
		return problem.RetryAfter(fmt.Errorf("%w: %s (%d per %v); retry after Retry-After seconds", problem.ErrRateLimited, what, n, period), retry)
	}
	return nil
}

// scopeOf is the caller r comes from (see WithScope): the scope
// function's answer, else its credentials, else its client IP.
func (s *settings) scopeOf(r *http.Request) string {
	scope := ""
	if s.scope != nil {
		scope = s.scope(r)
	}
	if scope == "" {
		scope = defaultScope(r)
	}
	if scope == "" {
		scope = "ip:" + request.ClientIP(r)
	}
	return scope
}

// RecordKey returns the store key of the record Idempotent, with the same
// opts, opens for r by its Idempotency-Key: the key, the caller's scope
// (WithScope), the method and the route (r.Pattern, else the path), as
// Idempotent hashes them; only WithScope and WithMethods matter here.
// With it an operator finds the record of a request that reached the
// middleware (idempotency.Keeper.Lookup, Release). r's body is not read:
// a keyless request's fingerprint record is found by its record ID (see
// idempotency.RecordID), which the request's log line carries. Errors:
// idempotency.ErrKeyMissing or ErrInvalidKey for r's Idempotency-Key, and
// problem.ErrBadRequest for a method Idempotent lets through unrecorded.
func RecordKey(r *http.Request, opts ...Option) (string, error) {
	s := newSettings(opts)
	if !s.methods[r.Method] {
		return "", fmt.Errorf("%w: Idempotent keeps no record of %s requests", problem.ErrBadRequest, r.Method)
	}
	values := r.Header.Values(idempotency.KeyHeader)
	switch {
	case len(values) == 0:
		return "", fmt.Errorf("%w: the request has no %s", idempotency.ErrKeyMissing, idempotency.KeyHeader)
	case len(values) > 1:
		return "", fmt.Errorf("%w: one %s header, not %d", idempotency.ErrInvalidKey, idempotency.KeyHeader, len(values))
	}
	key, err := idempotency.ParseKey(values[0])
	if err != nil {
		return "", err
	}
	return recordKey("key", s.scopeOf(r), r.Method, route(r), key), nil
}

// recordKey is the store key of a request's record: a hash of the kind
// of key, the caller's scope, the method, the route and the key.
func recordKey(kind, scope, method, route, key string) string {
	b := make([]byte, 0, 5*binary.MaxVarintLen64+len(kind)+len(scope)+len(method)+len(route)+len(key))
	for _, f := range []string{kind, scope, method, route, key} {
		b = appendField(b, f)
	}
	sum := sha256.Sum256(b)
	return "idem:" + hex.EncodeToString(sum[:])
}

// appendField appends s to b, length first, so that fields hashed
// together cannot run into each other.
func appendField(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}
