package tracing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/tracing"
)

// brokenStore fails every call as an unreachable store does.
type brokenStore struct{ store.Store }

func (brokenStore) Redeem(context.Context, string, store.Token, string, time.Duration) (store.RedeemResult, store.Record, error) {
	return 0, store.Record{}, store.Unavailable("redeem", errors.New("connection refused"))
}

func TestStore(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	mem := memory.New()
	defer mem.Close()

	st := tracing.Store(mem, tp)
	if _, ok := st.(store.Limiter); !ok {
		t.Error("the memory store is a Limiter; its traced store is not")
	}
	if _, err := st.Put(ctx, "t1", store.Token{Purpose: "checkout"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, store.NonceKey("k", "n"), store.Token{}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if res, _, err := st.Redeem(ctx, "t1", store.Token{Purpose: "checkout"}, "", 0); err != nil || res != store.Redeemed {
		t.Fatalf("Redeem = %v, %v", res, err)
	}
	_, _, err := tracing.Store(brokenStore{mem}, tp).Redeem(ctx, "t2", store.Token{Purpose: "checkout"}, "", 0)
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("the decorator changed the error: %v", err)
	}
	parent.End()

	spans := rec.Ended()
	want := []string{"store.put", "store.nonce", "store.redeem", "store.redeem", "request"}
	if len(spans) != len(want) {
		t.Fatalf("%d spans, want %d", len(spans), len(want))
	}
	for i, s := range spans {
		if s.Name() != want[i] {
			t.Errorf("span %d is %q, want %q", i, s.Name(), want[i])
		}
		if i < 4 {
			if s.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("%s is not a child of the request's span", s.Name())
			}
			if s.SpanKind() != trace.SpanKindClient {
				t.Errorf("%s is a %v span, want client", s.Name(), s.SpanKind())
			}
		}
	}
	if got := spans[2].Status().Code; got != codes.Unset {
		t.Errorf("a redemption that worked has status %v", got)
	}
	failed := spans[3]
	if failed.Status().Code != codes.Error || len(failed.Events()) != 1 || failed.Events()[0].Name != "exception" {
		t.Errorf("a failed call has status %v and events %v, want Error and the recorded error", failed.Status(), failed.Events())
	}
}

// TestStoreLookup checks Lookup's span: "store.lookup", with
// replayguard.ok saying whether the record was found.
func TestStoreLookup(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	mem := memory.New()
	defer mem.Close()
	ctx := context.Background()
	if _, ok, err := mem.Acquire(ctx, "held", "fp", "o", time.Minute); err != nil || !ok {
		t.Fatalf("Acquire = %v, %v", ok, err)
	}
	st := tracing.Store(mem, tp)
	for _, tc := range []struct {
		key   string
		found bool
	}{{"held", true}, {"absent", false}} {
		r, found, err := st.Lookup(ctx, tc.key)
		if err != nil || found != tc.found || (found && r.Owner != "o") {
			t.Fatalf("Lookup(%q) = %+v, %v, %v; want found %v", tc.key, r, found, err, tc.found)
		}
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	for i, want := range []bool{true, false} {
		s := spans[i]
		if s.Name() != "store.lookup" || s.SpanKind() != trace.SpanKindClient {
			t.Errorf("span %d is %q (%v), want a client span store.lookup", i, s.Name(), s.SpanKind())
		}
		var ok, seen bool
		for _, a := range s.Attributes() {
			if a.Key == "replayguard.ok" {
				ok, seen = a.Value.AsBool(), true
			}
		}
		if !seen || ok != want {
			t.Errorf("span %d: replayguard.ok = %v (set: %v), want %v", i, ok, seen, want)
		}
	}
}
