package logjson

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestWriterKeepsWholeLinesAndFlushesOnClose(t *testing.T) {
	// Written only under the Writer's lock, read after Close.
	var out bytes.Buffer
	w := NewWriter(&out, time.Hour) // no tick during the test: only Close flushes
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

// chanWriter hands each write to the test.
type chanWriter chan string

func (c chanWriter) Write(p []byte) (int, error) {
	c <- string(p)
	return len(p), nil
}

func TestWriterFlushesOnItsInterval(t *testing.T) {
	out := make(chanWriter, 1)
	w := NewWriter(out, time.Millisecond)
	defer w.Close()
	fmt.Fprintln(w, "line")
	select {
	case got := <-out:
		if got != "line\n" {
			t.Fatalf("flushed %q, want %q", got, "line\n")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the flusher never wrote the line")
	}
}
