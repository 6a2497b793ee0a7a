package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store"
)

// Owners and fingerprints the record cases use.
const (
	owner1 = "owner-1"
	owner2 = "owner-2"
	fp1    = "fingerprint-1"
	fp2    = "fingerprint-2"
)

// runRecords is the part of the suite for idempotency records: Acquire,
// Renew, Complete and Release.
func runRecords(t *testing.T, open func(t *testing.T) Instance) {
	ctx := context.Background()

	t.Run("record: acquire opens a record and a duplicate sees it processing", func(t *testing.T) {
		in := open(t)
		key := ID()
		rec, acquired, err := in.Store.Acquire(ctx, key, fp1, owner1, time.Minute)
		if err != nil || !acquired {
			t.Fatalf("first Acquire = (%v, %v), want acquired", acquired, err)
		}
		if !sameRecord(rec, processing(fp1, owner1)) {
			t.Fatalf("first Acquire returned %s, want the new record %s", describe(rec), describe(processing(fp1, owner1)))
		}
		expectRecord(t, in, key, processing(fp1, owner1))
		expectRecord(t, in, key, processing(fp1, owner1))
	})

	t.Run("record: renew by the owner extends the lease", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Second)
		if ok, err := in.Store.Renew(ctx, key, owner1, 2*time.Second); err != nil || !ok {
			t.Fatalf("Renew by the owner = (%v, %v), want (true, nil)", ok, err)
		}
		in.Advance(1200 * time.Millisecond) // past the first lease, within the renewed one
		expectRecord(t, in, key, processing(fp1, owner1))
		in.Advance(900 * time.Millisecond) // past the renewed lease
		mustAcquire(t, in, key, fp2, owner2, time.Minute)
	})

	// Each call is refused on a record it may not change, which stays as
	// it was: its state, response and expiry.
	refusals := []struct {
		name      string
		completed bool // the record is completed before the call
		call      func(in Instance, key string) (bool, error)
	}{
		{"renew by another owner", false, renewBy(owner2)},
		{"complete by another owner", false, completeBy(owner2)},
		{"release by another owner", false, releaseBy(owner2)},
		{"renew of a completed record by its owner", true, renewBy(owner1)},
		{"complete of a completed record by its owner", true, completeBy(owner1)},
		{"release of a completed record by its owner", true, releaseBy(owner1)},
		{"renew with an empty owner (any owner is for complete and release only)", false, renewBy("")},
		{"complete of a completed record with an empty owner", true, completeBy("")},
		{"release of a completed record with an empty owner", true, releaseBy("")},
	}
	for _, tc := range refusals {
		t.Run("record: refused, nothing changes: "+tc.name, func(t *testing.T) {
			in := open(t)
			key := ID()
			mustAcquire(t, in, key, fp1, owner1, time.Minute)
			want, life := processing(fp1, owner1), time.Minute
			if tc.completed {
				mustComplete(t, in, key, owner1, []byte("first"), 2*time.Minute)
				want, life = completed(fp1, []byte("first")), 2*time.Minute
			}
			if ok, err := tc.call(in, key); err != nil || ok {
				t.Fatalf("call = (%v, %v), want (false, nil)", ok, err)
			}
			if in.RecordTTL != nil {
				if ttl, ok := in.RecordTTL(key); !ok || ttl > life || ttl < life-5*time.Second {
					t.Fatalf("RecordTTL after the refused call = %v, %v; want about %v, unchanged", ttl, ok, life)
				}
			}
			expectRecord(t, in, key, want)
		})
	}

	t.Run("record: an empty owner completes whoever's processing record", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		mustComplete(t, in, key, "", []byte("done"), time.Hour)
		expectRecord(t, in, key, completed(fp1, []byte("done")))
	})

	t.Run("record: an empty owner releases whoever's processing record", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		if ok, err := releaseBy("")(in, key); err != nil || !ok {
			t.Fatalf("Release(\"\") = (%v, %v), want (true, nil)", ok, err)
		}
		mustAcquire(t, in, key, fp2, owner2, time.Minute)
	})

	for _, tc := range []struct {
		name string
		call func(in Instance, key string) (bool, error)
	}{
		{"complete with an empty owner", completeBy("")},
		{"release with an empty owner", releaseBy("")},
		{"renew", renewBy(owner1)},
		{"complete", completeBy(owner1)},
		{"release", releaseBy(owner1)},
	} {
		t.Run("record: "+tc.name+" of a key never acquired is refused and creates nothing", func(t *testing.T) {
			in := open(t)
			key := ID()
			if ok, err := tc.call(in, key); err != nil || ok {
				t.Fatalf("call = (%v, %v), want (false, nil)", ok, err)
			}
			mustAcquire(t, in, key, fp1, owner1, time.Minute)
		})
	}

	big := make([]byte, 1<<20)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		response []byte
	}{
		{"empty", []byte{}},
		{"text", []byte("HTTP/1.1 303 See Other\r\nLocation: /orders/7\r\n\r\n")},
		{"NUL bytes", []byte("\x00a\x00\x00b\x00")},
		{"invalid UTF-8", []byte{0xff, 0xfe, 0xc3, 0x28}},
		{"1 MiB of random bytes", big},
	} {
		t.Run("record: complete stores the exact response for every duplicate: "+tc.name, func(t *testing.T) {
			in := open(t)
			key := ID()
			mustAcquire(t, in, key, fp1, owner1, time.Minute)
			resp := bytes.Clone(tc.response)
			mustComplete(t, in, key, owner1, resp, time.Hour)
			for i := range resp {
				resp[i] ^= 0xff // the store must have kept its own copy
			}
			want := completed(fp1, tc.response)
			got := expectRecord(t, in, key, want)
			for i := range got.Response {
				got.Response[i] ^= 0xff // and hand out copies
			}
			expectRecord(t, in, key, want)
		})
	}

	t.Run("record: release by the owner lets the next acquire run", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		if ok, err := in.Store.Release(ctx, key, owner1); err != nil || !ok {
			t.Fatalf("Release by the owner = (%v, %v), want (true, nil)", ok, err)
		}
		if ok, err := in.Store.Release(ctx, key, owner1); err != nil || ok {
			t.Fatalf("second Release = (%v, %v), want (false, nil)", ok, err)
		}
		mustAcquire(t, in, key, fp2, owner2, time.Minute)
		if ok, err := in.Store.Complete(ctx, key, owner1, []byte("late"), time.Hour); err != nil || ok {
			t.Fatalf("Complete by the released owner = (%v, %v), want (false, nil)", ok, err)
		}
		expectRecord(t, in, key, processing(fp2, owner2))
	})

	t.Run("record: an expired lease lets the next acquire run (crash recovery)", func(t *testing.T) {
		in := open(t)
		key := ID()
		mustAcquire(t, in, key, fp1, owner1, time.Second)
		in.Advance(1100 * time.Millisecond)
		mustAcquire(t, in, key, fp1, owner2, time.Minute)
		// The first owner has lost the record: none of its calls count.
		for name, call := range map[string]func(in Instance, key string) (bool, error){
			"renew": renewBy(owner1), "complete": completeBy(owner1), "release": releaseBy(owner1),
		} {
			if ok, err := call(in, key); err != nil || ok {
				t.Fatalf("%s by the expired owner = (%v, %v), want (false, nil)", name, ok, err)
			}
		}
		expectRecord(t, in, key, processing(fp1, owner2))
	})

	for _, tc := range []struct {
		name        string
		lease, keep time.Duration
		gone        bool // after 1.1s
	}{
		{"a shorter retention ends the record at keepUntil", time.Hour, time.Second, true},
		{"a longer retention outlives the lease", time.Second, time.Hour, false},
	} {
		t.Run("record: complete replaces the lease expiry with keepUntil: "+tc.name, func(t *testing.T) {
			in := open(t)
			key := ID()
			mustAcquire(t, in, key, fp1, owner1, tc.lease)
			mustComplete(t, in, key, owner1, []byte("done"), tc.keep)
			if in.RecordTTL != nil {
				if ttl, ok := in.RecordTTL(key); !ok || ttl > tc.keep || ttl < tc.keep-5*time.Second {
					t.Fatalf("RecordTTL after Complete = %v, %v; want about %v", ttl, ok, tc.keep)
				}
			}
			in.Advance(1100 * time.Millisecond)
			if tc.gone {
				if in.RecordTTL != nil {
					if _, ok := in.RecordTTL(key); ok {
						t.Fatal("expired record is still stored")
					}
				}
				mustAcquire(t, in, key, fp2, owner2, time.Minute)
			} else {
				expectRecord(t, in, key, completed(fp1, []byte("done")))
			}
		})
	}

	t.Run("record: TTL follows the lease, its renewal and the retention", func(t *testing.T) {
		in := open(t)
		if in.RecordTTL == nil {
			t.Skip("store cannot report record TTLs")
		}
		key := ID()
		expectTTL := func(step string, want time.Duration) {
			t.Helper()
			if ttl, ok := in.RecordTTL(key); !ok || ttl > want || ttl < want-5*time.Second {
				t.Fatalf("RecordTTL after %s = %v, %v; want about %v", step, ttl, ok, want)
			}
		}
		mustAcquire(t, in, key, fp1, owner1, time.Minute)
		expectTTL("Acquire", time.Minute)
		if ok, err := in.Store.Renew(ctx, key, owner1, time.Hour); err != nil || !ok {
			t.Fatalf("Renew = (%v, %v)", ok, err)
		}
		expectTTL("Renew", time.Hour)
		mustComplete(t, in, key, owner1, nil, 24*time.Hour)
		expectTTL("Complete", 24*time.Hour)
		expectRecord(t, in, key, completed(fp1, nil))
	})

	// An expiry that has already passed acts as if it had been set and
	// reached at once: the call succeeds and no record is left.
	for _, tc := range []struct {
		name string
		call func(t *testing.T, in Instance, key string) (bool, error)
	}{
		{"acquire", func(t *testing.T, in Instance, key string) (bool, error) {
			_, acquired, err := in.Store.Acquire(ctx, key, fp1, owner1, -time.Second)
			return acquired, err
		}},
		{"renew", func(t *testing.T, in Instance, key string) (bool, error) {
			mustAcquire(t, in, key, fp1, owner1, time.Minute)
			return in.Store.Renew(ctx, key, owner1, -time.Second)
		}},
		{"complete", func(t *testing.T, in Instance, key string) (bool, error) {
			mustAcquire(t, in, key, fp1, owner1, time.Minute)
			return in.Store.Complete(ctx, key, owner1, []byte("done"), -time.Second)
		}},
	} {
		t.Run("record: "+tc.name+" with an expiry already past succeeds and leaves no record", func(t *testing.T) {
			in := open(t)
			key := ID()
			if ok, err := tc.call(t, in, key); err != nil || !ok {
				t.Fatalf("call = (%v, %v), want (true, nil)", ok, err)
			}
			if in.RecordTTL != nil {
				if ttl, ok := in.RecordTTL(key); ok {
					t.Fatalf("RecordTTL = %v, true; want no record", ttl)
				}
			}
			mustAcquire(t, in, key, fp2, owner2, time.Minute)
		})
	}

	for _, tc := range []struct {
		name string
		call func(ctx context.Context, in Instance, key string) error
	}{
		{"acquire", func(ctx context.Context, in Instance, key string) error {
			_, _, err := in.Store.Acquire(ctx, key, fp2, owner2, time.Hour)
			return err
		}},
		{"renew", func(ctx context.Context, in Instance, key string) error {
			_, err := in.Store.Renew(ctx, key, owner1, time.Hour)
			return err
		}},
		{"complete", func(ctx context.Context, in Instance, key string) error {
			_, err := in.Store.Complete(ctx, key, owner1, []byte("x"), time.Hour)
			return err
		}},
		{"release", func(ctx context.Context, in Instance, key string) error {
			_, err := in.Store.Release(ctx, key, owner1)
			return err
		}},
	} {
		t.Run("record: "+tc.name+" with a cancelled context is an error and changes nothing", func(t *testing.T) {
			in := open(t)
			key := ID()
			mustAcquire(t, in, key, fp1, owner1, time.Minute)
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if err := tc.call(cctx, in, key); err == nil {
				t.Fatal("call with a cancelled context succeeded; want an error")
			}
			expectRecord(t, in, key, processing(fp1, owner1))
		})
	}

	t.Run("record: concurrent acquires of one key: exactly one acquires", func(t *testing.T) {
		in := open(t)
		key := ID()
		const racers = 50
		type outcome struct {
			owner    string
			rec      store.Record
			acquired bool
			err      error
		}
		outcomes := race(racers, func(i int) outcome {
			o := fmt.Sprintf("racer-%d", i)
			rec, acquired, err := in.Store.Acquire(ctx, key, fp1, o, time.Minute)
			return outcome{o, rec, acquired, err}
		})
		winner := ""
		for _, o := range outcomes {
			switch {
			case o.err != nil:
				t.Fatalf("%s: %v", o.owner, o.err)
			case o.acquired && winner != "":
				t.Fatalf("both %s and %s acquired", winner, o.owner)
			case o.acquired:
				winner = o.owner
			}
		}
		if winner == "" {
			t.Fatal("no racer acquired")
		}
		for _, o := range outcomes {
			if !o.acquired && !sameRecord(o.rec, processing(fp1, winner)) {
				t.Fatalf("%s saw %s, want the winner's processing record", o.owner, describe(o.rec))
			}
		}
	})

	t.Run("record: keys with separators and unicode are distinct", func(t *testing.T) {
		in := open(t)
		base := ID()
		keys := []string{
			"", "a", "a:b", "a:" + base, "a:" + base + ":", base + "\n", base + "\x00",
			"ünïcødé:" + base, "with{braces}" + base, "}" + base, "{" + base + "}", "r:{" + base + "}",
		}
		for _, k := range keys {
			mustAcquire(t, in, k, "fp:"+k, owner1, time.Minute)
		}
		for _, k := range keys {
			expectRecord(t, in, k, processing("fp:"+k, owner1))
		}
	})

	t.Run("record: a record and a token with the same name do not collide", func(t *testing.T) {
		in := open(t)
		tok := store.Token{Purpose: "checkout"}
		id := ID()
		mustPut(t, in, id, tok, time.Minute)
		mustAcquire(t, in, id, fp1, owner1, time.Minute)
		expectRedeem(t, in, id, tok, store.Redeemed)
		expectRecord(t, in, id, processing(fp1, owner1))

		id = ID()
		mustAcquire(t, in, id, fp1, owner1, time.Minute)
		expectRedeem(t, in, id, store.Token{}, store.Absent)
		mustPut(t, in, id, tok, time.Minute)
		mustComplete(t, in, id, owner1, []byte("done"), time.Minute)
		expectRedeem(t, in, id, tok, store.Redeemed)
		expectRecord(t, in, id, completed(fp1, []byte("done")))
	})
}

