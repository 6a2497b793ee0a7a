package logjson

import (
	"bufio"
	"io"
	"sync"
	"time"
)

// Writer batches log lines: one write system call per flush instead of
// one per request line. It flushes every interval, when its buffer fills,
// and on Close, so a line reaches the output at most interval late; a
// crash can lose at most that much. Each Write holds one whole line (slog
// writes a record in one call), so lines never interleave.
type Writer struct {
	mu   sync.Mutex
	w    *bufio.Writer
	stop chan struct{}
	done chan struct{}
}

// NewWriter returns a Writer to out that flushes every interval; Close
// it to stop its flusher.
func NewWriter(out io.Writer, interval time.Duration) *Writer {
	l := &Writer{w: bufio.NewWriterSize(out, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				_ = l.Flush()
			case <-l.stop:
				return
			}
		}
	}()
	return l
}

// Write buffers p, which must hold whole lines.
func (l *Writer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Flush writes out what is buffered.
func (l *Writer) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Flush()
}

// Close stops the flusher and flushes what is left.
func (l *Writer) Close() error {
	close(l.stop)
	<-l.done
	return l.Flush()
}
