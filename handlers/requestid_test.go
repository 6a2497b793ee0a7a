package handlers

import (
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
)

// requestIDOf sends GET /healthz with the X-Request-ID incoming (none
// when empty) and returns the X-Request-ID of the answer.
func requestIDOf(t *testing.T, h http.Handler, incoming string) string {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/healthz", nil)
	if incoming != "" {
		req.Header.Set(problem.RequestIDHeader, incoming)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /healthz = %d", rec.Code)
	}
	return rec.Header().Get(problem.RequestIDHeader)
}

func testEngine(t *testing.T) http.Handler {
	t.Helper()
	mem := memory.New()
	t.Cleanup(func() { _ = mem.Close() })
	svc, err := token.New(mem, []token.Key{{ID: "k1", Secret: []byte(strings.Repeat("s", 32))}}, token.WithMachineID(9))
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(svc).Engine()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestGeneratedRequestIDsAreUnpredictable: a generated ID is 128 bits in
// 32 lowercase hex digits, with nothing shared between IDs: no common
// prefix (a process ID), no counter (consecutive IDs one apart), and
// every bit set in about half of them, as random bits are. A counter or a
// fixed prefix fails the last check by far: for 1000 random IDs each bit
// lies within [350, 650] but with a chance below 1e-20.
func TestGeneratedRequestIDsAreUnpredictable(t *testing.T) {
	h := testEngine(t)
	const n = 1000
	seen := map[string]bool{}
	var ones [128]int
	var prev []byte
	for range n {
		id := requestIDOf(t, h, "")
		b, err := hex.DecodeString(id)
		if len(id) != 32 || err != nil || strings.ToLower(id) != id || len(b) != 16 {
			t.Fatalf("generated ID %q is not 32 lowercase hex digits", id)
		}
		if !validRequestID(id) {
			t.Fatalf("generated ID %q would not be accepted back", id)
		}
		if seen[id] {
			t.Fatalf("ID %q generated twice", id)
		}
		seen[id] = true
		if prev != nil && oneApart(prev, b) {
			t.Fatalf("consecutive IDs %x and %x are one apart", prev, b)
		}
		prev = b
		for i := range 128 {
			if b[i/8]&(0x80>>(i%8)) != 0 {
				ones[i]++
			}
		}
	}
	for i, c := range ones {
		if c < 350 || c > 650 {
			t.Errorf("bit %d is set in %d of %d IDs: not random", i, c, n)
		}
	}
}

// oneApart reports whether b is a+1 or a-1, read as big-endian numbers.
func oneApart(a, b []byte) bool {
	inc := func(x []byte) []byte {
		y := append([]byte(nil), x...)
		for i := len(y) - 1; i >= 0; i-- {
			y[i]++
			if y[i] != 0 {
				break
			}
		}
		return y
	}
	return string(inc(a)) == string(b) || string(inc(b)) == string(a)
}

func TestIncomingRequestIDs(t *testing.T) {
	h := testEngine(t)
	for _, tc := range []struct {
		name, incoming string
		kept           bool
	}{
		{"a well-formed ID is kept", "trace-123_abc.DEF", true},
		{"a UUID is kept", "0b9c1b7e-3f3a-4c8e-9d7a-2f1e5c6b8a90", true},
		{"128 characters are kept", strings.Repeat("a", 128), true},
		{"129 characters are replaced", strings.Repeat("a", 129), false},
		{"a space is replaced", "trace 123", false},
		{"a quote is replaced", `trace"123`, false},
		{"non-ASCII is replaced", "tracé", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := requestIDOf(t, h, tc.incoming)
			if tc.kept && got != tc.incoming {
				t.Fatalf("X-Request-ID = %q, want %q kept", got, tc.incoming)
			}
			if !tc.kept && (got == tc.incoming || len(got) != 32) {
				t.Fatalf("X-Request-ID = %q, want a generated ID", got)
			}
		})
	}
}

func BenchmarkNewRequestID(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = newRequestID()
	}
}

func BenchmarkNewRequestIDParallel(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = newRequestID()
		}
	})
}