func processing(fingerprint, owner string) store.Record {
	return store.Record{Fingerprint: fingerprint, Owner: owner}
}

func completed(fingerprint string, response []byte) store.Record {
	return store.Record{Completed: true, Fingerprint: fingerprint, Response: response}
}

// sameRecord reports whether got is want. The owner of a completed record
// is not part of the contract and is not compared; an empty response
// equals a nil one.
func sameRecord(got, want store.Record) bool {
	return got.Completed == want.Completed && got.Fingerprint == want.Fingerprint &&
		(want.Completed || got.Owner == want.Owner) && bytes.Equal(got.Response, want.Response)
}

// describe formats r for failure messages, without dumping long responses.
func describe(r store.Record) string {
	resp := fmt.Sprintf("%q", r.Response)
	if len(r.Response) > 64 {
		resp = fmt.Sprintf("%d bytes", len(r.Response))
	}
	return fmt.Sprintf("{Completed:%v Fingerprint:%q Owner:%q Response:%s}", r.Completed, r.Fingerprint, r.Owner, resp)
}

func renewBy(owner string) func(in Instance, key string) (bool, error) {
	return func(in Instance, key string) (bool, error) {
		return in.Store.Renew(context.Background(), key, owner, time.Hour)
	}
}

func completeBy(owner string) func(in Instance, key string) (bool, error) {
	return func(in Instance, key string) (bool, error) {
		return in.Store.Complete(context.Background(), key, owner, []byte("other"), time.Hour)
	}
}

