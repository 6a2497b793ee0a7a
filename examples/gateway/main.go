// Command gateway is a small shop that knows nothing of Replayguard: no
// import, no token code. Replayguard's standalone server runs in front of
// it in gateway mode and applies the policies of routes.yaml, so that a
// double submit places one order:
//
//   - POST /orders (a JSON API) runs once per Idempotency-Key; a retry
//     gets the stored 201 with Idempotent-Replayed: true;
//   - POST /checkout (the form on /, which fetches a token with the SDK
//     Replayguard serves at /sdk/replayguard.js) runs once per token; a
//     resubmission gets the same 303 to /orders/<n>;
//   - POST /feedback (a plain form) collapses identical double submits
//     inside a short window.
//
// Run the app, then Replayguard in front of it, from the repository root:
//
//	go run ./examples/gateway
//	REPLAYGUARD_UPSTREAM=http://127.0.0.1:8081 REPLAYGUARD_ROUTES=examples/gateway/routes.yaml go run ./cmd/server
//
// and open http://127.0.0.1:8080/ (Replayguard, not the app). Or with
// curl, each line twice (-i shows Idempotent-Replayed: true the second
// time):
//
//	curl -i localhost:8080/orders -H 'Idempotency-Key: "order-1"' -H 'Content-Type: application/json' -d '{"item":"tea"}'
//	TOKEN=$(curl -s -X POST 'localhost:8080/v1/tokens?purpose=checkout' | jq -r .token)
//	curl -i localhost:8080/checkout -d "idempotency_token=$TOKEN&item=tea"
//	curl -i localhost:8080/feedback -d 'text=great+tea'
//
// The app listens on the loopback interface only and trusts the
// Replayguard-Token-Id header, which only the gateway can set: POST
// /checkout without it (straight to the app) is refused.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"html/template"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// maxBody bounds request bodies.
const maxBody = 64 << 10

var pages = template.Must(template.New("pages").Parse(`
{{define "home"}}<!doctype html>
<title>Shop</title>
<h1>Shop</h1>
<form method="post" action="/checkout" data-replayguard="checkout">
  <input name="item" required placeholder="Item">
  <button data-disable-with="Placing order…">Order</button>
</form>
<h2>Orders</h2>
<ul>{{range .Orders}}<li><a href="/orders/{{.ID}}">Order {{.ID}}</a>: {{.Item}}</li>{{else}}<li>No orders yet.</li>{{end}}</ul>
<h2>Feedback</h2>
<form method="post" action="/feedback">
  <input name="text" required>
  <button>Send</button>
</form>
<script src="/sdk/replayguard.js" defer></script>
{{end}}
{{define "order"}}<!doctype html>
<title>Order {{.ID}}</title>
<p>Order {{.ID}}: {{.Item}}.</p>
<p><a href="/">Back to the shop</a></p>
{{end}}`))

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "listen address (keep it private: only Replayguard should reach the app)")
	flag.Parse()
	srv := &http.Server{Addr: *addr, Handler: newApp().routes(), ReadHeaderTimeout: 5 * time.Second}
	log.Printf("gateway example: the app listens on http://%s/; open it through Replayguard", *addr)
	if err := srv.ListenAndServe(); err != nil {
		log.Print(err)
	}
}

// order is one placed order.
type order struct {
	ID   int    `json:"id"`
	Item string `json:"item"`
}

// app is the shop: its orders and the feedback messages received.
type app struct {
	mu       sync.Mutex
	orders   []order
	feedback []string
}

func newApp() *app { return &app{} }

func (a *app) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", a.home)
	mux.HandleFunc("POST /orders", a.createOrder)
	mux.HandleFunc("POST /checkout", a.checkout)
	mux.HandleFunc("GET /orders/{id}", a.showOrder)
	mux.HandleFunc("POST /feedback", a.sendFeedback)
	return mux
}

// place records an order and returns it.
func (a *app) place(item string) order {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := order{ID: len(a.orders) + 1, Item: item}
	a.orders = append(a.orders, o)
	return o
}

// placed returns the orders placed so far.
func (a *app) placed() []order {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]order(nil), a.orders...)
}

func (a *app) home(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_ = pages.ExecuteTemplate(w, "home", map[string]any{"Orders": a.placed()})
}

// createOrder is the JSON API: {"item": "..."} → 201 with the order.
func (a *app) createOrder(w http.ResponseWriter, r *http.Request) {
	var body struct{ Item string }
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&body); err != nil || body.Item == "" {
		http.Error(w, `want a JSON body such as {"item": "tea"}`, http.StatusBadRequest)
		return
	}
	o := a.place(body.Item)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", o.ID))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(o)
}

// checkout is the form's target: it places the order and sends the
// browser to it with 303 See Other, so Reload cannot post the form again.
func (a *app) checkout(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Replayguard-Token-Id") == "" {
		// Not redeemed by Replayguard: the request did not come through it.
		http.Error(w, "checkout goes through Replayguard", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	item := r.PostFormValue("item")
	if item == "" {
		http.Error(w, "the form needs an item", http.StatusBadRequest)
		return
	}
	o := a.place(item)
	http.Redirect(w, r, fmt.Sprintf("/orders/%d", o.ID), http.StatusSeeOther)
}

func (a *app) showOrder(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(r.PathValue("id"))
	orders := a.placed()
	if err != nil || id < 1 || id > len(orders) {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = pages.ExecuteTemplate(w, "order", orders[id-1])
}

func (a *app) sendFeedback(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	text := r.PostFormValue("text")
	if text == "" {
		http.Error(w, "the form needs a text", http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	a.feedback = append(a.feedback, text)
	n := len(a.feedback)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "thanks for message %d\n", n)
}

// received returns the number of feedback messages received.
func (a *app) received() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.feedback)
}
