package guard

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
)

// Records keeps the records Idempotent answers duplicates from. An
// *idempotency.Keeper keeps them in a store, under a lease (Idempotent);
// package idempotency/pgtx keeps them in the application's own PostgreSQL
// transaction, beside its business writes (IdempotentIn).
type Records interface {
	// Start opens the record of key for the request r, whose fingerprint
	// is fingerprint, as idempotency.Keeper.Start does. Exactly one of:
	// run is non-nil, and the handler runs with run.Request(); run is nil
	// and stored is the outcome of the key's completed execution; err
	// says why neither (idempotency.ErrFingerprintMismatch, ErrInProgress,
	// ErrNotStored with the stored outcome, a store failure).
	Start(r *http.Request, key, fingerprint string) (run Run, stored idempotency.Outcome, err error)
	// MaxBody is the largest response body a record stores.
	MaxBody() int
}

// Run is one execution that holds a record; exactly one of Complete,
// Release and Abandon ends it (see idempotency.Run).
type Run interface {
	// Request returns the request the handler runs with.
	Request() *http.Request
	// Complete records out for every duplicate. An error wrapping
	// idempotency.ErrRolledBack means the execution's work was undone: the
	// client gets that error's problem instead of the response.
	Complete(ctx context.Context, out idempotency.Outcome) error
	// Release deletes the record, so that a retry runs.
	Release(ctx context.Context) error
	// Abandon leaves the record to its lease: the outcome is unknown.
	Abandon()
}

// keeperRun is an *idempotency.Run as a Run.
type keeperRun struct {
	*idempotency.Run
	r *http.Request
}

func (k keeperRun) Request() *http.Request { return k.r }

// keeperRecords is an *idempotency.Keeper as Records.
type keeperRecords struct{ *idempotency.Keeper }

func (k keeperRecords) Start(r *http.Request, key, fingerprint string) (Run, idempotency.Outcome, error) {
	run, stored, err := k.Keeper.Start(r.Context(), key, fingerprint)
	if run == nil {
		return nil, stored, err
	}
	return keeperRun{run, r}, stored, err
}

// start opens the record of key in rec for r (Records.Start), names it
// for r's log line (problem.SetRecordKey) and counts what a duplicate
// found there.
func (s *settings) start(rec Records, policy string, r *http.Request, key, fingerprint string) (Run, idempotency.Outcome, error) {
	problem.SetRecordKey(r.Context(), key) // for the request's log line
	run, stored, err := rec.Start(r, key, fingerprint)
	s.countDuplicate(policy, run == nil && err == nil, err)
	return run, stored, err
}

// countDuplicate counts, under policy (a metrics.Policy* constant), the
// outcome of a request that found another execution's record: replayed
// when it got the recorded response, else the error that refused it.
// Other errors (a store failure, a refused token) are no record's outcome
// and are not counted here; a request that opens a record is counted when
// its execution ends (captureWriter.finish).
func (s *settings) countDuplicate(policy string, replayed bool, err error) {
	switch {
	case replayed:
		s.metrics.IdempotencyOutcome(policy, metrics.OutcomeReplayed)
	case errors.Is(err, idempotency.ErrInProgress):
		s.metrics.IdempotencyOutcome(policy, metrics.OutcomeInProgress)
	case errors.Is(err, idempotency.ErrFingerprintMismatch):
		s.metrics.IdempotencyOutcome(policy, metrics.OutcomeFingerprintMismatch)
	case errors.Is(err, idempotency.ErrNotStored):
		s.metrics.IdempotencyOutcome(policy, metrics.OutcomeNotStored)
	}
}

// record runs next with a capturing writer for run, the execution that
// holds an open record (of Idempotent, or of RequireToken with
// WithRecords), and finishes the record before the response reaches w:
// released for a releasing status (WithReleaseStatus) or a panic, else
// completed with the response (see captureWriter). A panic is answered
// with 500 internal_error, or aborts a response that was already
// streaming. A completion that undid the work is answered with its
// problem. The execution's outcome is counted under policy.
func (s *settings) record(w http.ResponseWriter, run Run, policy string, maxBody int, next http.Handler) {
	r := run.Request()
	cw := newCaptureWriter(w, r, s, run, policy, maxBody)
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		cw.finish(false, true)
		if v == http.ErrAbortHandler {
			panic(v)
		}
		s.log.LogAttrs(r.Context(), slog.LevelError, "panic",
			slog.String("request_id", problem.RequestID(r.Context())),
			slog.String("panic", fmt.Sprint(v)), slog.String("stack", string(debug.Stack())))
		if cw.streaming {
			panic(http.ErrAbortHandler) // the status is out: abort the response
		}
		problem.Write(w, problem.ErrInternal)
	}()
	next.ServeHTTP(cw, r)
	if !cw.streaming {
		if err := cw.finish(false, false); errors.Is(err, idempotency.ErrRolledBack) {
			problem.Write(w, err)
			return
		}
		cw.send()
	}
}

