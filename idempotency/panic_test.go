package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/idempotency"
)

// TestHeartbeatPanicGoesToTheHandlerFirst runs itself in a subprocess
// whose heartbeat's Renew panics: the handler sees the panic, then the
// panic goes on and ends the process, as it would without a handler.
func TestHeartbeatPanicGoesToTheHandlerFirst(t *testing.T) {
	if os.Getenv("IDEMPOTENCY_TEST_HEARTBEAT_PANIC") == "1" {
		st := hookStore{newMemory(t, nil), func(bool, error) { panic("renew panics") }}
		k := idempotency.New(st, idempotency.WithLockTTL(30*time.Millisecond),
			idempotency.WithPanicHandler(func(v any) { fmt.Printf("handler saw: %v\n", v) }))
		if _, _, err := k.Start(context.Background(), "k", "fp"); err != nil {
			t.Fatal(err)
		}
		<-time.After(10 * time.Second) // the heartbeat panics within 10ms and ends the process
		t.Fatal("the heartbeat did not panic")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHeartbeatPanicGoesToTheHandlerFirst$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMPOTENCY_TEST_HEARTBEAT_PANIC=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit = %v, want 2 (a panic); output:\n%s", err, out)
	}
	handler, crash := strings.Index(string(out), "handler saw: renew panics\n"), strings.Index(string(out), "panic: renew panics")
	if handler < 0 || crash < handler {
		t.Fatalf("want the handler's line, then the panic; output:\n%s", out)
	}
}
