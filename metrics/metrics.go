package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/replayguard/replayguard/store"
)

// Metrics are the service's collectors. Create them with New; a nil
// *Metrics is valid and records nothing.
type Metrics struct {
	// Registry holds every collector below plus the Go runtime and
	// process collectors; serve it with promhttp.HandlerFor.
	Registry *prometheus.Registry

	issued      prometheus.Counter
	redemptions *prometheus.CounterVec
	records     *prometheus.CounterVec
	signatures  *prometheus.CounterVec
	storeDur    *prometheus.HistogramVec
	storeErrs   *prometheus.CounterVec

	requests    *prometheus.CounterVec
	requestDur  *prometheus.HistogramVec
	outcomes    *prometheus.CounterVec
	rateLimited *prometheus.CounterVec
	webhooks    *prometheus.CounterVec

	seriesMu sync.RWMutex
	series   map[requestLabels]requestSeries // the children Request has used
}

// New returns Metrics registered on a fresh registry, with the Go runtime
// and process collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		issued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "replayguard_tokens_issued_total",
			Help: "Tokens issued and stored.",
		}),
		redemptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "replayguard_redemptions_total",
			Help: "Token redemption attempts by outcome (the problem code, or redeemed).",
		}, []string{"outcome"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "replayguard_token_records_total",
			Help: "Calls that finish or renew a token's record (POST /v1/tokens/complete, /release and /renew) by op and outcome (the problem code, or completed, released or renewed).",
		}, []string{"op", "outcome"}),
		signatures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "replayguard_signature_verifications_total",
			Help: "Signed-request verifications by outcome (the problem code, or verified).",
		}, []string{"outcome"}),
		storeDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "replayguard_store_duration_seconds",
			Help:    "Duration of store calls by operation.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"op"}),
		storeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "replayguard_store_errors_total",
			Help: "Store calls that failed (the outcome is unknown; the request was refused).",
		}, []string{"op"}),
	}
	m.newServiceCollectors()
	reg.MustRegister(m.issued, m.redemptions, m.records, m.signatures, m.storeDur, m.storeErrs,
		m.requests, m.requestDur, m.outcomes, m.rateLimited, m.webhooks, buildInfo(),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Issued counts one issued token.
func (m *Metrics) Issued() {
	if m != nil {
		m.issued.Inc()
	}
}

// Redemption counts one redemption attempt with its outcome.
func (m *Metrics) Redemption(outcome string) {
	if m != nil {
		m.redemptions.WithLabelValues(outcome).Inc()
	}
}

// TokenRecord counts one call that finishes or renews a token's record:
// op is "complete", "release" or "renew", outcome "completed", "released",
// "renewed" or the problem code.
func (m *Metrics) TokenRecord(op, outcome string) {
	if m != nil {
		m.records.WithLabelValues(op, outcome).Inc()
	}
}

// SignatureVerification counts one signed-request verification with its
// outcome: "verified" or the problem code.
func (m *Metrics) SignatureVerification(outcome string) {
	if m != nil {
		m.signatures.WithLabelValues(outcome).Inc()
	}
}

// Instrument returns st timed and counted by m. When st is also a
// store.Limiter, so is the result. When st is a store.Usager (the memory
// store), m also reports how full it is, at every scrape:
// replayguard_store_entries and replayguard_store_bytes (with their
// bounds, replayguard_store_max_entries and replayguard_store_max_bytes),
// each for pool="all" and pool="records", and replayguard_store_full for
// the same pools (1 while the store refuses what does not fit: for
// pool="all", new tokens and nonces, and GET /readyz answers 503
// store_full; for pool="records", new idempotency records only). A nil m
// returns st unchanged.
func (m *Metrics) Instrument(st store.Store) store.Store {
	if m == nil {
		return st
	}
	if u, ok := st.(store.Usager); ok {
		m.Registry.MustRegister(usageCollector{u})
	}
	is := &instrumented{Store: st, m: m, obs: map[string]prometheus.Observer{}, errs: map[string]prometheus.Counter{}}
	for _, op := range []string{"put", "redeem", "nonce", "acquire", "renew", "complete", "release", "lookup", "ping", "allow"} {
		is.obs[op] = m.storeDur.WithLabelValues(op)
		is.errs[op] = m.storeErrs.WithLabelValues(op)
	}
	if l, ok := st.(store.Limiter); ok {
		return &instrumentedLimiter{instrumented: is, lim: l}
	}
	return is
}

type instrumented struct {
	store.Store
	m    *Metrics
	obs  map[string]prometheus.Observer
	errs map[string]prometheus.Counter
}

func (s *instrumented) done(op string, start time.Time, err error) {
	s.obs[op].Observe(time.Since(start).Seconds())
	if err != nil {
		s.errs[op].Inc()
	}
}

// Put is timed as "nonce" for a nonce's key, else as "put".
func (s *instrumented) Put(ctx context.Context, key string, t store.Token, ttl time.Duration) (bool, error) {
	op := "put"
	if store.IsNonceKey(key) {
		op = "nonce"
	}
	start := time.Now()
	ok, err := s.Store.Put(ctx, key, t, ttl)
	s.done(op, start, err)
	return ok, err
}

func (s *instrumented) Redeem(ctx context.Context, id string, t store.Token, owner string, lease time.Duration) (store.RedeemResult, store.Record, error) {
	start := time.Now()
	res, rec, err := s.Store.Redeem(ctx, id, t, owner, lease)
	s.done("redeem", start, err)
	return res, rec, err
}

func (s *instrumented) Acquire(ctx context.Context, key, fingerprint, owner string, lease time.Duration) (store.Record, bool, error) {
	start := time.Now()
	rec, ok, err := s.Store.Acquire(ctx, key, fingerprint, owner, lease)
	s.done("acquire", start, err)
	return rec, ok, err
}

func (s *instrumented) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	start := time.Now()
	ok, err := s.Store.Renew(ctx, key, owner, lease)
	s.done("renew", start, err)
	return ok, err
}

