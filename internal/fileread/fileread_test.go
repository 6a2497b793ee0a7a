package fileread_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/internal/fileread"
)

func TestAtMost(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, bytes.Repeat([]byte("x"), n), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const limit = 16
	for _, tc := range []struct {
		name    string
		path    string
		want    int    // bytes returned
		wantIs  error  // nil: no error
		wantMsg string // in the error's text
	}{
		{"a file under the limit is read whole", write("under", limit-1), limit - 1, nil, ""},
		{"a file of exactly the limit is read whole", write("exact", limit), limit, nil, ""},
		{"an empty file is empty", write("empty", 0), 0, nil, ""},
		{"a file one byte over the limit is refused, naming the file and the limit", write("over", limit+1), 0,
			fileread.ErrTooLarge, filepath.Join(dir, "over") + " is over 16 bytes"},
		{"a much larger file is refused", write("huge", 100*limit), 0, fileread.ErrTooLarge, " is over 16 bytes"},
		{"a missing file is the open error, naming the file", filepath.Join(dir, "missing"), 0,
			fs.ErrNotExist, "open " + filepath.Join(dir, "missing") + ": "},
		{"a directory is the read error, naming it", dir, 0, nil, "read " + dir + ": "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := fileread.AtMost(tc.path, limit)
			switch {
			case tc.wantMsg == "" && err != nil:
				t.Fatalf("AtMost = %v", err)
			case tc.wantMsg != "" && (err == nil || !strings.Contains(err.Error(), tc.wantMsg)):
				t.Fatalf("AtMost error = %v, want one containing %q", err, tc.wantMsg)
			case tc.wantIs != nil && !errors.Is(err, tc.wantIs):
				t.Fatalf("AtMost error = %v, want errors.Is %v", err, tc.wantIs)
			case tc.wantIs != fileread.ErrTooLarge && errors.Is(err, fileread.ErrTooLarge):
				t.Fatalf("AtMost error = %v wraps ErrTooLarge", err)
			}
			if len(data) != tc.want {
				t.Fatalf("AtMost read %d bytes, want %d", len(data), tc.want)
			}
		})
	}
}
