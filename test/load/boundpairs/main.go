// Command boundpairs is the ceiling the load program (test/load) measures
// Replayguard's token pairs against: the least a Gin service can do to
// give the answers Replayguard gives to an issue and a redeem.
//
//	POST /v1/tokens         201 {"token","id","purpose","expires_at","expires_in"};
//	                        503 store_full when maxLive tokens are live
//	POST /v1/tokens/redeem  takes the Idempotency-Token header's token out
//	                        of the map: 200 {"status":"redeemed","id","purpose","subject"},
//	                        409 token_used when absent, 401 token_expired
//	                        when past its 300 s, 400 invalid_request when
//	                        no header
//
// The answers have the shape and the size of Replayguard's: the same
// status, header fields (Cache-Control: no-store, Content-Type:
// application/json; charset=utf-8, X-Request-Id, and net/http's Date and
// Content-Length) and JSON members, and a token as long as the JWT Replayguard issues under run.sh's key ID
// ("load") for the default purpose (tokenLen), so that each redeem request
// carries as large an Idempotency-Token header as Replayguard's. The
// refusals are package problem's, built once at start-up as package
// handlers writes them. Every answer carries the same fixed request ID,
// fixedRequestID, of the length of the ones Replayguard makes (32 hex
// digits); Replayguard makes a new one per request.
//
// A token is not signed: it is 16 random bytes and a counter, base64url,
// after a fixed base64url filler drawn once at start-up that pads it to
// tokenLen. Its ID is the counter plus 10^17, 18 digits like Replayguard's
// sonyflake IDs. The live tokens are a sync.Map in the process, keyed by
// the whole token; a redeem is one LoadAndDelete, so that of concurrent
// redeems of one token exactly one answers 200. Nothing sweeps expired
// tokens: a redeem of one deletes it, the others stay until the process
// ends, so at most maxLive tokens are live at once and an issue beyond
// that answers 503 store_full (the load program's pairs keep at most one
// per worker live).
//
// It uses gin.New() with no middleware (no logging, no recovery, no
// request IDs, no metrics), no signatures and no store process, so that
// its rate in pairs mode, against the baseline's on Redis
// (test/load/baseline), bounds what any server that gives these answers
// can reach with this load program on this machine, the load program's
// own CPU included. It is a benchmark fixture, not a service: do not
// deploy it.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/test/load/internal/fixture"
	"github.com/replayguard/replayguard/token"
)

const (
	// fixedRequestID is the X-Request-Id of every answer (and the
	// request_id of every refusal's body): 32 hex digits, as long as the
	// IDs Replayguard makes.
	fixedRequestID = "000000000000000000000000000000b2"
	// tokenLen is the length of the JWT Replayguard issues under the key
	// ID "load" (run.sh's) for the default purpose with an 18-digit ID.
	tokenLen = 203
	// uniqueLen is the length of a token's unique part: 16 random bytes
	// and an 8-byte counter, base64url without padding.
	uniqueLen = 32
	// tokenTTL is how long a token lives, Replayguard's default.
	tokenTTL = 300 * time.Second
	// maxLive is how many tokens may be live at once.
	maxLive = 100_000
	// idBase is added to the counter to make an ID: 18 digits.
	idBase = 100_000_000_000_000_000
	// purpose is every token's purpose, Replayguard's default.
	purpose = "default"

	issuePath  = "/v1/tokens"
	redeemPath = "/v1/tokens/redeem"
)

func main() {
	fixture.Main("boundpairs", "127.0.0.1:8092", func() http.Handler { return newRouter(newServer(time.Now, maxLive)) })
}

// run serves until ctx ends. onListen, when set, receives the bound
// address.
func run(ctx context.Context, addr string, onListen func(string)) error {
	return fixture.Serve(ctx, addr, newRouter(newServer(time.Now, maxLive)), onListen)
}

// entry is a live token's ID and expiry.
type entry struct {
	id      uint64
	expires time.Time
}

