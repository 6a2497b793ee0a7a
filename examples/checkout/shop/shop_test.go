package shop_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/examples/checkout/shop"
	"github.com/replayguard/replayguard/web/sdk"
)

func init() { gin.SetMode(gin.TestMode) }

func newShop(t *testing.T, opts shop.Options) *shop.App {
	t.Helper()
	app, err := shop.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = app.Close() })
	return app
}

func get(app http.Handler, path string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	app.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	return w
}

// post sends form to POST /orders, the token in the form field or, when
// header is set, in the Idempotency-Token header as ReplayGuard.submit
// sends it.
func post(app http.Handler, form url.Values, header string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if header != "" {
		req.Header.Set("Idempotency-Token", header)
	}
	w := httptest.NewRecorder()
	app.ServeHTTP(w, req)
	return w
}

var hiddenToken = regexp.MustCompile(`name="idempotency_token" value="([^"]+)"`)

// formToken renders the order form and returns its server-rendered token.
func formToken(t *testing.T, app http.Handler) string {
	t.Helper()
	w := get(app, "/")
	m := hiddenToken.FindStringSubmatch(w.Body.String())
	if w.Code != http.StatusOK || m == nil {
		t.Fatalf("GET / = %d without a token field; body: %s", w.Code, w.Body)
	}
	return m[1]
}

func order(tok, shipping string) url.Values {
	return url.Values{"idempotency_token": {tok}, "name": {"Ada"}, "item": {"beans"}, "quantity": {"2"}, "shipping": {shipping}}
}

func TestFormPages(t *testing.T) {
	cases := []struct {
		name, path string
		opts       shop.Options
		want       []string
		wantNot    []string
	}{
		{"order form with a server-rendered token and the SDK", "/", shop.Options{}, []string{
			`<form method="post" action="/orders" id="order" data-replayguard="checkout"`,
			`name="idempotency_token" value="ey`,
			`<label for="order-name">`, `<label for="order-item">`, `<label for="order-quantity">`,
			`name="shipping" value="standard" data-disable-with="Placing order…"`,
			`name="shipping" value="express" class="secondary" data-disable-with="Placing order…"`,
			// html/template writes the hash's "+" as "&#43;" in the attribute.
			`<script src="/sdk/replayguard.js" integrity="` + strings.ReplaceAll(sdk.SRI, "+", "&#43;") + `" crossorigin="anonymous" defer></script>`,
		}, nil},
		{"fetch demo sends the form with ReplayGuard.submit", "/fetch-demo", shop.Options{}, []string{
			`id="fetch-order" data-replayguard="checkout"`, `name="idempotency_token"`,
			`window.ReplayGuard.submit(form, e.submitter)`,
		}, nil},
		{"without a server-rendered token the SDK fetches one", "/", shop.Options{NoServerToken: true},
			[]string{`data-replayguard="checkout"`}, []string{`name="idempotency_token"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := get(newShop(t, c.opts), c.path)
			body := w.Body.String()
			if w.Code != http.StatusOK {
				t.Fatalf("GET %s = %d", c.path, w.Code)
			}
			if got := w.Header().Get("Cache-Control"); got != "private, no-cache" {
				t.Errorf("Cache-Control = %q, want private, no-cache", got)
			}
			for _, s := range c.want {
				if !strings.Contains(body, s) {
					t.Errorf("page lacks %s", s)
				}
			}
			for _, s := range c.wantNot {
				if strings.Contains(body, s) {
					t.Errorf("page has %s", s)
				}
			}
		})
	}
}

func TestOrders(t *testing.T) {
	app := newShop(t, shop.Options{})
	first, second := formToken(t, app), formToken(t, app)
	mistake := order(second, "express")
	mistake.Set("quantity", "0")

	steps := []struct {
		name         string
		form         url.Values
		header       string // token in the Idempotency-Token header
		wantCode     int
		wantLocation string
		wantBody     string
	}{
		{"an order is placed and answered with 303 to its page", order(first, "standard"), "", http.StatusSeeOther, "/orders/1", ""},
		{"the same form sent again places nothing", order(first, "standard"), "", http.StatusConflict, "", `This order was already placed`},
		{"the refusal links to the order the form placed", order(first, "express"), "", http.StatusConflict, "", `<a href="/orders/1">See order #1</a>`},
		{"a form without a token must be reloaded", order("", "standard"), "", http.StatusBadRequest, "", `Please reload the form`},
		{"a forged token must be reloaded", order("x.y.z", "standard"), "", http.StatusUnauthorized, "", `Please reload the form`},
		{"a mistake is answered with 422 before the token is spent", mistake, "", http.StatusUnprocessableEntity, "", `Choose a quantity from 1 to 10.`},
		{"so the corrected form still places its order, token in the header", order("", "express"), second, http.StatusSeeOther, "/orders/2", ""},
		{"an unknown shipping choice is a mistake", order(formToken(t, app), "pigeon"), "", http.StatusUnprocessableEntity, "", `Choose standard or express shipping.`},
	}
	for _, s := range steps {
		w := post(app, s.form, s.header)
		if w.Code != s.wantCode || w.Header().Get("Location") != s.wantLocation || !strings.Contains(w.Body.String(), s.wantBody) {
			t.Errorf("%s: got %d Location %q, want %d Location %q with %q; body: %s",
				s.name, w.Code, w.Header().Get("Location"), s.wantCode, s.wantLocation, s.wantBody, w.Body)
		}
	}
	if w := post(app, mistake, ""); !strings.Contains(w.Body.String(), `value="`+second+`"`) {
		t.Errorf("the form sent back after a mistake does not keep its token; body: %s", w.Body)
	}

	pages := []struct{ path, want string }{
		{"/orders/1", `<dd id="shipping">standard</dd>`},
		{"/orders/2", `<dd id="shipping">express</dd>`},
		{"/orders", `2 orders placed.`},
	}
	for _, p := range pages {
		if w := get(app, p.path); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), p.want) {
			t.Errorf("GET %s = %d, want 200 with %s; body: %s", p.path, w.Code, p.want, w.Body)
		}
	}
	for _, path := range []string{"/orders/3", "/orders/0", "/orders/x", "/nowhere"} {
		if w := get(app, path); w.Code != http.StatusNotFound {
			t.Errorf("GET %s = %d, want 404", path, w.Code)
		}
	}

	w := get(app, "/stats")
	var stats shop.Stats
	if err := json.Unmarshal(w.Body.Bytes(), &stats); err != nil {
		t.Fatalf("GET /stats: %v; body: %s", err, w.Body)
	}
	if want := (shop.Stats{Orders: 2, Posts: len(steps) + 1}); stats != want {
		t.Errorf("GET /stats = %+v, want %+v", stats, want)
	}
}

