package main

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/replayguard/replayguard/internal/logjson"
)

// logPanic returns the panic handler of the server's goroutines: it logs
// the panic with its stack as one "panic" line and flushes logs, so that
// the lines of the last interval and the panic's are written before the
// process ends. It does not stop the panic: see repanic.
func logPanic(log *slog.Logger, logs *logjson.Writer) func(v any) {
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
