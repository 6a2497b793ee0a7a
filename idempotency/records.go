package idempotency

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/replayguard/replayguard/store"
)

// ErrBadRecordID: a record ID given to ParseRecordID is not one RecordID
// returns.
var ErrBadRecordID = errors.New("idempotency: malformed record ID")

// Record ID prefixes: a token's record, and a key that is not plain
// printable ASCII.
const (
	tokenRecordID  = "token:"
	base64RecordID = "b64:"
)

// RecordID returns the printable ID of the record under the store key
// key, as log lines and the admin API show it: key itself when it is
// printable ASCII without spaces (the HTTP middleware's keys, "idem:" and
// 64 hex digits, are), "token:" and the token's ID for a token's own
// record (store.TokenRecordKey), else "b64:" and the key in unpadded
// base64url. ParseRecordID reverses it.
func RecordID(key string) string {
	if id, ok := store.TokenOfRecord(key); ok {
		return tokenRecordID + id
	}
	if key == "" || strings.HasPrefix(key, tokenRecordID) || strings.HasPrefix(key, base64RecordID) || !plain(key) {
		return base64RecordID + base64.RawURLEncoding.EncodeToString([]byte(key))
	}
	return key
}

// plain reports whether s is printable ASCII without spaces.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// ParseRecordID returns the store key of the record whose ID is id (see
// RecordID), or ErrBadRecordID.
func ParseRecordID(id string) (string, error) {
	switch {
	case strings.HasPrefix(id, tokenRecordID) && len(id) > len(tokenRecordID):
		return store.TokenRecordKey(id[len(tokenRecordID):]), nil
	case strings.HasPrefix(id, base64RecordID):
		b, err := base64.RawURLEncoding.DecodeString(id[len(base64RecordID):])
		if err != nil || len(b) == 0 {
			return "", fmt.Errorf("%w: %q is not base64url after %q", ErrBadRecordID, id, base64RecordID)
		}
		return string(b), nil
	case id == "" || !plain(id):
		return "", fmt.Errorf("%w: %q", ErrBadRecordID, id)
	}
	return id, nil
}

// RecordInfo is what an operator sees of a record (Keeper.Lookup).
type RecordInfo struct {
	// ID is the record's ID (RecordID of its key).
	ID string
	// Completed is false while the record is processing.
	Completed bool
	// Created is when the record was opened, on the store's clock.
	Created time.Time
	// LeaseEnds is when a processing record's lease ends unless its
	// holder renews it; the record stays for the grace after that.
	// Zero for a completed record.
	LeaseEnds time.Time
	// Expires is when the record ends: the lease's end plus the grace
	// while processing (then one retry runs), the retention's end once
	// completed.
	Expires time.Time
	// Status is a completed record's stored status (0 while processing).
	Status int
	// BodyStored is true for a completed record whose outcome's body was
	// stored (false when it was over the cap: duplicates get
	// ErrNotStored).
	BodyStored bool
}

// Lookup returns what the live record under key holds, for an operator:
// found is false when no record is live. It changes nothing.
func (k *Keeper) Lookup(ctx context.Context, key string) (info RecordInfo, found bool, err error) {
	rec, found, err := k.store.Lookup(ctx, key)
	if err != nil || !found {
		return RecordInfo{}, false, err
	}
	info = RecordInfo{ID: RecordID(key), Completed: rec.Completed, Created: rec.Created, Expires: rec.Expires}
	if !rec.Completed {
		if !rec.Expires.IsZero() {
			info.LeaseEnds = rec.Expires.Add(-k.Grace())
		}
		return info, true, nil
	}
	out, err := decodeOutcome(rec.Response)
	if err != nil {
		return RecordInfo{}, false, err
	}
	info.Status, info.BodyStored = out.Status, !out.BodyOmitted
	return info, true, nil
}

// Release deletes the processing record under key, whoever holds it, so
// that the next retry runs: for an operator who knows its execution is
// dead (or who accepts that it may run twice). released is false when no
// processing record holds key (none, or a completed one, which is never
// released).
func (k *Keeper) Release(ctx context.Context, key string) (released bool, err error) {
	if key == "" {
		return false, fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	}
	return k.store.Release(ctx, key, "")
}
