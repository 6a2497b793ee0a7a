package main

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the flusher and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestLogWriterKeepsWholeLinesAndFlushesOnClose(t *testing.T) {
	var out lockedBuffer
	w := newLogWriter(&out, time.Hour) // no tick during the test: only Close flushes
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				fmt.Fprintf(w, "{\"g\":%d,\"i\":%d,\"pad\":%q}\n", g, i, strings.Repeat("x", 100))
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 8*500 {
		t.Fatalf("%d lines, want %d", len(lines), 8*500)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "{\"g\":") || !strings.HasSuffix(l, "\"}") {
			t.Fatalf("torn line: %q", l)
		}
	}
}

func TestLogWriterFlushesOnItsInterval(t *testing.T) {
	var out lockedBuffer
	w := newLogWriter(&out, time.Millisecond)
	defer w.Close()
	fmt.Fprintln(w, "line")
	deadline := time.Now().Add(5 * time.Second)
	for out.String() != "line\n" {
		if time.Now().After(deadline) {
			t.Fatal("the flusher never wrote the line")
		}
		time.Sleep(time.Millisecond) // waiting on the flusher goroutine's tick, bounded
	}
}