func releaseBy(owner string) func(in Instance, key string) (bool, error) {
	return func(in Instance, key string) (bool, error) {
		return in.Store.Release(context.Background(), key, owner)
	}
}

// mustAcquire acquires key for owner with a lease of lease.
func mustAcquire(t *testing.T, in Instance, key, fingerprint, owner string, lease time.Duration) {
	t.Helper()
	rec, acquired, err := in.Store.Acquire(context.Background(), key, fingerprint, owner, lease)
	if err != nil || !acquired {
		t.Fatalf("Acquire(%q, %s) = (%s, %v, %v), want acquired", key, owner, describe(rec), acquired, err)
	}
}

// mustComplete completes owner's record under key, kept for keep.
func mustComplete(t *testing.T, in Instance, key, owner string, response []byte, keep time.Duration) {
	t.Helper()
	ok, err := in.Store.Complete(context.Background(), key, owner, response, keep)
	if err != nil || !ok {
		t.Fatalf("Complete(%q, %s) = (%v, %v), want (true, nil)", key, owner, ok, err)
	}
}

// expectRecord acquires key as a duplicate would and checks that it finds
// want. It returns the record found.
func expectRecord(t *testing.T, in Instance, key string, want store.Record) store.Record {
	t.Helper()
	rec, acquired, err := in.Store.Acquire(context.Background(), key, "probe-fingerprint", "probe-owner", time.Minute)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", key, err)
	}
	if acquired {
		t.Fatalf("Acquire(%q) acquired; want the live record %s", key, describe(want))
	}
	if !sameRecord(rec, want) {
		t.Fatalf("Acquire(%q) found %s, want %s", key, describe(rec), describe(want))
	}
	return rec
}
