package testenv

import (
	"bytes"
	"sync"
)

// LockedBuffer is a bytes.Buffer that a server under test (its logger,
// its goroutines, a child process's output) writes to while the test
// reads it: every method holds one mutex. The zero value is an empty
// buffer ready to use; do not copy one after first use.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer; it never fails.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what has been written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Bytes returns a copy of what has been written so far, which later
// writes do not change.
func (l *LockedBuffer) Bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Clone(l.b.Bytes())
}
