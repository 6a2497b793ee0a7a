package logjson

import (
	"io"
	"sync"
	"time"
)

// DefaultBufferSize is the size of each of a Writer's two buffers.
const DefaultBufferSize = 64 << 10

// Writer batches log lines: one write system call per flush instead of
// one per request line, and never one on the goroutine that logs. Lines
// gather in one of two buffers; when it fills, or every interval, it is
// handed to the Writer's own goroutine, which writes it out while new
// lines gather in the other. A goroutine that logs waits only when both
// buffers are full, that is when the output takes longer to write a
// buffer than the server takes to fill one (a slow pipe): then lines
// wait for the output rather than being dropped or growing memory
// without bound. A line reaches the output at most interval late (plus
// the time to write what came before it); a crash can lose at most that
// much. Each Write holds one whole line (slog writes a record in one
// call), so lines never interleave, and they are written in the order
// their Writes returned.
type Writer struct {
	out  io.Writer
	size int

	mu    sync.Mutex
	freed sync.Cond // signalled when the other buffer becomes free
	cur   []byte    // lines gathering
	// The other buffer is in exactly one of: free (ready to gather),
	// full (handed over, waiting to be written or being written).
	free []byte
	full []byte
	err  error // the first write error, for Flush and Close
	// closed is set once Close stopped the goroutine: later lines are
	// written at once, on the goroutine that logs them.
	closed bool

	wmu  sync.Mutex    // held while a buffer is taken and written: one writer of out at a time, in order
	kick chan struct{} // a full buffer waits
	stop chan struct{}
	done chan struct{}
}

// NewWriter returns a Writer to out that flushes every interval; Close
// it to stop its goroutine and write what is left.
func NewWriter(out io.Writer, interval time.Duration) *Writer {
	return newWriter(out, interval, DefaultBufferSize)
}

func newWriter(out io.Writer, interval time.Duration, size int) *Writer {
	l := &Writer{
		out:  out,
		size: size,
		cur:  make([]byte, 0, size),
		free: make([]byte, 0, size),
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	l.freed.L = &l.mu
	go func() {
		defer close(l.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
			case <-l.kick:
			case <-l.stop:
				return
			}
			_ = l.writeOne()
		}
	}()
	return l
}

// Write buffers p, which must hold whole lines. It hands the gathered
// lines to the Writer's goroutine when p would overflow them, and waits
// only while that goroutine still writes the previous buffer.
func (l *Writer) Write(p []byte) (int, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.wmu.Lock()
		defer l.wmu.Unlock()
		// Lines a Write racing with Close left behind go first.
		_ = l.flushLocked()
		return l.out.Write(p)
	}
	for len(l.cur) > 0 && len(l.cur)+len(p) > l.size {
		if l.free != nil {
			l.full, l.cur, l.free = l.cur, l.free, nil
			select {
			case l.kick <- struct{}{}:
			default:
			}
			break
		}
		l.freed.Wait()
	}
	l.cur = append(l.cur, p...)
	l.mu.Unlock()
	return len(p), nil
}

// writeOne writes out the full buffer, or, when there is none, the lines
// gathered so far.
func (l *Writer) writeOne() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.writeOneLocked()
}

// writeOneLocked is writeOne for a caller that holds wmu.
func (l *Writer) writeOneLocked() error {
	l.mu.Lock()
	if l.full == nil {
		if len(l.cur) == 0 {
			err := l.err
			l.mu.Unlock()
			return err
		}
		// No write is under way (wmu) and nothing is handed over, so the
		// other buffer is free.
		l.full, l.cur, l.free = l.cur, l.free, nil
	}
	b := l.full
	l.mu.Unlock()
	_, err := l.out.Write(b)
	l.mu.Lock()
	if err != nil && l.err == nil {
		l.err = err
	}
	l.full, l.free = nil, b[:0]
	if cap(l.free) > 4*l.size { // a huge line grew it: do not keep it
		l.free = make([]byte, 0, l.size)
	}
	l.freed.Broadcast()
	err = l.err
	l.mu.Unlock()
	return err
}

// Flush writes out everything buffered before it was called, on the
// calling goroutine, and returns the first write error the Writer met.
func (l *Writer) Flush() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.flushLocked()
}

// flushLocked is Flush for a caller that holds wmu. At most two buffers
// hold lines: the handed-over one, then the one gathering.
func (l *Writer) flushLocked() error {
	_ = l.writeOneLocked()
	return l.writeOneLocked()
}

// Close stops the Writer's goroutine and writes out what is left; lines
// written after it go straight to the output.
func (l *Writer) Close() error {
	close(l.stop)
	<-l.done
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return l.flushLocked()
}
