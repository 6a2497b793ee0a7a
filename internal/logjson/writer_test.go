package logjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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

// heldWriter hands each write to the test on got, then waits for the
// test to release it.
type heldWriter struct {
	got     chan string
	release chan struct{}
}

func (h heldWriter) Write(p []byte) (int, error) {
	h.got <- string(p)
	<-h.release
	return len(p), nil
}

func TestWriterNeverWritesOnTheLoggingGoroutineWhileABufferIsFree(t *testing.T) {
	out := heldWriter{got: make(chan string), release: make(chan struct{})}
	w := newWriter(out, time.Hour, 16) // no tick: only full buffers are handed over
	a, b, c := "aaaaaaaaaaaaaa\n", "bbbbbbbbbbbbbb\n", "cccccccccccccc\n"
	fmt.Fprint(w, a)
	fmt.Fprint(w, b) // a's buffer is full: handed to the Writer's goroutine
	if got := <-out.got; got != a {
		t.Fatalf("first write %q, want %q", got, a)
	}
	// The output is now held inside its Write. A line that fits the free
	// buffer must not wait for it (if Write wrote itself, this would hang).
	// b's buffer is full too, and the other one is still being written:
	// c waits for it.
	cDone := make(chan struct{})
	go func() {
		defer close(cDone)
		fmt.Fprint(w, c)
	}()
	out.release <- struct{}{} // a written; b's buffer is handed over
	if got := <-out.got; got != b {
		t.Fatalf("second write %q, want %q", got, b)
	}
	out.release <- struct{}{}
	<-cDone
	closed := make(chan error)
	go func() { closed <- w.Close() }()
	if got := <-out.got; got != c {
		t.Fatalf("third write %q, want %q", got, c)
	}
	out.release <- struct{}{}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

func TestWriterKeepsEachGoroutinesOrder(t *testing.T) {
	var out bytes.Buffer // written by one goroutine at a time (wmu), read after Close
	w := newWriter(&out, time.Millisecond, 256)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				fmt.Fprintf(w, "%d %d\n", g, i)
			}
		}()
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	next := map[int]int{}
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var g, i int
		if _, err := fmt.Sscanf(l, "%d %d", &g, &i); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if i != next[g] {
			t.Fatalf("goroutine %d: line %d after %d", g, i, next[g]-1)
		}
		next[g]++
	}
	for g := range 4 {
		if next[g] != 2000 {
			t.Fatalf("goroutine %d: %d lines, want 2000", g, next[g])
		}
	}
}

func TestWriterFlushAndWritesAfterClose(t *testing.T) {
	var out bytes.Buffer
	w := newWriter(&out, time.Hour, 1<<10)
	fmt.Fprint(w, "one\n")
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if out.String() != "one\n" {
		t.Fatalf("after Flush: %q", out.String())
	}
	fmt.Fprint(w, "two\n")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(w, "three\n") // straight to the output
	if out.String() != "one\ntwo\nthree\n" {
		t.Fatalf("after Close: %q", out.String())
	}
}

// failWriter fails every write.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriterReportsWriteErrors(t *testing.T) {
	w := newWriter(failWriter{}, time.Hour, 1<<10)
	fmt.Fprint(w, "line\n")
	if err := w.Close(); err == nil || err.Error() != "disk full" {
		t.Fatalf("Close = %v, want the output's error", err)
	}
}

func BenchmarkWriterParallel(b *testing.B) {
	w := NewWriter(io.Discard, 100*time.Millisecond)
	defer w.Close()
	line := []byte(`{"time":"2026-11-28T14:38:50.134558902Z","level":"INFO","msg":"request","method":"POST","path":"/v1/tokens/redeem","status":200,"duration_ms":0.412,"request_id":"6673e12f94917f1a6ec73b9629d50111"}` + "\n")
	b.SetBytes(int64(len(line)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = w.Write(line)
		}
	})
}
