package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/replayguard/replayguard/store"
)

// Sentinel errors. Compare with errors.Is; most are wrapped with detail.
var (
	// ErrKeyMissing: a caller that requires a key got none.
	ErrKeyMissing = errors.New("idempotency: key missing")
	// ErrInvalidKey: the key is empty, longer than MaxKeyLength, or not
	// an RFC 8941 sf-string (or bare value) in an Idempotency-Key field.
	ErrInvalidKey = errors.New("idempotency: invalid key")
	// ErrFingerprintMismatch: the key is held by a record of another
	// request (another fingerprint); nothing was run.
	ErrFingerprintMismatch = errors.New("idempotency: key reused for another request")
	// ErrInProgress: the key's first execution is still running under its
	// lease; nothing was run. Retry later.
	ErrInProgress = errors.New("idempotency: request in progress")
	// ErrNotStored: the key's execution completed, but its outcome's body
	// was over the size cap and was not stored, so it cannot be replayed.
	ErrNotStored = errors.New("idempotency: response not stored")
	// ErrLeaseLost: the execution's record expired or was taken over
	// before it completed, so its outcome was not recorded and another
	// execution may run.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrCorrupt: a stored outcome cannot be decoded.
	ErrCorrupt = errors.New("idempotency: stored outcome corrupt")
	// ErrNotProcessing: a Run resumed with ResumeToken found no
	// processing record of the token held by its lease: none was opened,
	// it was completed or released already, or its lease ended.
	ErrNotProcessing = errors.New("idempotency: no processing record")
	// ErrBadLease: a lease given to ResumeToken is not one RedeemToken
	// gave out.
	ErrBadLease = errors.New("idempotency: malformed lease")
	// ErrPending: an execution's outcome was not recorded because the
	// store did not confirm the completion in time; the Keeper holds the
	// outcome and keeps trying to record it in the background (see
	// Run.Complete), renewing the lease meanwhile, so duplicates get
	// ErrInProgress until it lands and then the outcome. The work ran:
	// report its result.
	ErrPending = errors.New("idempotency: completion pending")
	// ErrRolledBack: an execution's work was undone when its outcome was
	// to be recorded (a transaction that did not commit, see package
	// idempotency/pgtx): neither the work nor the record happened, and the
	// caller must not report success.
	ErrRolledBack = errors.New("idempotency: rolled back")
)

// A store that cannot confirm an operation is reported with the store's
// own error, which wraps store.ErrUnavailable or is store.ErrFull: when it
// comes from Start, Do or RedeemToken, nothing was run.

// HTTP headers of the Idempotency-Key draft
// (draft-ietf-httpapi-idempotency-key-header).
const (
	// KeyHeader carries the client's key, an RFC 8941 sf-string.
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader is set to "true" on a stored response served again.
	ReplayedHeader = "Idempotent-Replayed"
)

// Defaults for the options below.
const (
	// DefaultLockTTL is the default lease of a processing record.
	DefaultLockTTL = 60 * time.Second
	// DefaultRetention is how long a completed record is kept by default.
	DefaultRetention = 24 * time.Hour
	// DefaultMaxBody is the default cap on a stored outcome's body: 1 MiB.
	DefaultMaxBody = 1 << 20
	// MaxKeyLength is the longest key ParseKey accepts, in characters.
	MaxKeyLength = 255
	// MaxBodyLimit is the largest body cap a configuration should set (a
	// route's max_body, REPLAYGUARD_IDEMPOTENCY_MAX_BODY): 64 MiB.
	MaxBodyLimit = 64 << 20
	// MinLockTTL is the shortest lease a configuration should set: the
	// heartbeat renews it every quarter of it, and a lease much shorter
	// than a store round trip would be lost while it runs.
	MinLockTTL = time.Second
)

// finishTimeout bounds Complete and Release, which run even when the
// caller's context is done: the work they record has happened.
const finishTimeout = 5 * time.Second

