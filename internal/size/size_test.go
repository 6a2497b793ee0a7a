package size

import "testing"

func TestParse(t *testing.T) {
	const max = 64 << 20
	tests := []struct {
		in   string
		want int64 // 0: an error
	}{
		{"1", 1},
		{"65536", 65536},
		{"512KiB", 512 << 10},
		{"1MiB", 1 << 20},
		{"64MiB", 64 << 20},
		{"65MiB", 0},
		{"1GiB", 0},
		{"67108865", 0},
		{"0", 0},
		{"", 0},
		{"MiB", 0},
		{"1 MiB", 0},
		{"1mib", 0},
		{"1MB", 0},
		{"1.5MiB", 0},
		{"-1", 0},
		{"+1", 0},
		{"99999999999999999999MiB", 0},
	}
	for _, tc := range tests {
		got, err := Parse(tc.in, max)
		if tc.want == 0 {
			if err == nil {
				t.Errorf("Parse(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %d, %v, want %d", tc.in, got, err, tc.want)
		}
	}
	if got, err := Parse("2GiB", 1<<40); err != nil || got != 2<<30 {
		t.Errorf("Parse(2GiB) = %d, %v", got, err)
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{1 << 20: "1MiB", 128 << 20: "128MiB", 2 << 30: "2GiB", 512 << 10: "512KiB", 1000: "1000", 1536 << 10: "1536KiB"} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
		if back, err := Parse(Format(n), 1<<40); err != nil || back != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, back, err)
		}
	}
}
