package gateway_test

import (
	"cmp"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
)

// Example puts a gateway in front of an app that knows nothing of
// Replayguard: a retried POST /orders with the same Idempotency-Key gets
// the first answer again, and the app creates one order.
func Example() {
	var orders atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", orders.Add(1))
	}))
	defer app.Close()

	routes, err := gateway.ParseRoutes([]byte(`
routes:
  - match: "POST /orders"
    policy: idempotency_key
`)) // or gateway.LoadRoutes("routes.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	st := memory.New() // or a store/redis or store/postgres Store, shared by every instance
	defer st.Close()
	upstream, _ := url.Parse(app.URL)
	gw, err := gateway.New(upstream, routes, gateway.WithKeeper(idempotency.New(st)))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(gw) // http.ListenAndServe(":8080", gw)
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", `"order-7"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", cmp.Or(resp.Header.Get(idempotency.ReplayedHeader), "no"))
	}
	fmt.Println("orders created:", orders.Load())
	// Output:
	// 201 order 1 replayed: no
	// 201 order 1 replayed: true
	// orders created: 1
}
