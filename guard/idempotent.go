package guard

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/request"
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
// the client IP. See ScopeHeader and ParseScope. Defaults to the client
// IP: the host of r.RemoteAddr, or gin's ClientIP through Gin.
func WithScope(f func(*http.Request) string) Option { return func(s *settings) { s.scope = f } }

// ScopeHeader returns a scope function for WithScope that identifies the
// caller by a SHA-256 of the values of the request header name, such as
// Authorization: callers presenting the same credential share their
// keys. Requests without the header fall back to the client IP.
func ScopeHeader(name string) func(*http.Request) string {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) string {
		vs := r.Header.Values(name)
		if len(vs) == 0 {
			return ""
		}
		var b []byte
		for _, v := range vs {
			b = appendField(b, v)
		}
		sum := sha256.Sum256(b)
		return "header:" + name + ":" + hex.EncodeToString(sum[:])
	}
}

// DefaultScope is the setting ParseScope reads as the default scope.
const DefaultScope = "client_ip"

// ParseScope returns the scope function a setting names: DefaultScope
// ("client_ip", or "") for the client IP, which is nil, the default;
// "header:Name" for ScopeHeader(Name).
func ParseScope(spec string) (func(*http.Request) string, error) {
	spec = strings.TrimSpace(spec)
	switch name, ok := strings.CutPrefix(spec, "header:"); {
	case spec == "" || spec == DefaultScope:
		return nil, nil
	case ok && request.IsToken(name):
		return ScopeHeader(name), nil
	}
	return nil, fmt.Errorf("idempotency scope %q: want client_ip or header:<Header-Name>", spec)
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
// being stored (Idempotent, and RequireToken with WithRecords): a
// released request runs again on retry, a stored one is answered from the
// record. Defaults to every 5xx status (recommended: a transient failure
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
//   - the key is scoped to the caller (WithScope), the method and the
//     route (the ServeMux pattern, r.Pattern, else the request path);
//   - the request is fingerprinted: a SHA-256 of the method, route, path,
//     query and body in canonical form (JSON re-encoded with sorted keys,
//     form fields in canonical order, WithIgnoredFields left out); the
//     same key with another fingerprint is 422 idempotency_key_reused;
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
	keys, fingerprints := k, (*idempotency.Keeper)(nil)
	if s.window > 0 {
		fingerprints = k.With(idempotency.WithRetention(s.window))
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.idempotent(w, r, keys, fingerprints, next)
		})
	}
}

// idempotent is Idempotent's core: it calls next at most once, with a
// capturing writer when a record was opened. fingerprints is the Keeper of
// fingerprint mode, nil when it is off.
func (s *settings) idempotent(w http.ResponseWriter, r *http.Request, keys, fingerprints *idempotency.Keeper, next http.Handler) {
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
		keeper, kind = fingerprints, "fingerprint"
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
	fp := fingerprint(r, rt, body, s.ignore)
	if kind == "fingerprint" {
		key = fp
	}
	scope := ""
	if s.scope != nil {
		scope = s.scope(r)
	}
	if scope == "" {
		scope = "ip:" + request.ClientIP(r)
	}
	run, stored, err := keeper.Start(r.Context(), recordKey(kind, scope, r.Method, rt, key), fp)
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
		s.record(w, r, run, keeper.MaxBody(), next)
	}
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