func (s *instrumented) Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (bool, error) {
	start := time.Now()
	ok, err := s.Store.Complete(ctx, key, owner, response, keep)
	s.done("complete", start, err)
	return ok, err
}

func (s *instrumented) Release(ctx context.Context, key, owner string) (bool, error) {
	start := time.Now()
	ok, err := s.Store.Release(ctx, key, owner)
	s.done("release", start, err)
	return ok, err
}

func (s *instrumented) Lookup(ctx context.Context, key string) (store.Record, bool, error) {
	start := time.Now()
	rec, found, err := s.Store.Lookup(ctx, key)
	s.done("lookup", start, err)
	return rec, found, err
}

func (s *instrumented) Ping(ctx context.Context) error {
	start := time.Now()
	err := s.Store.Ping(ctx)
	s.done("ping", start, err)
	return err
}

type instrumentedLimiter struct {
	*instrumented
	lim store.Limiter
}

func (s *instrumentedLimiter) Allow(ctx context.Context, key string, l store.Limit) (bool, time.Duration, error) {
	start := time.Now()
	ok, retry, err := s.lim.Allow(ctx, key, l)
	s.done("allow", start, err)
	return ok, retry, err
}

// Completions reports, at every scrape, the idempotency completions that
// the store did not confirm at first (idempotency.Run.Complete):
// replayguard_idempotency_completions_pending, those being retried in the
// background now (pending is idempotency.Keeper.Pending), and
// replayguard_idempotency_completions_given_up_total, those never recorded
// (givenUp is idempotency.Keeper.GivenUp): their work ran, and once the
// lease and grace end one retry may run it again. A nil m does nothing.
func (m *Metrics) Completions(pending func() int, givenUp func() int64) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "replayguard_idempotency_completions_pending",
			Help: "Idempotency outcomes the store did not confirm at first, being recorded in the background now.",
		}, func() float64 { return float64(pending()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "replayguard_idempotency_completions_given_up_total",
			Help: "Idempotency outcomes never recorded: the work ran, and once the lease and grace end one retry may run it again.",
		}, func() float64 { return float64(givenUp()) }))
}

// usageCollector reports a bounded store's usage at every scrape.
type usageCollector struct{ st store.Usager }

var (
	usageEntries    = prometheus.NewDesc("replayguard_store_entries", "Entries the bounded store holds (pool all: every entry; records: the records among them).", []string{"pool"}, nil)
	usageBytes      = prometheus.NewDesc("replayguard_store_bytes", "Bytes the bounded store's entries count towards its byte bound, by pool.", []string{"pool"}, nil)
	usageMaxEntries = prometheus.NewDesc("replayguard_store_max_entries", "The bounded store's entry bound, by pool.", []string{"pool"}, nil)
	usageMaxBytes   = prometheus.NewDesc("replayguard_store_max_bytes", "The bounded store's byte bound, by pool.", []string{"pool"}, nil)
	usageFull       = prometheus.NewDesc("replayguard_store_full", "1 while the bounded store refuses what does not fit, else 0, by pool (all: new tokens and nonces are refused and GET /readyz answers 503 store_full; records: new idempotency records are refused).", []string{"pool"}, nil)
)

func (usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{usageEntries, usageBytes, usageMaxEntries, usageMaxBytes, usageFull} {
		ch <- d
	}
}

func (c usageCollector) Collect(ch chan<- prometheus.Metric) {
	u := c.st.Usage()
	gauge := func(d *prometheus.Desc, v int64, pool ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), pool...)
	}
	gauge(usageEntries, u.Entries, "all")
	gauge(usageEntries, u.Records, "records")
	gauge(usageBytes, u.Bytes, "all")
	gauge(usageBytes, u.RecordBytes, "records")
	gauge(usageMaxEntries, u.MaxEntries, "all")
	gauge(usageMaxEntries, u.MaxRecords, "records")
	gauge(usageMaxBytes, u.MaxBytes, "all")
	gauge(usageMaxBytes, u.MaxRecordBytes, "records")
	flag := func(b bool) int64 {
		if b {
			return 1
		}
		return 0
	}
	gauge(usageFull, flag(u.Full), "all")
	gauge(usageFull, flag(u.RecordsFull), "records")
}