func TestTokenRequestsAreCounted(t *testing.T) {
	app := newShop(t, shop.Options{})
	req := httptest.NewRequest(http.MethodPost, "/v1/tokens", strings.NewReader(`{"purpose":"checkout"}`))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	app.ServeHTTP(w, req)
	if w.Code != http.StatusCreated {
		t.Fatalf("POST /v1/tokens = %d; body: %s", w.Code, w.Body)
	}
	if w := get(app, "/sdk/replayguard.js"); w.Code != http.StatusOK {
		t.Errorf("GET /sdk/replayguard.js = %d", w.Code)
	}
	if got := app.Stats().TokenRequests; got != 1 {
		t.Errorf("TokenRequests = %d, want 1", got)
	}
}

func TestHoldDelaysTheOrder(t *testing.T) {
	held := make(chan struct{})
	release := make(chan struct{})
	app := newShop(t, shop.Options{Hold: func(ctx context.Context) {
		close(held)
		<-release
	}})
	tok := formToken(t, app)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- post(app, order(tok, "standard"), "") }()

	<-held
	if got := app.Stats(); got.Posts != 1 || got.Orders != 0 {
		t.Errorf("while held: %+v, want 1 POST and no order yet", got)
	}
	close(release)
	if w := <-done; w.Code != http.StatusSeeOther {
		t.Errorf("POST /orders = %d, want 303", w.Code)
	}
	if got := app.Stats().Orders; got != 1 {
		t.Errorf("after release: %d orders, want 1", got)
	}
}

var exportToken = regexp.MustCompile(`<form method="post" action="/exports" id="export" data-replayguard="export">\s*<input type="hidden" name="idempotency_token" value="([^"]+)"`)

func TestExports(t *testing.T) {
	app := newShop(t, shop.Options{})
	if w := post(app, order(formToken(t, app), "express"), ""); w.Code != http.StatusSeeOther {
		t.Fatalf("placing an order: %d", w.Code)
	}
	page := get(app, "/orders")
	m := exportToken.FindStringSubmatch(page.Body.String())
	if page.Code != http.StatusOK || m == nil {
		t.Fatalf("GET /orders = %d without an export form and its token; body: %s", page.Code, page.Body)
	}
	for _, s := range []string{
		`name="format" value="csv" class="secondary" data-replayguard-download`,
		`name="format" value="html" class="secondary" formtarget="_blank"`,
		`<script src="/sdk/replayguard.js"`,
	} {
		if !strings.Contains(page.Body.String(), s) {
			t.Errorf("GET /orders lacks %s", s)
		}
	}
	if got := page.Header().Get("Cache-Control"); got != "private, no-cache" {
		t.Errorf("GET /orders: Cache-Control = %q, want private, no-cache", got)
	}
	csvToken, printToken := m[1], exportToken.FindStringSubmatch(get(app, "/orders").Body.String())[1]

	export := func(tok, format string) *httptest.ResponseRecorder {
		form := url.Values{"idempotency_token": {tok}, "format": {format}}
		req := httptest.NewRequest(http.MethodPost, "/exports", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		app.ServeHTTP(w, req)
		return w
	}
	steps := []struct {
		name, tok, format string
		wantCode          int
		wantDisposition   string
		wantBody          string
	}{
		{"csv is a download", csvToken, "csv", http.StatusOK, `attachment; filename="orders.csv"`,
			"id,name,item,quantity,shipping,total\n1,Ada,\"Espresso beans, 1 kg\",2,express,53\n"},
		{"html is a page to print", printToken, "html", http.StatusOK, "", `<h1>Orders to print</h1>`},
		{"a token exports once", csvToken, "csv", http.StatusConflict, "", `This export was already sent`},
		{"an order's token does not export", formToken(t, app), "csv", http.StatusForbidden, "", `Please reload the form`},
	}
	for _, s := range steps {
		w := export(s.tok, s.format)
		if w.Code != s.wantCode || w.Header().Get("Content-Disposition") != s.wantDisposition || !strings.Contains(w.Body.String(), s.wantBody) {
			t.Errorf("%s: got %d Content-Disposition %q, want %d %q with %q; body: %s",
				s.name, w.Code, w.Header().Get("Content-Disposition"), s.wantCode, s.wantDisposition, s.wantBody, w.Body)
		}
	}
	if got, want := app.Stats(), (shop.Stats{Orders: 1, Posts: 1, ExportPosts: len(steps), Exports: 2}); got != want {
		t.Errorf("Stats = %+v, want %+v", got, want)
	}
}