// Keeper runs a function at most once per key and hands its outcome to
// every duplicate. Create it with New; it is safe for concurrent use.
type Keeper struct {
	store     store.Store
	lockTTL   time.Duration
	grace     time.Duration // 0: one lock TTL
	retention time.Duration
	maxBody   int
	now       func() time.Time
	onPanic   func(v any)
	log       *slog.Logger
	// ticker makes the heartbeat's ticks; tests replace it.
	ticker func(d time.Duration) (<-chan time.Time, func())
	// bg holds the completions being retried in the background; every
	// copy of a Keeper (With) shares it.
	bg *background
}

// Option configures a Keeper.
type Option func(*Keeper)

// WithLockTTL sets the lease of a processing record: a duplicate arriving
// while it runs gets ErrInProgress, and if the execution dies without
// completing or releasing (a crash, a killed process), the record blocks
// duplicates until the lease and its grace (WithGrace) end, after which
// one retry runs. A heartbeat renews the lease every d/4 while the
// execution runs, so d bounds how long a crashed execution blocks its
// key, not how long an execution may take. Defaults to DefaultLockTTL (60s); d <= 0 keeps the
// default.
func WithLockTTL(d time.Duration) Option {
	return func(k *Keeper) {
		if d > 0 {
			k.lockTTL = d
		}
	}
}

// WithGrace sets how long a processing record outlives its lease: while
// the holder's heartbeat cannot reach the store (a stalled or failing
// store), the record stays and duplicates get ErrInProgress until the
// lease and the grace have both run out since the last renewal, so that a
// live holder's completion, retried in the background, lands first. A
// stall shorter than the grace plus the lease's unexpired part (at least
// three quarters of it) never lets a second execution run. A holder that
// really died (a killed process) blocks its key for the lease and the
// grace, after which one retry runs. Defaults to the lock TTL (one
// lease); d <= 0 keeps the default.
func WithGrace(d time.Duration) Option {
	return func(k *Keeper) {
		if d > 0 {
			k.grace = d
		}
	}
}

// WithLogger sets the logger of the background completions: an outcome
// recorded late, and one given up (with its record key). Defaults to
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(k *Keeper) {
		if l != nil {
			k.log = l
		}
	}
}

// WithRetention sets how long a completed record, and so the outcome
// duplicates get, is kept, counted from completion. Defaults to
// DefaultRetention (24h); d <= 0 keeps the default.
func WithRetention(d time.Duration) Option {
	return func(k *Keeper) {
		if d > 0 {
			k.retention = d
		}
	}
}

// WithMaxBody caps the body of a stored outcome at n bytes: an outcome
// with a longer body completes its record without the body, and its
// duplicates get ErrNotStored. Defaults to DefaultMaxBody (1 MiB);
// n <= 0 keeps the default.
func WithMaxBody(n int) Option {
	return func(k *Keeper) {
		if n > 0 {
			k.maxBody = n
		}
	}
}

// WithClock replaces time.Now, for tests. Leases and retention are
// durations the store counts on its own clock (the Redis server's, say);
// this clock only dates what the Keeper reports, such as Run.Expires.
// Defaults to time.Now.
func WithClock(now func() time.Time) Option {
	return func(k *Keeper) {
		if now != nil {
			k.now = now
		}
	}
}

// WithPanicHandler sets f to see a panic in a Run's heartbeat goroutine
// (in the store's Renew, or in the caller's lost-lease callback) before
// it goes on: f can log it and flush the logs, since the panic still
// ends the process, as any unrecovered panic in a goroutine does, and
// then no deferred call of any other goroutine runs. Defaults to none.
func WithPanicHandler(f func(v any)) Option {
	return func(k *Keeper) { k.onPanic = f }
}

// New returns a Keeper that keeps its records in st.
func New(st store.Store, opts ...Option) *Keeper {
	k := &Keeper{
		store:     st,
		lockTTL:   DefaultLockTTL,
		retention: DefaultRetention,
		maxBody:   DefaultMaxBody,
		now:       time.Now,
		log:       slog.Default(),
		ticker: func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		},
		bg: newBackground(),
	}
	return k.apply(opts)
}

func (k *Keeper) apply(opts []Option) *Keeper {
	for _, o := range opts {
		o(k)
	}
	return k
}

// With returns a copy of k with opts applied on top of k's settings, for
// a route or queue that needs another lease, retention or cap over the
// same store.
func (k *Keeper) With(opts ...Option) *Keeper {
	c := *k
	return c.apply(opts)
}

