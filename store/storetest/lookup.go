package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store"
)

// clockSlack is how far an instant Lookup reports may fall outside the
// store's clock read around the calls (Instance.Now): the store may keep
// it to the millisecond (Redis), and a record's end is its opening or
// renewal plus a duration the store rounds up to its unit.
const clockSlack = 5 * time.Millisecond

// runLookup is the part of the suite for Lookup: an operator's view of a
// record, and the release by hand that follows it.
func runLookup(t *testing.T, open func(t *testing.T) Instance) {
	ctx := context.Background()
	checkoutAlice := store.Token{Purpose: "checkout", Subject: "alice"}

	t.Run("lookup: a key never acquired is not found, and nothing is created", func(t *testing.T) {
		in := open(t)
		key := ID()
		expectNotFound(t, in, key)
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
	})

	t.Run("lookup: a reserved key other than a token's record key is never found", func(t *testing.T) {
		in := open(t)
		id := ID()
		if fresh, err := in.Store.Put(ctx, store.NonceKey("k", id), store.Token{}, time.Minute); err != nil || !fresh {
			t.Fatalf("Put(NonceKey) = (%v, %v), want fresh", fresh, err)
		}
		mustAcquire(t, in, id, fp1, owner1, time.Minute)
		for _, key := range []string{store.NonceKey("k", id), "\x00" + id, "\x00r" + id} {
			expectNotFound(t, in, key)
		}
	})

	t.Run("lookup: a processing record has its fingerprint, owner, opening and lease end", func(t *testing.T) {
		in := open(t)
		key := ID()
		before := in.Now()
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		after := in.Now()
		rec := expectLookup(t, in, key, processing(fp1, owner1))
		expectInstant(t, "Created", rec.Created, before, after)
		expectInstant(t, "Expires", rec.Expires, rec.Created.Add(time.Minute), rec.Created.Add(time.Minute))
		// Lookup changed nothing: the owner still holds the record.
		expectRecord(t, in, key, processing(fp1, owner1))
		if in.RecordTTL != nil {
			if ttl, ok := in.RecordTTL(key); !ok || ttl > time.Minute || ttl < time.Minute-5*time.Second {
				t.Fatalf("RecordTTL after Lookup = %v, %v; want about a minute, unchanged", ttl, ok)
			}
		}
		mustComplete(t, in, key, owner1, []byte("done"), time.Hour)
	})

	t.Run("lookup: renew and complete keep the opening and move the end", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		opened := expectLookup(t, in, key, processing(fp1, owner1)).Created

		in.Advance(200 * time.Millisecond)
		before := in.Now()
		if ok, err := in.Store.Renew(ctx, key, owner1, time.Hour); err != nil || !ok {
			t.Fatalf("Renew = (%v, %v), want (true, nil)", ok, err)
		}
		after := in.Now()
		rec := expectLookup(t, in, key, processing(fp1, owner1))
		if !rec.Created.Equal(opened) {
			t.Fatalf("Created after Renew = %v, want %v, kept", rec.Created, opened)
		}
		expectInstant(t, "Expires after Renew", rec.Expires, before.Add(time.Hour), after.Add(time.Hour))

		in.Advance(200 * time.Millisecond)
		resp := []byte("303 See Other\x00/orders/7")
		before = in.Now()
		mustComplete(t, in, key, owner1, resp, 24*time.Hour)
		after = in.Now()
		rec = expectLookup(t, in, key, completed(fp1, resp))
		if !rec.Created.Equal(opened) {
			t.Fatalf("Created after Complete = %v, want %v, kept", rec.Created, opened)
		}
		expectInstant(t, "Expires after Complete", rec.Expires, before.Add(24*time.Hour), after.Add(24*time.Hour))
	})

	t.Run("lookup: a completed record has a copy of its response and its retention's end", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		resp := []byte("HTTP/1.1 201 Created\r\n\r\n\x00\xff")
		before := in.Now()
		mustComplete(t, in, key, owner1, resp, time.Hour)
		after := in.Now()
		rec := expectLookup(t, in, key, completed(fp1, resp))
		expectInstant(t, "Expires", rec.Expires, before.Add(time.Hour), after.Add(time.Hour))
		if !rec.Created.Before(rec.Expires) {
			t.Fatalf("Created %v is not before Expires %v", rec.Created, rec.Expires)
		}
		for i := range rec.Response {
			rec.Response[i] ^= 0xff // the caller's own copy
		}
		expectLookup(t, in, key, completed(fp1, resp))
		expectRecord(t, in, key, completed(fp1, resp))
	})

	t.Run("lookup: a released record is not found", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		if ok, err := in.Store.Release(ctx, key, owner1); err != nil || !ok {
			t.Fatalf("Release = (%v, %v), want (true, nil)", ok, err)
		}
		expectNotFound(t, in, key)
	})

	t.Run("lookup: a record whose lease has ended is not found", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Second)
		in.Advance(1100 * time.Millisecond)
		expectNotFound(t, in, key)
		// The next execution's record is a new one, opened now.
		before := in.Now()
		mustAcquire(t, in, key, fp2, owner2, time.Minute)
		after := in.Now()
		rec := expectLookup(t, in, key, processing(fp2, owner2))
		expectInstant(t, "Created of the next record", rec.Created, before, after)
	})

	t.Run("lookup: a token's record opened by redeem, under its TokenRecordKey", func(t *testing.T) {
		in := open(t)
		id := ID()
		fp := checkoutAlice.Fingerprint()
		mustPut(t, in, id, checkoutAlice, time.Hour)
		before := in.Now()
		if res, rec, err := in.Store.Redeem(ctx, id, checkoutAlice, owner1, time.Minute); err != nil || res != store.Redeemed {
			t.Fatalf("Redeem = (%v, %s, %v), want Redeemed", res, describe(rec), err)
		}
		after := in.Now()
		key := store.TokenRecordKey(id)
		rec := expectLookup(t, in, key, processing(fp, owner1))
		expectInstant(t, "Created", rec.Created, before, after)
		expectInstant(t, "Expires", rec.Expires, rec.Created.Add(time.Minute), rec.Created.Add(time.Minute))
		// The token's ID is no record key: the token is not a record.
		expectNotFound(t, in, id)

		mustComplete(t, in, key, owner1, []byte("done"), time.Hour)
		if got := expectLookup(t, in, key, completed(fp, []byte("done"))); !got.Created.Equal(rec.Created) {
			t.Fatalf("Created after Complete = %v, want %v, kept", got.Created, rec.Created)
		}
	})

	// The operator's release by hand: Lookup shows a processing record,
	// Release with an empty owner ends it whoever holds it, and the next
	// execution runs.
	for _, tc := range []struct {
		name string
		open func(t *testing.T, in Instance) (key, fingerprint string)
		next func(t *testing.T, in Instance, key string)
	}{
		{"a caller's key", func(t *testing.T, in Instance) (string, string) {
			key := ID()
			mustAcquire(t, in, key, fp1, owner1, time.Minute)
			return key, fp1
		}, func(t *testing.T, in Instance, key string) {
			mustAcquire(t, in, key, fp2, owner2, time.Minute)
		}},
		{"a token's record", func(t *testing.T, in Instance) (string, string) {
			id := ID()
			mustPut(t, in, id, checkoutAlice, time.Hour)
			if res, _, err := in.Store.Redeem(ctx, id, checkoutAlice, owner1, time.Minute); err != nil || res != store.Redeemed {
				t.Fatalf("Redeem = (%v, %v), want Redeemed", res, err)
			}
			return store.TokenRecordKey(id), checkoutAlice.Fingerprint()
		}, func(t *testing.T, in Instance, key string) {
			id, _ := store.TokenOfRecord(key)
			expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Redeemed, processing(checkoutAlice.Fingerprint(), owner2))
		}},
	} {
		t.Run("lookup: release with an empty owner ends the processing record found: "+tc.name, func(t *testing.T) {
			in := open(t)
			key, fp := tc.open(t, in)
			expectLookup(t, in, key, processing(fp, owner1))
			if ok, err := in.Store.Release(ctx, key, ""); err != nil || !ok {
				t.Fatalf("Release(%q, \"\") = (%v, %v), want (true, nil)", key, ok, err)
			}
			expectNotFound(t, in, key)
			if ok, err := in.Store.Complete(ctx, key, owner1, []byte("late"), time.Hour); err != nil || ok {
				t.Fatalf("Complete by the released owner = (%v, %v), want (false, nil)", ok, err)
			}
			tc.next(t, in, key)
		})
	}

	t.Run("lookup: a cancelled context is an error", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if rec, found, err := in.Store.Lookup(cctx, key); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("Lookup with a cancelled context = (%s, %v, %v), want an error wrapping store.ErrUnavailable", describe(rec), found, err)
		}
	})
}

