package replay

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestMACCacheSumsAsHMAC checks the pooled HMACs against hmac.New, for
// secrets shorter than, as long as and longer than a SHA-256 block, a
// secret whose slice changes after use, and a nil cache.
func TestMACCacheSumsAsHMAC(t *testing.T) {
	want := func(secret, msg []byte) []byte {
		h := hmac.New(sha256.New, secret)
		h.Write(msg)
		return h.Sum(nil)
	}
	tests := []struct {
		name   string
		cache  *macCache
		secret []byte
	}{
		{"short secret", new(macCache), []byte("k")},
		{"one block", new(macCache), bytes.Repeat([]byte("b"), 64)},
		{"longer than a block", new(macCache), bytes.Repeat([]byte("l"), 100)},
		{"nil cache", nil, []byte("partner-1 secret, 32+ bytes long!")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, msg := range []string{"", "a", strings.Repeat("m", 1000), "a"} {
				if got := tc.cache.sum(tc.secret, []byte(msg), nil); !bytes.Equal(got, want(tc.secret, []byte(msg))) {
					t.Fatalf("message %d: sum = %x, want %x", i, got, want(tc.secret, []byte(msg)))
				}
			}
			// The caller's slice changing must not change the key of the
			// pool it keyed.
			secret := bytes.Clone(tc.secret)
			tc.cache.sum(secret, []byte("x"), nil)
			old := bytes.Clone(secret)
			secret[0] ^= 0xff
			if got := tc.cache.sum(old, []byte("x"), nil); !bytes.Equal(got, want(old, []byte("x"))) {
				t.Fatal("a pool's key changed with its caller's slice")
			}
			if got := tc.cache.sum(secret, []byte("x"), nil); !bytes.Equal(got, want(secret, []byte("x"))) {
				t.Fatal("a changed secret sums with the old key")
			}
		})
	}
}

// TestMACCacheIsBoundedAndConcurrent keys more secrets than the cache
// keeps, from several goroutines: every sum stays right and the cache
// never holds more than maxMACPools pools.
func TestMACCacheIsBoundedAndConcurrent(t *testing.T) {
	var c macCache
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range maxMACPools + 50 {
				secret := fmt.Appendf(nil, "secret %d", (i*7+g)%(maxMACPools+50))
				h := hmac.New(sha256.New, secret)
				h.Write([]byte("msg"))
				if got := c.sum(secret, []byte("msg"), nil); !bytes.Equal(got, h.Sum(nil)) {
					t.Errorf("secret %q: wrong sum", secret)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := len(*c.pools.Load()); n > maxMACPools {
		t.Fatalf("the cache holds %d pools, more than %d", n, maxMACPools)
	}
}

// raceEnabled is set under the race detector (race_test.go).
var raceEnabled bool

// TestVerifyAllocatesLittle guards the fast paths: verifying the usual
// signed request, up to the store, allocates next to nothing (the one
// allocation is the nonce's store key).
func TestVerifyAllocatesLittle(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items")
	}
	for _, k := range signingKeys {
		t.Run(k.Alg, func(t *testing.T) {
			m := signed(t, k, testNow, `{"item": 1}`, nil)
			v := NewVerifier(testKeys, freshStore{}, WithClock(fixedClock(testNow)))
			allocs := testing.AllocsPerRun(100, func() {
				if _, err := v.Verify(t.Context(), m); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("%v allocations per Verify", allocs)
			if allocs > 1 {
				t.Fatalf("Verify allocates %v times, want at most 1", allocs)
			}
		})
	}
}
