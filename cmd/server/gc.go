package main

import (
	"runtime/debug"

	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// Garbage collector settings the server uses when the environment sets
// none (GOGC and GOMEMLIMIT, which the Go runtime reads itself, win).
const (
	// defaultGOGC lets the heap grow to five times what is live between
	// collections instead of twice. A request's garbage dies with it,
	// while what stays live (connections, and the memory store's
	// entries) is small next to the budget below, so collections come
	// four times less often at little cost in memory.
	defaultGOGC = 400
	// minMemoryLimit is the soft memory limit on Redis and PostgreSQL:
	// the heap may grow past it only if that much is live, and the
	// collector runs more often as the heap nears it.
	minMemoryLimit = 256 << 20
	// memoryLimitSlack is added to twice the memory store's byte budget.
	memoryLimitSlack = 64 << 20
)

// tuneGC sets the collector's pace and a soft memory limit unless GOGC
// or GOMEMLIMIT says otherwise, and returns what it set (0 for what the
// environment set). On the memory store the limit is twice its byte
// budget plus 64 MiB, the memory the README asks to give the process:
// once the store is full the heap grows no larger than with Go's default
// GOGC=100, and until then collections are rarer.
func tuneGC(getenv func(string) string, st store.Store, memoryMaxBytes int64) (gogc int, limit int64) {
	if getenv("GOGC") == "" {
		gogc = defaultGOGC
		debug.SetGCPercent(gogc)
	}
	if getenv("GOMEMLIMIT") == "" {
		limit = minMemoryLimit
		if _, ok := st.(*memory.Store); ok {
			limit = max(limit, 2*memoryMaxBytes+memoryLimitSlack)
		}
		debug.SetMemoryLimit(limit)
	}
	return gogc, limit
}
