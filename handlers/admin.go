package handlers

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/token"
)

// WithAdminKeys serves the operators' endpoints, which show an
// idempotency record and release a processing one by hand, to callers
// presenting Authorization: Bearer <key> with one of keys (compared in
// constant time; give operators keys of their own, not the backends' API
// keys):
//
//   - GET /v1/admin/records/{id}: the record whose ID (idempotency.RecordID)
//     a request's log line carries as record_id;
//   - POST /v1/admin/records/lookup: the record of a request, described by
//     {"method", "path", "key", "headers", "client_ip"} and keyed as the
//     gateway keys it (see WithRecordKeys), or of a token, {"token"};
//   - POST /v1/admin/records/{id}/release: deletes the processing record,
//     whoever holds it, so that the next retry runs; logged at WARN with
//     the record ID and the index of the admin key (never the key).
//
// They need WithRecords, whose Keeper looks the records up. Without admin
// keys (the default) they answer 404 not_found; with them, a missing or
// wrong key is 401 unauthorized.
func WithAdminKeys(keys ...string) Option {
	return func(a *API) {
		for _, k := range keys {
			if k != "" {
				a.admin = append(a.admin, sha256.Sum256([]byte(k)))
			}
		}
	}
}

// WithRecordKeys lets POST /v1/admin/records/lookup find the record of a
// request as a client sent it: f returns the store key of the record
// that request opens, as (*gateway.Gateway).RecordKey does (cmd/server
// passes its gateway's in gateway mode). The request f gets is built from
// the lookup's body: its method, path (with any query), headers and
// client IP (the host of its RemoteAddr, and request.ClientIP's), its
// Idempotency-Key, and the Host of the headers, else the admin request's.
// Defaults to nil: a lookup by request is 400 invalid_request, while
// lookups by record ID and by token work.
func WithRecordKeys(f func(r *http.Request) (key string, err error)) Option {
	return func(a *API) { a.keyOf = f }
}

// registerAdmin adds the operators' endpoints (see WithAdminKeys).
func (a *API) registerAdmin(r gin.IRoutes) {
	none := func(string) {} // counted by the request series only
	r.GET("/v1/admin/records/:id", a.handle(a.operator(a.recordByID), none))
	r.POST("/v1/admin/records/lookup", a.handle(a.operator(a.lookupRecord), none))
	r.POST("/v1/admin/records/:id/release", a.handle(a.operator(a.releaseRecord), none))
}

// adminEndpoint is an operators' endpoint: it gets the index of the
// admin key the caller presented.
type adminEndpoint func(c *gin.Context, keyIndex int) (string, error)

// operator is what every operators' endpoint does first: 404 while they
// are off, then the admin key, then the records.
func (a *API) operator(e adminEndpoint) endpoint {
	return func(c *gin.Context) (string, error) {
		if len(a.admin) == 0 {
			return "", problem.ErrNotFound
		}
		i, ok := keyIndex(c.Request, a.admin)
		if !ok {
			return "", fmt.Errorf("%w: send Authorization: Bearer <admin key>", problem.ErrUnauthorized)
		}
		if a.keeper == nil {
			return "", fmt.Errorf("%w: this server keeps no records", problem.ErrNotFound)
		}
		noStore(c)
		return e(c, i)
	}
}

// recordByID answers GET /v1/admin/records/{id}.
func (a *API) recordByID(c *gin.Context, _ int) (string, error) {
	key, err := idempotency.ParseRecordID(c.Param("id"))
	if err != nil {
		return "", err
	}
	return "", a.showRecord(c, key)
}

// lookupBody is the body of POST /v1/admin/records/lookup: a token, or
// a request as its client sent it.
type lookupBody struct {
	Token    string            `json:"token"`
	Method   string            `json:"method"`
	Path     string            `json:"path"`
	Key      string            `json:"key"`
	Headers  map[string]string `json:"headers"`
	ClientIP string            `json:"client_ip"`
}

// lookupRecord answers POST /v1/admin/records/lookup.
func (a *API) lookupRecord(c *gin.Context, _ int) (string, error) {
	var body lookupBody
	if err := readJSON(c.Request, &body, MaxBodyBytes); err != nil {
		return "", err
	}
	byRequest := body.Method != "" || body.Path != "" || body.Key != "" || body.Headers != nil || body.ClientIP != ""
	var key string
	switch {
	case body.Token != "" && byRequest:
		return "", fmt.Errorf("%w: send either \"token\" or a request (\"method\", \"path\", \"key\", …), not both", problem.ErrBadRequest)
	case body.Token != "":
		claims, err := a.tokens.Parse(body.Token)
		if err != nil && !errors.Is(err, token.ErrExpired) { // a record outlives its token
			return "", fmt.Errorf("%w: the token does not verify with this server's keys", problem.ErrBadRequest)
		}
		key = store.TokenRecordKey(claims.ID)
	case !byRequest:
		return "", fmt.Errorf("%w: send {\"token\"}, or a request: {\"method\", \"path\", \"key\", \"headers\", \"client_ip\"}", problem.ErrBadRequest)
	case a.keyOf == nil:
		return "", fmt.Errorf("%w: this server is not a gateway: look records up by ID (GET /v1/admin/records/{id}) or by token", problem.ErrBadRequest)
	default:
		r, err := body.request(c.Request)
		if err != nil {
			return "", err
		}
		if key, err = a.keyOf(r); err != nil {
			return "", err
		}
	}
	return "", a.showRecord(c, key)
}

