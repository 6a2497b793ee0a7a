package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store"
)

// runTokenRecords is the part of the suite for a token's own record:
// Redeem, and Renew, Complete and Release on store.TokenRecordKey.
func runTokenRecords(t *testing.T, open func(t *testing.T) Instance) {
	ctx := context.Background()
	checkoutAlice := store.Token{Purpose: "checkout", Subject: "alice"}
	fp := checkoutAlice.Fingerprint()

	t.Run("token record: redeem with an owner opens a processing record and the token is taken", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, processing(fp, owner1))
		expectRedeemRecord(t, in, id, checkoutAlice, "", store.Recorded, processing(fp, owner1))
		// Redeeming without an owner changed nothing: the record is still there.
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, processing(fp, owner1))
	})

	t.Run("token record: redeem without an owner deletes the token and opens nothing", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeemRecord(t, in, id, checkoutAlice, "", store.Redeemed, store.Record{})
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Absent, store.Record{})
		expectRedeemRecord(t, in, id, checkoutAlice, "", store.Absent, store.Record{})
		expectNoTokenRecord(t, in, id)
	})

	t.Run("token record: a token never issued is absent and gets no record", func(t *testing.T) {
		in := open(t)
		id := ID()
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Absent, store.Record{})
		expectRedeemRecord(t, in, id, checkoutAlice, "", store.Absent, store.Record{})
		expectNoTokenRecord(t, in, id)
		if ok, err := in.Store.Release(ctx, store.TokenRecordKey(id), owner1); err != nil || ok {
			t.Fatalf("Release of a record never opened = (%v, %v), want (false, nil)", ok, err)
		}
	})

	mismatches := []struct {
		name      string
		presented store.Token
		want      store.RedeemResult
	}{
		{"another purpose", store.Token{Purpose: "login", Subject: "alice"}, store.PurposeMismatch},
		{"another purpose and subject", store.Token{Purpose: "login", Subject: "bob"}, store.PurposeMismatch},
		{"a purpose that extends the stored one", store.Token{Purpose: "checkout2", Subject: "alice"}, store.PurposeMismatch},
		{"a purpose with a newline", store.Token{Purpose: "checkout\nalice"}, store.PurposeMismatch},
		{"another subject", store.Token{Purpose: "checkout", Subject: "bob"}, store.SubjectMismatch},
		{"no subject", store.Token{Purpose: "checkout"}, store.SubjectMismatch},
		{"a subject that extends the stored one", store.Token{Purpose: "checkout", Subject: "alice2"}, store.SubjectMismatch},
	}
	for _, tc := range mismatches {
		for _, owner := range []string{owner2, ""} {
			t.Run(fmt.Sprintf("token record: a mismatch changes nothing: %s (owner %q)", tc.name, owner), func(t *testing.T) {
				in := open(t)
				id := ID()
				mustPut(t, in, id, checkoutAlice, time.Minute)
				expectRedeemRecord(t, in, id, tc.presented, owner, tc.want, store.Record{})
				expectNoTokenRecord(t, in, id)

				// The same rule once the token has a record.
				expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
				expectRedeemRecord(t, in, id, tc.presented, owner, tc.want, store.Record{})
				expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, processing(fp, owner1))
			})
		}
	}

	t.Run("token record: complete stores the response, deletes the token and every redeem gets the record", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
		resp := []byte("303 See Other\x00/orders/7")
		mustComplete(t, in, store.TokenRecordKey(id), owner1, resp, time.Second)
		if ttl, ok := in.TTL(id); ok {
			t.Fatalf("the token is still stored (TTL %v) after its record completed", ttl)
		}
		for _, owner := range []string{owner2, ""} {
			expectRedeemRecord(t, in, id, checkoutAlice, owner, store.Recorded, completed(fp, resp))
		}
		// The record's retention ends before the token would have expired:
		// the token does not come back.
		in.Advance(1100 * time.Millisecond)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Absent, store.Record{})
		expectRedeemRecord(t, in, id, checkoutAlice, "", store.Absent, store.Record{})
	})

	t.Run("token record: complete with a retention already past deletes the token too", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
		if ok, err := in.Store.Complete(ctx, store.TokenRecordKey(id), owner1, []byte("done"), -time.Second); err != nil || !ok {
			t.Fatalf("Complete = (%v, %v), want (true, nil)", ok, err)
		}
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Absent, store.Record{})
		expectNoTokenRecord(t, in, id)
	})

	t.Run("token record: release gives the token back for one retry", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
		if ok, err := in.Store.Release(ctx, store.TokenRecordKey(id), owner1); err != nil || !ok {
			t.Fatalf("Release = (%v, %v), want (true, nil)", ok, err)
		}
		expectNoTokenRecord(t, in, id)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Redeemed, processing(fp, owner2))
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Recorded, processing(fp, owner2))
		if ok, err := in.Store.Complete(ctx, store.TokenRecordKey(id), owner1, []byte("late"), time.Hour); err != nil || ok {
			t.Fatalf("Complete by the released owner = (%v, %v), want (false, nil)", ok, err)
		}
		// The token is still there under the second record: releasing that
		// one gives it back for a plain redemption.
		if ok, err := in.Store.Release(ctx, store.TokenRecordKey(id), owner2); err != nil || !ok {
			t.Fatalf("second Release = (%v, %v), want (true, nil)", ok, err)
		}
		expectRedeem(t, in, id, checkoutAlice, store.Redeemed)
	})

	t.Run("token record: an expired lease lets exactly one retry redeem the token (crash recovery)", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
		in.Advance(500 * time.Millisecond)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, processing(fp, owner1))
		in.Advance(600 * time.Millisecond) // past the 1s lease of expectRedeemRecord's first call
		expectNoTokenRecord(t, in, id)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Redeemed, processing(fp, owner2))
		expectRedeemRecord(t, in, id, checkoutAlice, "", store.Recorded, processing(fp, owner2))
		for name, call := range map[string]func(in Instance, key string) (bool, error){
			"renew": renewBy(owner1), "complete": completeBy(owner1), "release": releaseBy(owner1),
		} {
			if ok, err := call(in, store.TokenRecordKey(id)); err != nil || ok {
				t.Fatalf("%s by the expired owner = (%v, %v), want (false, nil)", name, ok, err)
			}
		}
	})

	t.Run("token record: renew extends the lease", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
		// A lease of 4s checked 2.4s on: stores on a real clock (Redis
		// waiting for a replica's WAIT on a loaded machine) get 1.6s for
		// the redemption itself.
		if ok, err := in.Store.Renew(ctx, store.TokenRecordKey(id), owner1, 4*time.Second); err != nil || !ok {
			t.Fatalf("Renew = (%v, %v), want (true, nil)", ok, err)
		}
		in.Advance(2400 * time.Millisecond)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, processing(fp, owner1))
		in.Advance(1700 * time.Millisecond)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Redeemed, processing(fp, owner2))
	})

	t.Run("token record: the token expiring while its record is processing", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Second)
		if res, rec, err := in.Store.Redeem(ctx, id, checkoutAlice, owner1, time.Hour); err != nil || res != store.Redeemed {
			t.Fatalf("RedeemRecord = (%v, %s, %v), want Redeemed", res, describe(rec), err)
		}
		in.Advance(1100 * time.Millisecond)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, processing(fp, owner1))
		mustComplete(t, in, store.TokenRecordKey(id), owner1, []byte("late but done"), time.Hour)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, completed(fp, []byte("late but done")))

		// Released instead, an expired token is simply gone.
		id = ID()
		mustPut(t, in, id, checkoutAlice, time.Second)
		if res, _, err := in.Store.Redeem(ctx, id, checkoutAlice, owner1, time.Hour); err != nil || res != store.Redeemed {
			t.Fatalf("RedeemRecord = (%v, %v), want Redeemed", res, err)
		}
		in.Advance(1100 * time.Millisecond)
		if ok, err := in.Store.Release(ctx, store.TokenRecordKey(id), owner1); err != nil || !ok {
			t.Fatalf("Release = (%v, %v), want (true, nil)", ok, err)
		}
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Absent, store.Record{})
	})

	t.Run("token record: a lease already past redeems and leaves the token live", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		res, _, err := in.Store.Redeem(ctx, id, checkoutAlice, owner1, -time.Second)
		if err != nil || res != store.Redeemed {
			t.Fatalf("RedeemRecord = (%v, %v), want Redeemed", res, err)
		}
		expectNoTokenRecord(t, in, id)
		expectRedeem(t, in, id, checkoutAlice, store.Redeemed)
	})

	t.Run("token record: TTL follows the lease, its renewal and the retention", func(t *testing.T) {
		in := open(t)
		if in.RecordTTL == nil {
			t.Skip("store cannot report record TTLs")
		}
		id := ID()
		key := store.TokenRecordKey(id)
		expectTTL := func(step string, want time.Duration) {
			t.Helper()
			if ttl, ok := in.RecordTTL(key); !ok || ttl > want || ttl < want-5*time.Second {
				t.Fatalf("RecordTTL after %s = %v, %v; want about %v", step, ttl, ok, want)
			}
		}
		mustPut(t, in, id, checkoutAlice, time.Hour)
		if res, _, err := in.Store.Redeem(ctx, id, checkoutAlice, owner1, time.Minute); err != nil || res != store.Redeemed {
			t.Fatalf("RedeemRecord = (%v, %v)", res, err)
		}
		expectTTL("RedeemRecord", time.Minute)
		if ok, err := in.Store.Renew(ctx, key, owner1, 10*time.Minute); err != nil || !ok {
			t.Fatalf("Renew = (%v, %v)", ok, err)
		}
		expectTTL("Renew", 10*time.Minute)
		mustComplete(t, in, key, owner1, nil, 24*time.Hour)
		expectTTL("Complete", 24*time.Hour)
	})

	t.Run("token record: a cancelled context is an error and changes nothing", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		for _, owner := range []string{owner1, ""} {
			if res, _, err := in.Store.Redeem(cctx, id, checkoutAlice, owner, time.Minute); err == nil {
				t.Fatalf("RedeemRecord with a cancelled context = %v, nil; want an error", res)
			}
		}
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
	})

	t.Run("token record: a token's record and a record under the token's ID do not collide", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		mustAcquire(t, in, id, fp2, owner2, time.Minute)
		expectRedeemRecord(t, in, id, checkoutAlice, owner1, store.Redeemed, processing(fp, owner1))
		expectRecord(t, in, id, processing(fp2, owner2))
		mustComplete(t, in, id, owner2, []byte("plain"), time.Hour)
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, processing(fp, owner1))
		mustComplete(t, in, store.TokenRecordKey(id), owner1, []byte("token"), time.Hour)
		expectRecord(t, in, id, completed(fp2, []byte("plain")))
		expectRedeemRecord(t, in, id, checkoutAlice, owner2, store.Recorded, completed(fp, []byte("token")))
	})

	t.Run("token record: concurrent redeems of one token: exactly one opens the record", func(t *testing.T) {
		in := open(t)
		id := ID()
		mustPut(t, in, id, checkoutAlice, time.Minute)
		const racers = 50
		type outcome struct {
			owner string
			res   store.RedeemResult
			rec   store.Record
			err   error
		}
		outcomes := race(racers, func(i int) outcome {
			o := fmt.Sprintf("racer-%d", i)
			res, rec, err := in.Store.Redeem(ctx, id, checkoutAlice, o, time.Minute)
			return outcome{o, res, rec, err}
		})
		var winner *outcome
		for i, o := range outcomes {
			switch {
			case o.err != nil:
				t.Fatalf("racer %d: %v", i, o.err)
			case o.res == store.Redeemed && winner != nil:
				t.Fatalf("racers %q and %q both redeemed", winner.owner, o.owner)
			case o.res == store.Redeemed:
				winner = &outcomes[i]
			}
		}
		if winner == nil {
			t.Fatal("no racer redeemed")
		}
		for i, o := range outcomes {
			if &outcomes[i] == winner {
				continue
			}
			if o.res != store.Recorded || !sameRecord(o.rec, processing(fp, winner.owner)) {
				t.Fatalf("racer %q got %v %s; want Recorded with the winner's processing record", o.owner, o.res, describe(o.rec))
			}
		}
	})
}

// expectRedeemRecord calls RedeemRecord with a lease of one second and
// checks its answer.
func expectRedeemRecord(t *testing.T, in Instance, id string, want store.Token, owner string, wantRes store.RedeemResult, wantRec store.Record) {
	t.Helper()
	res, rec, err := in.Store.Redeem(context.Background(), id, want, owner, time.Second)
	if err != nil {
		t.Fatalf("RedeemRecord(%s, %+v, %q): %v", id, want, owner, err)
	}
	if res != wantRes || !sameRecord(rec, wantRec) {
		t.Fatalf("RedeemRecord(%s, %+v, %q) = (%v, %s), want (%v, %s)", id, want, owner, res, describe(rec), wantRes, describe(wantRec))
	}
}

// expectNoTokenRecord checks that token id has no record, when the store
// can tell.
func expectNoTokenRecord(t *testing.T, in Instance, id string) {
	t.Helper()
	if in.RecordTTL == nil {
		return
	}
	if ttl, ok := in.RecordTTL(store.TokenRecordKey(id)); ok {
		t.Fatalf("token %s has a record (TTL %v); want none", id, ttl)
	}
}