// expectLookup looks key up and checks that it finds want, with a
// Created and an Expires. It returns the record found.
func expectLookup(t *testing.T, in Instance, key string, want store.Record) store.Record {
	t.Helper()
	rec, found, err := in.Store.Lookup(context.Background(), key)
	switch {
	case err != nil:
		t.Fatalf("Lookup(%q): %v", key, err)
	case !found:
		t.Fatalf("Lookup(%q) found nothing, want %s", key, describe(want))
	case !sameRecord(rec, want):
		t.Fatalf("Lookup(%q) = %s, want %s", key, describe(rec), describe(want))
	case rec.Created.IsZero() || rec.Expires.IsZero():
		t.Fatalf("Lookup(%q): Created %v, Expires %v; want both set", key, rec.Created, rec.Expires)
	}
	return rec
}

// expectNotFound checks that Lookup finds no record under key.
func expectNotFound(t *testing.T, in Instance, key string) {
	t.Helper()
	rec, found, err := in.Store.Lookup(context.Background(), key)
	if err != nil || found || !sameRecord(rec, store.Record{}) || !rec.Created.IsZero() || !rec.Expires.IsZero() {
		t.Fatalf("Lookup(%q) = (%s, %v, %v), want nothing found", key, describe(rec), found, err)
	}
}

// expectInstant checks that got, an instant Lookup reported, lies within
// [lo, hi] on the store's clock, give or take clockSlack.
func expectInstant(t *testing.T, name string, got, lo, hi time.Time) {
	t.Helper()
	if got.Before(lo.Add(-clockSlack)) || got.After(hi.Add(clockSlack)) {
		t.Fatalf("%s = %v, want within %v of [%v, %v]", name, got, clockSlack, lo, hi)
	}
}