// request builds the request body describes, as its client sent it, for
// WithRecordKeys' function; admin is the operator's request.
func (body lookupBody) request(admin *http.Request) (*http.Request, error) {
	switch {
	case body.Method == "" || body.Path == "" || body.Key == "":
		return nil, fmt.Errorf("%w: a request needs \"method\", \"path\" and \"key\" (the %s it sent)", problem.ErrBadRequest, idempotency.KeyHeader)
	case !request.IsToken(body.Method):
		return nil, fmt.Errorf("%w: method %q is not an HTTP token", problem.ErrBadRequest, body.Method)
	case !strings.HasPrefix(body.Path, "/"):
		return nil, fmt.Errorf("%w: path %q does not begin with /", problem.ErrBadRequest, body.Path)
	}
	u, err := url.ParseRequestURI(body.Path)
	if err != nil {
		return nil, fmt.Errorf("%w: path %q is not a request target: %v", problem.ErrBadRequest, body.Path, err)
	}
	h := make(http.Header, len(body.Headers)+1)
	host := admin.Host
	for name, v := range body.Headers {
		switch {
		case !request.IsToken(name):
			return nil, fmt.Errorf("%w: header name %q is not an HTTP token", problem.ErrBadRequest, name)
		case !request.ValidFieldValue(v):
			return nil, fmt.Errorf("%w: the value of header %q holds a control character", problem.ErrBadRequest, name)
		}
		switch name = http.CanonicalHeaderKey(name); name {
		case idempotency.KeyHeader:
			return nil, fmt.Errorf("%w: send the %s in \"key\", not in \"headers\"", problem.ErrBadRequest, idempotency.KeyHeader)
		case "Host":
			host = v
		default:
			h.Add(name, v)
		}
	}
	if !request.ValidFieldValue(body.Key) {
		return nil, fmt.Errorf("%w: the key holds a control character", problem.ErrBadRequest)
	}
	h.Set(idempotency.KeyHeader, body.Key)
	r := &http.Request{
		Method: body.Method, URL: u, RequestURI: body.Path, Host: host, Header: h,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Body: http.NoBody,
	}
	r = r.WithContext(admin.Context())
	if body.ClientIP != "" {
		ip, err := netip.ParseAddr(body.ClientIP)
		if err != nil {
			return nil, fmt.Errorf("%w: client_ip %q is not an IP address", problem.ErrBadRequest, body.ClientIP)
		}
		r.RemoteAddr = net.JoinHostPort(ip.String(), "0")
		r = request.WithClientIP(r, ip.String())
	}
	return r, nil
}

// recordAnswer is what the operators' endpoints answer of a record.
type recordAnswer struct {
	ID    string `json:"id"`
	State string `json:"state"` // processing or completed
	// Times are RFC 3339 UTC, on the store's clock; created is left out
	// for a record opened before the store kept it.
	Created    string `json:"created,omitempty"`
	LeaseEnds  string `json:"lease_ends,omitempty"` // processing only
	Expires    string `json:"expires"`
	Status     *int   `json:"status,omitempty"`      // completed only
	BodyStored *bool  `json:"body_stored,omitempty"` // completed only
}

// showRecord answers with the live record under key, or 404
// record_not_found.
func (a *API) showRecord(c *gin.Context, key string) error {
	problem.SetRecordKey(c.Request.Context(), key) // the request's log line names it
	info, found, err := a.keeper.Lookup(c.Request.Context(), key)
	switch {
	case err != nil:
		return err
	case !found:
		return fmt.Errorf("%w: no live record has the ID %s", problem.ErrRecordNotFound, idempotency.RecordID(key))
	}
	ans := recordAnswer{ID: info.ID, State: "processing", Created: stamp(info.Created), Expires: stamp(info.Expires)}
	if info.Completed {
		ans.State, ans.Status, ans.BodyStored = "completed", &info.Status, &info.BodyStored
	} else {
		ans.LeaseEnds = stamp(info.LeaseEnds)
	}
	c.JSON(http.StatusOK, ans)
	return nil
}

// stamp writes t as RFC 3339 UTC, or "" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// releaseRecord answers POST /v1/admin/records/{id}/release.
func (a *API) releaseRecord(c *gin.Context, keyIndex int) (string, error) {
	id := c.Param("id")
	key, err := idempotency.ParseRecordID(id)
	if err != nil {
		return "", err
	}
	ctx := c.Request.Context()
	problem.SetRecordKey(ctx, key)
	released, err := a.keeper.Release(ctx, key)
	switch {
	case err != nil:
		return "", err
	case !released:
		return "", fmt.Errorf("%w: record %s is not processing: it is completed (a completed record is never released) or there is none", idempotency.ErrNotProcessing, id)
	}
	a.log.LogAttrs(ctx, slog.LevelWarn, "idempotency record released by an operator: the next retry of its request runs",
		slog.String("record_id", idempotency.RecordID(key)), slog.Int("admin_key", keyIndex),
		slog.String("request_id", problem.RequestID(ctx)))
	c.JSON(http.StatusOK, gin.H{"released": true})
	return "", nil
}

// keyIndex returns the index of the key in keys that r presents as
// Authorization: Bearer <key>, comparing fixed-size digests in constant
// time: every key is compared, whichever matches.
func keyIndex(r *http.Request, keys [][sha256.Size]byte) (int, bool) {
	if len(keys) == 0 {
		return 0, false
	}
	h := r.Header.Get("Authorization")
	scheme, key, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || key == "" {
		return 0, false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(key)))
	found, index := 0, 0
	for i := range keys {
		eq := subtle.ConstantTimeCompare(sum[:], keys[i][:])
		index = subtle.ConstantTimeSelect(eq, i, index)
		found |= eq
	}
	return index, found == 1
}