// server holds the live tokens.
type server struct {
	live   sync.Map // token string → entry
	nLive  atomic.Int64
	max    int64
	seq    atomic.Uint64
	filler string // tokenLen-uniqueLen base64url characters
	now    func() time.Time

	used, expired, full, noToken fixture.Answer
}

// newServer returns a server on the clock now that holds at most max
// tokens.
func newServer(now func() time.Time, max int64) *server {
	raw := make([]byte, base64.RawURLEncoding.DecodedLen(tokenLen-uniqueLen)+1)
	_, _ = rand.Read(raw) // never fails (Go 1.24): it crashes the program instead
	return &server{
		max:     max,
		filler:  base64.RawURLEncoding.EncodeToString(raw)[:tokenLen-uniqueLen],
		now:     now,
		used:    refusal(token.ErrUsed),
		expired: refusal(token.ErrExpired),
		full:    refusal(store.ErrFull),
		noToken: refusal(fmt.Errorf("%w: no token: send the %s header", problem.ErrBadRequest, token.Header)),
	}
}

// refusal returns what Replayguard answers err with (fixture.Problem).
func refusal(err error) fixture.Answer { return fixture.Problem(err, fixedRequestID) }

// Header values of the 201 and 200 answers, as package handlers sets
// them. net/http only reads them.
var (
	noStore         = []string{"no-store"}
	jsonContentType = []string{"application/json; charset=utf-8"}
	requestID       = []string{fixedRequestID}
)

var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// writeJSON answers status with body's bytes as JSON, with the headers
// every Replayguard API answer has.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Cache-Control"] = noStore
	h["Content-Type"] = jsonContentType
	h["X-Request-Id"] = requestID
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (s *server) issue(c *gin.Context) {
	if s.nLive.Add(1) > s.max {
		s.nLive.Add(-1)
		s.full.Write(c.Writer)
		return
	}
	n := s.seq.Add(1)
	var raw [24]byte
	_, _ = rand.Read(raw[:16]) // never fails (Go 1.24): it crashes the program instead
	binary.BigEndian.PutUint64(raw[16:], n)
	var tok [tokenLen]byte
	copy(tok[:], s.filler)
	base64.RawURLEncoding.Encode(tok[len(s.filler):], raw[:])
	e := entry{id: idBase + n, expires: s.now().Add(tokenTTL)}
	t := string(tok[:])
	s.live.Store(t, e)

	bp := bodies.Get().(*[]byte)
	b := append((*bp)[:0], `{"token":"`...)
	b = append(b, t...)
	b = append(b, `","id":"`...)
	b = strconv.AppendUint(b, e.id, 10)
	b = append(b, `","purpose":"`+purpose+`","expires_at":"`...)
	b = e.expires.UTC().AppendFormat(b, time.RFC3339)
	b = append(b, `","expires_in":`...)
	b = strconv.AppendInt(b, int64(tokenTTL/time.Second), 10)
	b = append(b, '}')
	writeJSON(c.Writer, http.StatusCreated, b)
	*bp = b
	bodies.Put(bp)
}

func (s *server) redeem(c *gin.Context) {
	t := c.GetHeader(token.Header)
	if t == "" {
		s.noToken.Write(c.Writer)
		return
	}
	v, found := s.live.LoadAndDelete(t)
	if !found {
		s.used.Write(c.Writer)
		return
	}
	s.nLive.Add(-1)
	e := v.(entry)
	if !s.now().Before(e.expires) {
		s.expired.Write(c.Writer)
		return
	}
	bp := bodies.Get().(*[]byte)
	b := append((*bp)[:0], `{"status":"redeemed","id":"`...)
	b = strconv.AppendUint(b, e.id, 10)
	b = append(b, `","purpose":"`+purpose+`","subject":""}`...)
	writeJSON(c.Writer, http.StatusOK, b)
	*bp = b
	bodies.Put(bp)
}

// newRouter returns the two routes on gin.New() without middleware.
func newRouter(s *server) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST(issuePath, s.issue)
	r.POST(redeemPath, s.redeem)
	return r
}
