package main

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
)

// logWriter batches log lines: one write system call per flush instead of
// one per request line. It flushes every interval, when its buffer fills,
// and on Close, so a line reaches the output at most interval late; a
// crash can lose at most that much. Each Write holds one whole line (slog
// writes a record in one call), so lines never interleave.
type logWriter struct {
	mu   sync.Mutex
	w    *bufio.Writer
	stop chan struct{}
	done chan struct{}
}

func newLogWriter(out io.Writer, interval time.Duration) *logWriter {
	l := &logWriter{w: bufio.NewWriterSize(out, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
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

func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Flush writes out what is buffered.
func (l *logWriter) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Flush()
}

// Close stops the flusher and flushes what is left.
func (l *logWriter) Close() error {
	close(l.stop)
	<-l.done
	return l.Flush()
}

// logPanic returns the panic handler of the server's goroutines: it logs
// the panic with its stack as one "panic" line and flushes logs, so that
// the lines of the last interval and the panic's are written before the
// process ends. It does not stop the panic: see repanic.
func logPanic(log *slog.Logger, logs *logWriter) func(v any) {
	return func(v any) {
		log.Error("panic", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		_ = logs.Flush()
	}
}

// repanic, deferred at the top of a goroutine, passes a panic to onPanic
// and panics again with the same value: the process still crashes, with
// Go's trace of the original panic on stderr.
func repanic(onPanic func(v any)) {
	if v := recover(); v != nil {
		onPanic(v)
		panic(v)
	}
}