// MaxBody returns the cap on a stored outcome's body, in bytes.
func (k *Keeper) MaxBody() int { return k.maxBody }

// LockTTL returns the lease of a processing record.
func (k *Keeper) LockTTL() time.Duration { return k.lockTTL }

// Grace returns how long a processing record outlives its lease (see
// WithGrace).
func (k *Keeper) Grace() time.Duration {
	if k.grace > 0 {
		return k.grace
	}
	return k.lockTTL
}

// recordTTL is what the store is told a processing record lives for: the
// lease and the grace.
func (k *Keeper) recordTTL() time.Duration { return k.lockTTL + k.Grace() }

// Retention returns how long a completed record is kept.
func (k *Keeper) Retention() time.Duration { return k.retention }

// Outcome is the result of one execution, the thing every duplicate gets.
// The HTTP middleware stores a response in it; other callers give the
// fields their own meaning.
type Outcome struct {
	// Status is a result code: an HTTP status for the middleware.
	Status int
	// Header holds named values: the response headers worth replaying for
	// the middleware. It converts to http.Header.
	Header map[string][]string
	// Body is the result's payload.
	Body []byte
	// BodyOmitted is set on a stored outcome whose body was over the cap
	// and was not stored; Body is then empty.
	BodyOmitted bool
}

// Run is one execution that holds a key's processing record. A heartbeat
// renews its lease until it ends with Complete or Release, exactly one
// of which must be called.
type Run struct {
	k       *Keeper
	key     string
	owner   string
	expires time.Time
	lease   string // a Detached run's lease, for ResumeToken
	notHeld error  // the error of Complete and Release when the record is gone
	onLost  func()
	beating bool // renewed by a heartbeat: a failed completion is retried in the background
	stop    chan struct{}
	done    chan struct{}
	endOnce sync.Once
}

// Start opens key's record for an execution of the request whose
// fingerprint is fingerprint, in one atomic store operation. Exactly one
// of three things happens:
//
//   - this caller is first: run is non-nil, the caller executes and ends
//     run with Complete or Release (or Abandon);
//   - the key's execution has completed: run is nil and stored is its
//     outcome (with ErrNotStored, and without its body, when the body was
//     not stored);
//   - err says why neither: ErrFingerprintMismatch, ErrInProgress,
//     ErrInvalidKey (an empty key, or one beginning with "\x00", which
//     the store reserves), or the store's error (wrapping
//     store.ErrUnavailable, or store.ErrFull).
//
// The fingerprint is compared as is; callers hash whatever identifies a
// request (its body, say) into it.
func (k *Keeper) Start(ctx context.Context, key, fingerprint string) (run *Run, stored Outcome, err error) {
	return k.start(ctx, key, fingerprint, nil)
}

func (k *Keeper) start(ctx context.Context, key, fingerprint string, onLost func()) (*Run, Outcome, error) {
	switch {
	case key == "":
		return nil, Outcome{}, fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	case key[0] == 0:
		return nil, Outcome{}, fmt.Errorf("%w: keys beginning with a NUL byte are reserved", ErrInvalidKey)
	}
	owner, err := newOwner()
	if err != nil {
		return nil, Outcome{}, err
	}
	expires := k.now().Add(k.lockTTL)
	rec, acquired, err := k.store.Acquire(ctx, key, fingerprint, owner, k.recordTTL())
	if err != nil {
		return nil, Outcome{}, err
	}
	if !acquired {
		if rec.Fingerprint != fingerprint {
			return nil, Outcome{}, ErrFingerprintMismatch
		}
		out, err := found(rec)
		return nil, out, err
	}
	return k.newRun(key, owner, expires, onLost), Outcome{}, nil
}

// newOwner returns a random owner ID for a new record: 128 bits in hex.
func newOwner() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("%w: no randomness for an owner ID: %w", store.ErrUnavailable, err)
	}
	return hex.EncodeToString(b[:]), nil
}

// newRun starts the heartbeat of owner's processing record under key,
// leased until expires.
func (k *Keeper) newRun(key, owner string, expires time.Time, onLost func()) *Run {
	r := k.detachedRun(key, owner, expires, ErrLeaseLost)
	r.onLost, r.done, r.beating = onLost, make(chan struct{}), true
	go r.heartbeat()
	return r
}