// writeStored answers w with a stored response.
func writeStored(w http.ResponseWriter, out idempotency.Outcome) {
	h := w.Header()
	for name, vs := range out.Header {
		h[name] = vs
	}
	h.Set(idempotency.ReplayedHeader, "true")
	status := out.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if len(out.Body) > 0 {
		_, _ = w.Write(out.Body)
	}
}

// captureWriter buffers a handler's response, up to the cap, so that the
// record is completed before the client sees a byte; past the cap (or on
// Flush) it finishes the record without the body and streams.
type captureWriter struct {
	w      http.ResponseWriter
	r      *http.Request
	s      *settings
	run    Run
	policy string // of the idempotency outcome
	max    int

	pre       http.Header // the headers outer middleware had set
	header    http.Header
	status    int
	buf       bytes.Buffer
	size      int  // body bytes the handler wrote
	wrote     bool // a Write or WriteHeaderNow happened (for gin)
	streaming bool // the record is finished and writes go straight to w
	finished  bool
	abandoned bool  // AbandonRecord: neither complete nor release
	undone    error // the work was undone when the response began streaming
}

func newCaptureWriter(w http.ResponseWriter, r *http.Request, s *settings, run Run, policy string, maxBody int) *captureWriter {
	pre := w.Header().Clone()
	if pre == nil {
		pre = http.Header{}
	}
	return &captureWriter{w: w, r: r, s: s, run: run, policy: policy, max: maxBody, pre: pre, header: pre.Clone()}
}

// Header returns the response headers. They reach the client when the
// handler returns, or when the response starts streaming.
func (c *captureWriter) Header() http.Header { return c.header }

// WriteHeader records the status; the first call wins, as with net/http.
// Informational (1xx) statuses other than 101 go out at once.
func (c *captureWriter) WriteHeader(code int) {
	if c.informational(code) || c.status != 0 {
		return
	}
	c.status = code
}

// informational sends a 1xx response at once and reports whether code
// was one; it panics on invalid codes as net/http does.
func (c *captureWriter) informational(code int) bool {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 200 || code == http.StatusSwitchingProtocols {
		return false
	}
	if !c.streaming {
		h := c.w.Header()
		clear(h)
		for name, vs := range c.header {
			h[name] = vs
		}
		c.w.WriteHeader(code)
	}
	return true
}

