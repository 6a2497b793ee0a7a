// Package fileread reads the files Replayguard is configured with (a
// routes file, a webhook secret file, a client keys file) within a size
// limit, so that a wrong path (a log, a device) fails with a clear error
// instead of filling the memory.
package fileread

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrTooLarge is what AtMost's error for a file over its limit wraps.
var ErrTooLarge = errors.New("fileread: file too large")

// tooLargeError is a file over its limit; its text names both.
type tooLargeError struct {
	path  string
	limit int64
}

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("%s is over %d bytes", e.path, e.limit)
}

func (e *tooLargeError) Unwrap() error { return ErrTooLarge }

// AtMost returns the contents of the file at path, which may hold at most
// limit bytes. A larger file is an error wrapping ErrTooLarge whose text
// is "<path> is over <limit> bytes"; it reads no more than limit+1 bytes
// of it. A file that cannot be opened or read gives the *os.PathError,
// which names the path (errors.Is(err, fs.ErrNotExist) holds for a
// missing file).
func AtMost(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, &tooLargeError{path: path, limit: limit}
	}
	return data, nil
}
