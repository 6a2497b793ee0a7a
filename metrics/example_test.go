package metrics_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
)

// Example times every store call and serves the collectors.
func Example() {
	m := metrics.New()
	st := m.Instrument(memory.New())
	defer st.Close()
	_, _ = st.Put(context.Background(), "42", store.Token{Purpose: "checkout"}, time.Minute)
	m.Issued()

	w := httptest.NewRecorder()
	promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(w.Body.String(), "\n") {
		if strings.HasPrefix(line, "replayguard_tokens_issued_total") || strings.HasPrefix(line, `replayguard_store_duration_seconds_count{op="put"}`) {
			fmt.Println(line)
		}
	}
	// Output:
	// replayguard_store_duration_seconds_count{op="put"} 1
	// replayguard_tokens_issued_total 1
}