// detachedRun is a Run without a heartbeat, for a record whose execution
// ends in another request; notHeld is its error when the record is gone.
func (k *Keeper) detachedRun(key, owner string, expires time.Time, notHeld error) *Run {
	done := make(chan struct{})
	close(done)
	return &Run{
		k: k, key: key, owner: owner, expires: expires, notHeld: notHeld,
		stop: make(chan struct{}), done: done,
	}
}

// found is what a duplicate gets from a live record of its own request:
// ErrInProgress while it is processing, else its stored outcome (with
// ErrNotStored when the body was left out).
func found(rec store.Record) (Outcome, error) {
	if !rec.Completed {
		return Outcome{}, ErrInProgress
	}
	out, err := decodeOutcome(rec.Response)
	if err != nil {
		return Outcome{}, err
	}
	if out.BodyOmitted {
		return out, ErrNotStored
	}
	return out, nil
}

// heartbeat renews the lease every lockTTL/4 until the
// run ends or the lease is found lost. A renewal that fails with an error
// is tried again soon (from 50ms, doubling up to 250ms or the tick,
// whichever is shorter), so that the first renewal after a stalled store
// comes back lands within the store's timeout and a quarter second: the
// record then still has its grace.
func (r *Run) heartbeat() {
	defer close(r.done)
	if f := r.k.onPanic; f != nil {
		defer func() {
			if v := recover(); v != nil {
				f(v)
				panic(v)
			}
		}()
	}
	every := max(r.k.lockTTL/4, time.Millisecond)
	ticks, stop := r.k.ticker(every)
	defer stop()
	const firstRetry, maxRenewRetry = 50 * time.Millisecond, 250 * time.Millisecond
	backoff := firstRetry
	var retry <-chan time.Time
	for {
		select {
		case <-r.stop:
			return
		case <-ticks:
		case <-retry:
		}
		retry = nil
		ctx, cancel := context.WithTimeout(context.Background(), every)
		ok, err := r.k.store.Renew(ctx, r.key, r.owner, r.k.recordTTL())
		cancel()
		switch {
		case err == nil && !ok:
			if r.onLost != nil {
				r.onLost()
			}
			return
		case err != nil:
			retry = time.After(min(backoff, every, maxRenewRetry))
			backoff *= 2
		default:
			backoff = firstRetry
		}
	}
}

// end stops the heartbeat and waits for it; it is safe to call twice.
func (r *Run) end() {
	r.endOnce.Do(func() { close(r.stop) })
	<-r.done
}