func (c *captureWriter) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.wrote = true
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	c.size += len(p)
	if c.undone != nil {
		return 0, c.undone
	}
	if c.streaming {
		return c.w.Write(p)
	}
	if c.buf.Len()+len(p) <= c.max {
		return c.buf.Write(p)
	}
	if err := c.stream(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// WriteString is Write for strings, for io.StringWriter users.
func (c *captureWriter) WriteString(s string) (int, error) { return c.Write([]byte(s)) }

// Flush starts streaming: the record completes without the body, since
// the client will see the body before it is whole.
func (c *captureWriter) Flush() {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.wrote = true
	if !c.streaming {
		if c.stream() != nil {
			return
		}
	}
	_ = http.NewResponseController(c.w).Flush()
}

// Hijack is refused: a hijacked connection's response cannot be recorded.
func (c *captureWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("guard: a recorded route cannot hijack the connection: %w", http.ErrNotSupported)
}

// Unwrap returns the underlying writer, for http.ResponseController.
func (c *captureWriter) Unwrap() http.ResponseWriter { return c.w }

// stream finishes the record without the body and sends what was
// buffered.
func (c *captureWriter) stream() error {
	if err := c.finish(true, false); errors.Is(err, idempotency.ErrRolledBack) {
		// The work was undone: say so, and refuse the rest of the body.
		c.streaming = true
		problem.Write(c.w, err)
		c.undone = err
		return err
	}
	c.streaming = true
	return c.send()
}

// send writes the status, headers and buffered body to the client.
func (c *captureWriter) send() error {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	h := c.w.Header()
	clear(h)
	for name, vs := range c.header {
		h[name] = vs
	}
	c.w.WriteHeader(c.status)
	if c.buf.Len() == 0 {
		return nil
	}
	_, err := c.w.Write(c.buf.Bytes())
	c.buf.Reset()
	return err
}

// finish ends the record once: released for a panic or a releasing
// status, else completed with the response (without its body when
// streaming). It is where an execution's idempotency outcome is counted:
// abandoned, released, or executed (released when the completion undid
// the work: a retry runs).
func (c *captureWriter) finish(streaming, panicked bool) error {
	if c.finished {
		return nil
	}
	c.finished = true
	if c.status == 0 {
		c.status = http.StatusOK
	}
	var err error
	if c.abandoned {
		c.run.Abandon()
		c.s.metrics.IdempotencyOutcome(c.policy, metrics.OutcomeAbandoned)
		c.s.log.LogAttrs(c.r.Context(), slog.LevelWarn, "idempotency record abandoned: the outcome is unknown; duplicates get 409 until its lease ends, then one retry runs",
			slog.String("request_id", problem.RequestID(c.r.Context())), slog.Int("status", c.status))
		return nil
	}
	if panicked || c.s.releases(c.status) {
		err = c.run.Release(c.r.Context())
		c.s.metrics.IdempotencyOutcome(c.policy, metrics.OutcomeReleased)
	} else {
		if _, set := c.header["Content-Type"]; !set && c.buf.Len() > 0 {
			c.header.Set("Content-Type", http.DetectContentType(c.buf.Bytes())) // as net/http would
		}
		out := idempotency.Outcome{Status: c.status, Header: c.replayable(), BodyOmitted: streaming}
		if !streaming {
			out.Body = c.buf.Bytes()
		}
		err = c.run.Complete(c.r.Context(), out)
		outcome := metrics.OutcomeExecuted
		if errors.Is(err, idempotency.ErrRolledBack) {
			outcome = metrics.OutcomeReleased
		}
		c.s.metrics.IdempotencyOutcome(c.policy, outcome)
	}
	switch {
	case errors.Is(err, idempotency.ErrPending):
		c.s.log.LogAttrs(c.r.Context(), slog.LevelWarn, "idempotency record pending: the store did not confirm the completion in time; the response is sent and the completion retried in the background (duplicates get 409 until it lands)",
			slog.String("request_id", problem.RequestID(c.r.Context())), slog.String("error", err.Error()))
		return nil
	case errors.Is(err, idempotency.ErrRolledBack):
		c.s.log.LogAttrs(c.r.Context(), slog.LevelWarn, "idempotency record not committed: the work was undone and the client gets an error",
			slog.String("request_id", problem.RequestID(c.r.Context())), slog.String("error", err.Error()))
	case err != nil:
		c.s.log.LogAttrs(c.r.Context(), slog.LevelWarn, "idempotency record not finished; duplicates get 409 until its lease ends",
			slog.String("request_id", problem.RequestID(c.r.Context())), slog.String("error", err.Error()))
	}
	return err
}

// AbandonRecord marks the record of the response being written to w, if
// it has one (Idempotent, RequireWebhook, or RequireToken with
// WithRecords), to be left as it is when the handler returns:
// neither completed nor released, it stays processing until its lease
// ends (idempotency.Run.Abandon). A handler calls it when it cannot tell
// whether its work was done, such as a proxy whose upstream timed out
// after the request was sent: storing the failure would answer every
// retry with it, and releasing would let a retry run the work again at
// once. The response the handler writes still reaches the client. It
// reports whether w had a record; w may wrap the middleware's writer if
// it has an Unwrap method, as http.ResponseController expects.
func AbandonRecord(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case *captureWriter:
			x.abandoned = true
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

// replayable returns the headers the handler set that are worth replaying.
func (c *captureWriter) replayable() map[string][]string {
	drop := map[string]bool{}
	for _, v := range c.header["Connection"] {
		for _, name := range strings.Split(v, ",") {
			drop[http.CanonicalHeaderKey(strings.TrimSpace(name))] = true
		}
	}
	var out map[string][]string
	for name, vs := range c.header {
		if !idempotency.Replayable(name) || drop[name] || strings.HasPrefix(name, http.TrailerPrefix) || slices.Equal(vs, c.pre[name]) {
			continue
		}
		if out == nil {
			out = make(map[string][]string, len(c.header))
		}
		out[name] = vs
	}
	return out
}

// bodyAllowed reports whether a response with status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
