package main

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

func TestTuneGC(t *testing.T) {
	mem := memory.New()
	defer mem.Close()
	var other store.Store // any store but the memory store
	cases := []struct {
		name      string
		env       map[string]string
		st        store.Store
		maxBytes  int64
		wantGOGC  int
		wantLimit int64
	}{
		{"Redis or PostgreSQL", nil, other, 128 << 20, defaultGOGC, minMemoryLimit},
		{"memory store: twice its budget plus slack", nil, mem, 128 << 20, defaultGOGC, 2*128<<20 + memoryLimitSlack},
		{"small memory store: the floor", nil, mem, 1 << 20, defaultGOGC, minMemoryLimit},
		{"GOGC wins", map[string]string{"GOGC": "100"}, other, 0, 0, minMemoryLimit},
		{"GOMEMLIMIT wins", map[string]string{"GOMEMLIMIT": "1GiB"}, mem, 128 << 20, defaultGOGC, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			oldGOGC, oldLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
			defer func() { debug.SetGCPercent(oldGOGC); debug.SetMemoryLimit(oldLimit) }()
			gogc, limit := tuneGC(func(k string) string { return c.env[k] }, c.st, c.maxBytes)
			if gogc != c.wantGOGC || limit != c.wantLimit {
				t.Fatalf("tuneGC = %d, %d; want %d, %d", gogc, limit, c.wantGOGC, c.wantLimit)
			}
			wantPercent := c.wantGOGC
			if wantPercent == 0 {
				wantPercent = 100 // left as it was
			}
			if got := debug.SetGCPercent(100); got != wantPercent {
				t.Errorf("GOGC in force %d, want %d", got, wantPercent)
			}
			wantLimit := c.wantLimit
			if wantLimit == 0 {
				wantLimit = math.MaxInt64 // left as it was
			}
			if got := debug.SetMemoryLimit(-1); got != wantLimit {
				t.Errorf("memory limit in force %d, want %d", got, wantLimit)
			}
		})
	}
}