// Complete turns the record into a completed one holding out, kept for
// the Keeper's retention, and stops the heartbeat; every duplicate from
// now on gets out. A body over the cap is left out (BodyOmitted), so
// duplicates get ErrNotStored; a caller that streams a result it cannot
// store sets BodyOmitted itself. So is an outcome a bounded store has no
// room for (store.ErrFull): the record completes without it. It runs even
// when ctx is done, since the work it records has happened, bounded by
// five seconds and the store's own deadline.
//
// When the store does not confirm (an error wrapping
// store.ErrUnavailable), a Run with a heartbeat (from Start, Do or a
// Record-mode RedeemToken) does not give up on the outcome it holds:
// Complete returns ErrPending at once, and the Keeper keeps trying in the
// background, with backoff, while the heartbeat keeps the lease alive,
// for up to the retention (at least the lease and grace). Duplicates get
// ErrInProgress until it lands. Keeper.Pending counts these completions,
// Keeper.GivenUp those it could not record, and Keeper.Shutdown waits for
// them. A Run from a Detached redemption or ResumeToken returns the
// store's error instead: its caller, another request, retries.
//
// It returns ErrLeaseLost (ErrNotProcessing for a Run from ResumeToken)
// when the record expired or was taken over first.
func (r *Run) Complete(ctx context.Context, out Outcome) error {
	if len(out.Body) > r.k.maxBody {
		out.Body, out.BodyOmitted = nil, true
	}
	if !r.beating {
		r.end()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	data, ok, err := r.complete(ctx, out)
	if err != nil && r.beating && errors.Is(err, store.ErrUnavailable) && r.k.bg.add() {
		go r.completeLater(data, out.Status, err)
		return fmt.Errorf("%w: the store did not confirm the completion (%v); it is retried in the background", ErrPending, err)
	}
	r.end()
	switch {
	case err != nil:
		return err
	case !ok:
		return r.notHeld
	}
	return nil
}

// complete asks the store once to complete the record with out, and again
// without the body when a bounded store has no room for it. It returns
// the encoded outcome it asked for last.
func (r *Run) complete(ctx context.Context, out Outcome) ([]byte, bool, error) {
	data := encodeOutcome(out)
	ok, err := r.k.store.Complete(ctx, r.key, r.owner, data, r.k.retention)
	if errors.Is(err, store.ErrFull) && !out.BodyOmitted {
		// A bounded store has no room for the response: record that it
		// ran, without what it answered, rather than leave the record to
		// its lease and let a retry run it again.
		data = encodeOutcome(Outcome{Status: out.Status, BodyOmitted: true})
		ok, err = r.k.store.Complete(ctx, r.key, r.owner, data, r.k.retention)
	}
	return data, ok, err
}

// Release stops the heartbeat and deletes the record, so that a retry
// runs. It runs even when ctx is done, bounded by five seconds. Its
// errors are Complete's.
func (r *Run) Release(ctx context.Context) error {
	r.end()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	ok, err := r.k.store.Release(ctx, r.key, r.owner)
	switch {
	case err != nil:
		return err
	case !ok:
		return r.notHeld
	}
	return nil
}

// Key returns the store key of the run's record; RecordID(Key()) is the
// ID its log lines and Keeper.Lookup show.
func (r *Run) Key() string { return r.key }

// Lease returns the lease of a Run that a Detached RedeemToken opened, to
// give to the request that will end it with ResumeToken; "" for other
// runs.
func (r *Run) Lease() string { return r.lease }

// Expires returns when the lease of the run's record ends unless it is
// renewed: the Keeper's clock when the record was opened plus its lock
// TTL, read before the store was asked, so it is never later than the
// store's own end of the lease.
func (r *Run) Expires() time.Time { return r.expires }

// Abandon stops the heartbeat and leaves the record processing, so that
// it expires when its lease ends: for an execution whose outcome is
// unknown (a request to another service timed out, say, and may or may
// not have been carried out). Storing a failure would answer every retry
// with it for the whole retention, and releasing would let a retry run
// the work again at once; abandoned, duplicates get ErrInProgress until
// the lease ends, and then one retry runs. The store is not called.
func (r *Run) Abandon() {
	r.end()
}

// Do runs fn at most once per key and returns its outcome to every
// duplicate. The first caller runs fn while a heartbeat renews its lease;
// then:
//
//   - fn returns a nil error: the outcome is recorded (Complete) and
//     returned with replayed false; if the store does not confirm, the
//     outcome is returned with ErrPending and recorded in the background
//     (see Run.Complete): the work happened, report it;
//   - fn returns an error: the record is released, so a retry runs, and
//     fn's outcome and error are returned as they are (joined with the
//     release's error when that fails too);
//   - fn panics: the record is released and the panic goes on.
//
// fn's context is canceled, with cause ErrLeaseLost, when the heartbeat
// finds the lease lost. A duplicate gets the recorded outcome with
// replayed true, or Start's errors: ErrInProgress while the first runs,
// ErrFingerprintMismatch for another fingerprint, ErrNotStored for an
// outcome whose body was over the cap. When the store cannot be reached,
// fn never runs and the error wraps store.ErrUnavailable.
func (k *Keeper) Do(ctx context.Context, key, fingerprint string, fn func(ctx context.Context) (Outcome, error)) (out Outcome, replayed bool, err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	run, stored, err := k.start(ctx, key, fingerprint, func() { cancel(ErrLeaseLost) })
	if err != nil {
		return stored, false, err
	}
	if run == nil {
		return stored, true, nil
	}
	returned := false
	defer func() {
		if !returned { // fn panicked or called runtime.Goexit
			_ = run.Release(ctx)
		}
	}()
	out, err = fn(fctx)
	returned = true
	if err != nil {
		if rerr := run.Release(ctx); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return out, false, err
	}
	return out, false, run.Complete(ctx, out)
}
