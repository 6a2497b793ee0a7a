package guard_test

import (
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/webhook"
)

// counts returns the non-zero samples of the counter family name, keyed
// by their labels as "name=value" pairs joined with commas.
func counts(t *testing.T, m *metrics.Metrics, name string) map[string]float64 {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			if v := s.GetCounter().GetValue(); v != 0 {
				var labels []string
				for _, l := range s.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				sort.Strings(labels)
				out[strings.Join(labels, ",")] = v
			}
		}
	}
	return out
}

func wantCounts(t *testing.T, what string, got, want map[string]float64) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s{%s} = %v, want %v", what, k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s{%s} = %v, want none", what, k, v)
		}
	}
}

// outcomeApp answers as the request's X-Answer header says: fail (503,
// which releases), abandon (AbandonRecord, then 504), big (a body over the
// test Keeper's 16-byte cap), else 201.
var outcomeApp = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	switch r.Header.Get("X-Answer") {
	case "fail":
		w.WriteHeader(http.StatusServiceUnavailable)
	case "abandon":
		guard.AbandonRecord(w)
		w.WriteHeader(http.StatusGatewayTimeout)
	case "big":
		_, _ = w.Write([]byte(strings.Repeat("x", 100)))
	default:
		w.WriteHeader(http.StatusCreated)
	}
})

func keyed(key, body, answer string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	if key != "" {
		r.Header.Set(idempotency.KeyHeader, `"`+key+`"`)
	}
	if answer != "" {
		r.Header.Set("X-Answer", answer)
	}
	return r
}

// TestIdempotencyOutcomesAreCounted checks that every middleware that
// keeps records counts each request's outcome under its policy, in the
// one place outcomes are decided, and nothing else.
func TestIdempotencyOutcomesAreCounted(t *testing.T) {
	st := newRecordStore(t, nil)
	m := metrics.New()
	keeper := idempotency.New(st, idempotency.WithMaxBody(16))
	keys := guard.Idempotent(keeper, guard.WithMetrics(m))(outcomeApp)
	prints := guard.Idempotent(keeper, guard.WithMetrics(m), guard.WithFingerprintWindow(time.Minute))(outcomeApp)

	steps := []struct {
		name string
		h    http.Handler
		r    *http.Request
		want int
	}{
		{"a first request runs", keys, keyed("k1", `{"a":1}`, ""), 201},
		{"its duplicate is replayed", keys, keyed("k1", `{"a":1}`, ""), 201},
		{"its key with another body is refused", keys, keyed("k1", `{"a":2}`, ""), 422},
		{"a 5xx releases", keys, keyed("k2", "", "fail"), 503},
		{"an unknown outcome abandons", keys, keyed("k3", "", "abandon"), 504},
		{"a duplicate of the abandoned record is in progress", keys, keyed("k3", "", ""), 409},
		{"a response over the cap runs", keys, keyed("k4", "", "big"), 200},
		{"its duplicate finds it not stored", keys, keyed("k4", "", ""), 409},
		{"a keyless request runs in fingerprint mode", prints, keyed("", `{"b":1}`, ""), 201},
		{"its double submit is replayed", prints, keyed("", `{"b":1}`, ""), 201},
	}
	for _, s := range steps {
		if got := serve(s.h, s.r); got.Code != s.want {
			t.Fatalf("%s: status %d, want %d: %s", s.name, got.Code, s.want, got.Body)
		}
	}

	svc := newTokenService(t, st)
	tokens := guard.RequireToken(svc, "checkout", guard.WithRecords(keeper), guard.WithMetrics(m))(outcomeApp)
	is, err := svc.Issue(t.Context(), token.IssueRequest{Purpose: "checkout"})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if got := post(tokens, is.Token, false); got.Code != 201 {
			t.Fatalf("token: status %d: %s", got.Code, got.Body)
		}
	}

	v, err := webhook.New(webhook.Standard, []string{hookSecret})
	if err != nil {
		t.Fatal(err)
	}
	hooks := guard.RequireWebhook(v, keeper, guard.WithMetrics(m))(outcomeApp)
	now := time.Now()
	for range 2 {
		if got := serve(hooks, standardDelivery("msg_1", now, `{"e":1}`)); got.Code != 201 {
			t.Fatalf("webhook: status %d: %s", got.Code, got.Body)
		}
	}
	forged := standardDelivery("msg_2", now, `{"e":2}`)
	forged.Header.Set("webhook-signature", "v1,"+b64(make([]byte, 32)))
	if got := serve(hooks, forged); got.Code != 401 {
		t.Fatalf("forged webhook: status %d: %s", got.Code, got.Body)
	}

	wantCounts(t, "replayguard_idempotency_outcomes_total", counts(t, m, "replayguard_idempotency_outcomes_total"), map[string]float64{
		"outcome=executed,policy=idempotency_key":             2,
		"outcome=replayed,policy=idempotency_key":             1,
		"outcome=fingerprint_mismatch,policy=idempotency_key": 1,
		"outcome=released,policy=idempotency_key":             1,
		"outcome=abandoned,policy=idempotency_key":            1,
		"outcome=in_progress,policy=idempotency_key":          1,
		"outcome=not_stored,policy=idempotency_key":           1,
		"outcome=executed,policy=fingerprint":                 1,
		"outcome=replayed,policy=fingerprint":                 1,
		"outcome=executed,policy=token":                       1,
		"outcome=replayed,policy=token":                       1,
		"outcome=executed,policy=webhook":                     1,
		"outcome=replayed,policy=webhook":                     1,
	})
	wantCounts(t, "replayguard_webhook_deliveries_total", counts(t, m, "replayguard_webhook_deliveries_total"), map[string]float64{
		"outcome=verified,scheme=standard":          2,
		"outcome=signature_invalid,scheme=standard": 1,
	})
}

// TestCallerQuotaIsCounted checks that a caller quota refusal counts in
// replayguard_rate_limited_total and as no idempotency outcome.
func TestCallerQuotaIsCounted(t *testing.T) {
	st := newRecordStore(t, nil)
	m := metrics.New()
	h := guard.Idempotent(idempotency.New(st), guard.WithMetrics(m), guard.WithCallerQuota(st, 1))(outcomeApp)
	if got := serve(h, keyed("q1", "", "")); got.Code != 201 {
		t.Fatalf("first key: status %d: %s", got.Code, got.Body)
	}
	if got := serve(h, keyed("q2", "", "")); got.Code != 429 {
		t.Fatalf("second key: status %d, want 429: %s", got.Code, got.Body)
	}
	wantCounts(t, "replayguard_rate_limited_total", counts(t, m, "replayguard_rate_limited_total"), map[string]float64{
		"endpoint=caller_quota": 1,
	})
	wantCounts(t, "replayguard_idempotency_outcomes_total", counts(t, m, "replayguard_idempotency_outcomes_total"), map[string]float64{
		"outcome=executed,policy=idempotency_key": 1,
	})
}
