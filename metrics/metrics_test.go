package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// failingRecords is a store whose record calls all fail.
type failingRecords struct{ *memory.Store }

var errDown = errors.New("store down")

func (failingRecords) Acquire(context.Context, string, string, string, time.Duration) (store.Record, bool, error) {
	return store.Record{}, false, errDown
}

func (failingRecords) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, errDown
}

func (failingRecords) Renew(context.Context, string, string, time.Duration) (bool, error) {
	return false, errDown
}

func (failingRecords) Complete(context.Context, string, string, []byte, time.Duration) (bool, error) {
	return false, errDown
}

func (failingRecords) Release(context.Context, string, string) (bool, error) {
	return false, errDown
}

func (failingRecords) Lookup(context.Context, string) (store.Record, bool, error) {
	return store.Record{}, false, errDown
}

// samples returns the store duration counts and error counts by op.
func samples(t *testing.T, m *metrics.Metrics) (durations, errs map[string]uint64) {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	durations, errs = map[string]uint64{}, map[string]uint64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			op := ""
			for _, l := range metric.GetLabel() {
				if l.GetName() == "op" {
					op = l.GetValue()
				}
			}
			switch f.GetName() {
			case "replayguard_store_duration_seconds":
				durations[op] = metric.GetHistogram().GetSampleCount()
			case "replayguard_store_errors_total":
				errs[op] = uint64(metric.GetCounter().GetValue())
			}
		}
	}
	return durations, errs
}

// TestInstrumentRecords checks that the record calls reach the store and
// are timed and counted under their own op labels.
func TestInstrumentRecords(t *testing.T) {
	ctx := context.Background()
	ops := []string{"acquire", "renew", "complete", "release", "redeem", "lookup"}
	tests := []struct {
		name    string
		store   func() store.Store
		wantErr bool
	}{
		{"working store", func() store.Store { return memory.New() }, false},
		{"failing store", func() store.Store { return failingRecords{memory.New()} }, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := metrics.New()
			st := m.Instrument(tc.store())
			defer st.Close()
			exp := time.Minute
			results := map[string]error{}
			var acquired, renewed, completed, released, found bool
			_, acquired, results["acquire"] = st.Acquire(ctx, "k", "fp", "o", exp)
			renewed, results["renew"] = st.Renew(ctx, "k", "o", exp)
			completed, results["complete"] = st.Complete(ctx, "k", "o", []byte("done"), exp)
			_, _, _ = st.Acquire(ctx, "k2", "fp", "o", exp)
			released, results["release"] = st.Release(ctx, "k2", "o")
			var rec store.Record
			rec, found, results["lookup"] = st.Lookup(ctx, "k")
			var res store.RedeemResult
			res, _, results["redeem"] = st.Redeem(ctx, "never-issued", store.Token{Purpose: "p"}, "o", exp)
			durations, errs := samples(t, m)
			for _, op := range ops {
				if gotErr := results[op] != nil; gotErr != tc.wantErr {
					t.Errorf("%s: err = %v, want an error: %v", op, results[op], tc.wantErr)
				}
				want := uint64(1)
				if op == "acquire" {
					want = 2
				}
				if durations[op] != want {
					t.Errorf("duration samples for op=%q = %d, want %d", op, durations[op], want)
				}
				wantErrs := uint64(0)
				if tc.wantErr {
					wantErrs = want
				}
				if errs[op] != wantErrs {
					t.Errorf("errors for op=%q = %d, want %d", op, errs[op], wantErrs)
				}
			}
			if !tc.wantErr && !(acquired && renewed && completed && released && res == store.Absent && found && rec.Completed) {
				t.Errorf("forwarded calls = %v %v %v %v %v %v %v; want all true and absent", acquired, renewed, completed, released, res, found, rec.Completed)
			}
		})
	}
}
