// Package size reads and writes the byte sizes of configuration values:
// a number of bytes, or one with a KiB, MiB or GiB suffix.
package size

import (
	"fmt"
	"strconv"
	"strings"
)

var units = []struct {
	suffix string
	n      int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// Parse reads s, a number of bytes (1048576) or one with a KiB, MiB or
// GiB suffix (1MiB), from 1 byte to max.
func Parse(s string, max int64) (int64, error) {
	bad := fmt.Errorf("%q is not a size: want bytes (1048576) or a KiB, MiB or GiB suffix (1MiB), from 1 byte to %s", s, Format(max))
	digits, unit := s, int64(1)
	for _, u := range units {
		if d, ok := strings.CutSuffix(s, u.suffix); ok {
			digits, unit = d, u.n
			break
		}
	}
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, bad
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n < 1 || n > max/unit {
		return 0, bad
	}
	return n * unit, nil
}

// Format writes n bytes in the largest unit that holds it whole: 1MiB,
// 512KiB, 1000.
func Format(n int64) string {
	for _, u := range units {
		if n >= u.n && n%u.n == 0 {
			return strconv.FormatInt(n/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}
