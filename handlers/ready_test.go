package handlers_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// TestReadyWithTheRecordsFull: a memory store whose records' half is full
// still serves tokens, nonces and replays, so GET /readyz stays 200 (it
// once answered 503 store_full, taking every instance out of the load
// balancer) and says so as a warning; once tokens no longer fit, it is
// 503 store_full.
func TestReadyWithTheRecordsFull(t *testing.T) {
	ctx := context.Background()
	st := memory.New(memory.WithMaxEntries(10)) // records: 5
	t.Cleanup(func() { _ = st.Close() })
	e, err := handlers.New(newTokenService(t, st), quietLogs, handlers.WithUsage(st)).Engine()
	if err != nil {
		t.Fatal(err)
	}
	ready := func() (int, string) {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		b, _ := io.ReadAll(w.Body)
		return w.Code, string(b)
	}
	if code, body := ready(); code != http.StatusOK || body != `{"status":"ready"}` {
		t.Fatalf("readyz = %d %s, want 200 ready", code, body)
	}
	for i := 0; ; i++ {
		if _, _, err := st.Acquire(ctx, strconv.Itoa(i), "fp", "o", time.Hour); errors.Is(err, store.ErrFull) {
			break
		} else if err != nil || i > 10 {
			t.Fatalf("acquire %d: %v", i, err)
		}
	}
	if code, body := ready(); code != http.StatusOK || body != `{"status":"ready","warnings":["records_full"]}` {
		t.Fatalf("readyz with the records full = %d %s, want 200 with the warning records_full", code, body)
	}
	for i := 0; ; i++ {
		if _, err := st.Put(ctx, "t"+strconv.Itoa(i), store.Token{Purpose: "p"}, time.Hour); errors.Is(err, store.ErrFull) {
			break
		} else if err != nil || i > 10 {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	if code, body := ready(); code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"store_full"`) {
		t.Fatalf("readyz with tokens refused = %d %s, want 503 store_full", code, body)
	}
}
