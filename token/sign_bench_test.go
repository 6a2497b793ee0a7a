package token

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/store"
)

type nopStore struct{ store.Store }

func (nopStore) Ping(context.Context) error { return nil }

// BenchmarkSign measures HS256 signing of one token's claims alone,
// without sonyflake (which issues at most 256 IDs per 10 ms) or a store.
func BenchmarkSign(b *testing.B) {
	s, err := New(nopStore{}, []Key{{ID: "a", Secret: []byte(strings.Repeat("k", 32))}}, WithMachineID(1))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	c := Claims{ID: "647231193145702212", Purpose: DefaultPurpose, IssuedAt: now, ExpiresAt: now.Add(DefaultTTL)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.sign(c); err != nil {
			b.Fatal(err)
		}
	}
}
