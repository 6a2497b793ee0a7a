package token

import (
	"strings"
	"testing"
	"time"
)

// BenchmarkSign measures HS256 signing of one token's claims alone,
// without sonyflake (which issues at most 256 IDs per 10 ms) or a store.
func BenchmarkSign(b *testing.B) {
	s := &Service{signer: Key{ID: "a", Secret: []byte(strings.Repeat("k", 32))}}
	now := time.Now().Truncate(time.Second)
	c := Claims{ID: "647231193145702212", Purpose: DefaultPurpose, IssuedAt: now, ExpiresAt: now.Add(DefaultTTL)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.sign(c); err != nil {
			b.Fatal(err)
		}
	}
}
