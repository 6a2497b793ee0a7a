package testenv

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// TestLockedBuffer writes from many goroutines while the test reads (run
// it under -race): every write lands whole, and Bytes is a copy.
func TestLockedBuffer(t *testing.T) {
	var l LockedBuffer
	const writers, lines = 8, 100
	line := []byte(strings.Repeat("x", 31) + "\n")
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range lines {
				_, _ = l.Write(line)
			}
		})
	}
	for range lines {
		_ = l.String() // reads race with the writes unless locked
	}
	wg.Wait()
	got := l.Bytes()
	if want := bytes.Repeat(line, writers*lines); !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d lines of %q", len(got), writers*lines, line)
	}
	got[0] = 'y'
	if l.String()[0] != 'x' {
		t.Fatal("Bytes returned the buffer itself, not a copy")
	}
}
