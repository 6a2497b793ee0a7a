package tracing

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/replayguard/replayguard/store"
)

// Store returns st with a client span around every call, a child of the
// call's context's span: "store.put" (or "store.nonce" for a nonce's
// key), "store.redeem", "store.acquire", "store.renew", "store.complete",
// "store.release", "store.lookup", "store.ping" and "store.allow". A
// failed call records its error and sets the span's status to Error;
// answers that are not errors (a token absent, a lock held, a record not
// found) are attributes: replayguard.result for Redeem, replayguard.ok
// for the others. Keys and token IDs are
// never recorded. When st is also a store.Limiter, so is the result.
func Store(st store.Store, tp trace.TracerProvider) store.Store {
	ts := &traced{Store: st, tracer: tp.Tracer(ScopeName)}
	if l, ok := st.(store.Limiter); ok {
		return &tracedLimiter{traced: ts, lim: l}
	}
	return ts
}

var _ store.Store = (*traced)(nil)
var _ store.Limiter = (*tracedLimiter)(nil)

type traced struct {
	store.Store
	tracer trace.Tracer
}

var okKey = attribute.Key("replayguard.ok")

func (s *traced) start(ctx context.Context, name string) (context.Context, trace.Span) {
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient))
}

// end ends span after a call that returned err.
func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Put is traced as "store.nonce" for a nonce's key, else as "store.put".
func (s *traced) Put(ctx context.Context, key string, t store.Token, ttl time.Duration) (bool, error) {
	name := "store.put"
	if store.IsNonceKey(key) {
		name = "store.nonce"
	}
	ctx, span := s.start(ctx, name)
	created, err := s.Store.Put(ctx, key, t, ttl)
	span.SetAttributes(okKey.Bool(created))
	end(span, err)
	return created, err
}

func (s *traced) Redeem(ctx context.Context, id string, t store.Token, owner string, lease time.Duration) (store.RedeemResult, store.Record, error) {
	ctx, span := s.start(ctx, "store.redeem")
	res, rec, err := s.Store.Redeem(ctx, id, t, owner, lease)
	if err == nil {
		span.SetAttributes(attribute.String("replayguard.result", res.String()))
	}
	end(span, err)
	return res, rec, err
}

func (s *traced) Acquire(ctx context.Context, key, fingerprint, owner string, lease time.Duration) (store.Record, bool, error) {
	ctx, span := s.start(ctx, "store.acquire")
	rec, acquired, err := s.Store.Acquire(ctx, key, fingerprint, owner, lease)
	span.SetAttributes(okKey.Bool(acquired))
	end(span, err)
	return rec, acquired, err
}

func (s *traced) Renew(ctx context.Context, key, owner string, lease time.Duration) (bool, error) {
	ctx, span := s.start(ctx, "store.renew")
	ok, err := s.Store.Renew(ctx, key, owner, lease)
	span.SetAttributes(okKey.Bool(ok))
	end(span, err)
	return ok, err
}

func (s *traced) Complete(ctx context.Context, key, owner string, response []byte, keep time.Duration) (bool, error) {
	ctx, span := s.start(ctx, "store.complete")
	ok, err := s.Store.Complete(ctx, key, owner, response, keep)
	span.SetAttributes(okKey.Bool(ok))
	end(span, err)
	return ok, err
}

func (s *traced) Release(ctx context.Context, key, owner string) (bool, error) {
	ctx, span := s.start(ctx, "store.release")
	ok, err := s.Store.Release(ctx, key, owner)
	span.SetAttributes(okKey.Bool(ok))
	end(span, err)
	return ok, err
}

// Lookup's replayguard.ok is whether the record was found.
func (s *traced) Lookup(ctx context.Context, key string) (store.Record, bool, error) {
	ctx, span := s.start(ctx, "store.lookup")
	rec, found, err := s.Store.Lookup(ctx, key)
	span.SetAttributes(okKey.Bool(found))
	end(span, err)
	return rec, found, err
}

func (s *traced) Ping(ctx context.Context) error {
	ctx, span := s.start(ctx, "store.ping")
	err := s.Store.Ping(ctx)
	end(span, err)
	return err
}

type tracedLimiter struct {
	*traced
	lim store.Limiter
}

func (s *tracedLimiter) Allow(ctx context.Context, key string, l store.Limit) (bool, time.Duration, error) {
	ctx, span := s.start(ctx, "store.allow")
	allowed, retry, err := s.lim.Allow(ctx, key, l)
	span.SetAttributes(okKey.Bool(allowed))
	end(span, err)
	return allowed, retry, err
}
