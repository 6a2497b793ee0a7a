// Package shop is the checkout example's application: a small Gin shop
// whose order form is protected by the Replayguard browser SDK and by
// Guard.RequireToken, answering a placed order with 303 See Other to the
// order's page (Post-Redirect-Get). It lives in its own package so that the
// browser tests in test/browser can run it in-process; command checkout
// (the parent directory) serves it.
//
// Routes:
//
//	GET  /               the order form, with a server-rendered token (works without JavaScript)
//	GET  /fetch-demo     the same form, sent with ReplayGuard.submit (fetch)
//	POST /orders         places an order; 303 to /orders/{id}
//	GET  /orders         the orders placed, and a form that exports them
//	GET  /orders/{id}    one order
//	POST /exports        the orders as a CSV download (format=csv) or a page to print (format=html)
//	GET  /stats          {"orders":N,"posts":M,"token_requests":K}, for tests
//	POST /v1/tokens, POST /v1/tokens/redeem and GET /sdk/*: the token API and the SDK
package shop

import (
	"context"
	"embed"
	"encoding/csv"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/web/sdk"
)

// Purpose is what the order form's tokens are issued and redeemed for.
const Purpose = "checkout"

// ExportPurpose is what the export form's tokens are issued and redeemed
// for.
const ExportPurpose = "export"

// MaxQuantity is the most items one order may ask for.
const MaxQuantity = 10

// Form ids: the order form on / and on /fetch-demo.
const (
	FormID      = "order"
	FetchFormID = "fetch-order"
)

// ExportFormID is the id of the export form on /orders. Its buttons
// submit without leaving the page: "Download CSV" (format=csv, marked
// data-replayguard-download) answers with an attachment, and "Print"
// (format=html, formtarget="_blank") opens the list in a new tab.
const ExportFormID = "export"

// exportsPath is where the export form posts.
const exportsPath = "/exports"

//go:embed pages.html
var pageFiles embed.FS

var pages = template.Must(template.ParseFS(pageFiles, "pages.html"))

// Product is an item the shop sells.
type Product struct {
	SKU, Name string
	Price     int // euros
}

// Catalog lists what the shop sells, in the form's order.
var Catalog = []Product{
	{"beans", "Espresso beans, 1 kg", 24},
	{"kettle", "Pour-over kettle", 49},
	{"mug", "Ceramic mug", 12},
}

// expressSurcharge is what express shipping adds to an order, in euros.
const expressSurcharge = 5

// Order is a placed order.
type Order struct {
	ID       int
	Name     string
	SKU      string
	ItemName string
	Quantity int
	// Shipping is the value of the submit button that placed the order:
	// "standard" or "express".
	Shipping string
	Total    int
	Placed   time.Time
	// TokenID is the jti of the token that placed the order.
	TokenID string
}

// Stats counts what the shop received, for tests: a duplicate submission
// shows up as a POST that placed no order.
type Stats struct {
	// Orders is the number of orders placed.
	Orders int `json:"orders"`
	// Posts is the number of POST /orders requests received, refused or not.
	Posts int `json:"posts"`
	// TokenRequests is the number of POST /v1/tokens requests received.
	TokenRequests int `json:"token_requests"`
	// ExportPosts is the number of POST /exports requests answered,
	// refused or not. It counts a request once its answer is written (to
	// the server's buffer), so a test that sees it has seen Exports too.
	ExportPosts int `json:"export_posts"`
	// Exports is the number of exports answered: one per token.
	Exports int `json:"exports"`
}

// Options configure the shop. The zero value is a working shop.
type Options struct {
	// Delay holds every accepted order for this long before it is placed,
	// as a slow payment provider would, so that a person trying the demo
	// can click again while the first POST is under way. Defaults to 0.
	Delay time.Duration
	// Hold, when set, is called before each accepted order is placed, and
	// the order waits until it returns: tests use it to act while a
	// submission is under way. ctx ends when the client goes away.
	// Defaults to nil.
	Hold func(ctx context.Context)
	// FormCacheControl is the Cache-Control header of the pages with the
	// order form. Defaults to "private, no-cache": every visit and Reload
	// gets a new form, while Back shows the form that was left, token and
	// all, from the back/forward cache or the HTTP cache. "no-store" makes
	// Back fetch a new form (and keeps the page out of Chrome's
	// back/forward cache), so the SDK's own memory of the form's token is
	// what recognises a resubmission.
	FormCacheControl string
	// NoServerToken renders the order forms without a token, leaving it to
	// the browser SDK to fetch one; without JavaScript they are then
	// refused. Defaults to false: the server renders one, so the forms work
	// without JavaScript.
	NoServerToken bool
	// SigningKeys is a REPLAYGUARD_SIGNING_KEYS value ("kid:base64,...").
	// Defaults to a random key, so tokens die with the process.
	SigningKeys string
}

// App is the shop. Create it with New; it is an http.Handler and safe for
// concurrent use. Close releases its store.
type App struct {
	handler http.Handler
	store   *memory.Store
	tokens  *token.Service
	refused guard.Option // the error page
	delay   time.Duration
	hold    func(context.Context)
	formCC  string
	noField bool

	mu      sync.Mutex
	orders  []Order
	byToken map[string]int // token ID -> order ID
	stats   Stats
}

// New returns a shop over an embedded memory store.
func New(opts Options) (*App, error) {
	keys, err := signingKeys(opts.SigningKeys)
	if err != nil {
		return nil, err
	}
	st := memory.New()
	svc, err := token.New(st, keys, token.WithMachineID(1))
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	a := &App{store: st, tokens: svc, delay: opts.Delay, hold: opts.Hold, formCC: opts.FormCacheControl, noField: opts.NoServerToken, byToken: map[string]int{}}
	if a.formCC == "" {
		a.formCC = "private, no-cache"
	}
	a.refused = guard.WithErrorHandler(http.HandlerFunc(a.refusedPage))
	a.handler = a.routes()
	return a, nil
}

func signingKeys(spec string) ([]token.Key, error) {
	if spec != "" {
		return token.ParseKeys(spec)
	}
	k, err := token.GenerateKey()
	if err != nil {
		return nil, err
	}
	return []token.Key{k}, nil
}

// ServeHTTP serves the shop.
func (a *App) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.handler.ServeHTTP(w, r) }

// Close stops the store's janitor.
func (a *App) Close() error { return a.store.Close() }

// Stats returns the counters so far.
func (a *App) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// Orders returns the orders placed so far, oldest first.
func (a *App) Orders() []Order {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Order(nil), a.orders...)
}

func (a *App) routes() http.Handler {
	r := gin.New()
	r.Use(gin.Recovery())
	r.SetHTMLTemplate(pages)

	// The token API and the SDK, counting token requests on the way.
	api := r.Group("", func(c *gin.Context) {
		if c.Request.Method == http.MethodPost && c.Request.URL.Path == "/v1/tokens" {
			a.count(func(s *Stats) { s.TokenRequests++ })
		}
	})
	handlers.Mount(api, a.tokens, handlers.WithIssueRate(a.store, handlers.DefaultIssueRate))

	r.GET("/", func(c *gin.Context) { a.form(c, http.StatusOK, "form", formData{FormID: FormID}) })
	r.GET("/fetch-demo", func(c *gin.Context) { a.form(c, http.StatusOK, "fetchform", formData{FormID: FetchFormID}) })
	// Checks run before the token is redeemed, so a mistake in the form
	// does not spend it: the form comes back with the same token.
	r.POST("/orders", func(c *gin.Context) {
		a.count(func(s *Stats) { s.Posts++ })
	}, a.check, guard.Gin(guard.RequireToken(a.tokens, Purpose, a.refused)), a.place)
	r.GET("/orders", a.ordersPage)
	r.POST(exportsPath, func(c *gin.Context) {
		c.Next()
		a.count(func(s *Stats) { s.ExportPosts++ })
	}, guard.Gin(guard.RequireToken(a.tokens, ExportPurpose, a.refused)), a.export)
	r.GET("/orders/:id", a.show)
	r.GET("/stats", func(c *gin.Context) {
		c.Header("Cache-Control", "no-store")
		c.JSON(http.StatusOK, a.Stats())
	})
	r.NoRoute(func(c *gin.Context) { c.HTML(http.StatusNotFound, "notfound", nil) })
	return r
}

func (a *App) count(f func(*Stats)) {
	a.mu.Lock()
	f(&a.stats)
	a.mu.Unlock()
}

// ordersData fills the "orders" template.
type ordersData struct {
	Orders []Order
	Field  template.HTML // the export form's token
	SRI    string
}

// ordersPage lists the orders, with an export form that carries a fresh
// token (unless Options.NoServerToken).
func (a *App) ordersPage(c *gin.Context) {
	d := ordersData{Orders: a.Orders(), SRI: sdk.SRI}
	if !a.noField {
		field, err := guard.Field(c.Request, a.tokens, ExportPurpose)
		if err != nil {
			problem.Write(c.Writer, err)
			return
		}
		d.Field = field
	}
	c.Header("Cache-Control", a.formCC)
	c.HTML(http.StatusOK, "orders", d)
}

// export answers an export request, once per token (RequireToken has
// redeemed it): format=csv downloads the orders as orders.csv, anything
// else shows them on a page to print.
func (a *App) export(c *gin.Context) {
	orders := a.Orders()
	a.count(func(s *Stats) { s.Exports++ })
	c.Header("Cache-Control", "no-store")
	if c.PostForm("format") != "csv" {
		c.HTML(http.StatusOK, "print", orders)
		return
	}
	c.Header("Content-Disposition", `attachment; filename="orders.csv"`)
	c.Header("Content-Type", "text/csv; charset=utf-8")
	w := csv.NewWriter(c.Writer)
	_ = w.Write([]string{"id", "name", "item", "quantity", "shipping", "total"})
	for _, o := range orders {
		_ = w.Write([]string{strconv.Itoa(o.ID), o.Name, o.ItemName, strconv.Itoa(o.Quantity), o.Shipping, strconv.Itoa(o.Total)})
	}
	w.Flush()
}

// formData fills the "orderform" template.
type formData struct {
	FormID      string
	Field       template.HTML
	Problems    []string
	Name, Item  string
	Quantity    int
	Purpose     string
	Catalog     []Product
	MaxQuantity int
	SRI         string
}

// form renders a page with the order form and, unless d has one, a fresh
// token in it.
func (a *App) form(c *gin.Context, status int, page string, d formData) {
	if d.Field == "" && !a.noField {
		field, err := guard.Field(c.Request, a.tokens, Purpose)
		if err != nil {
			problem.Write(c.Writer, err) // store full or unavailable
			return
		}
		d.Field = field
	}
	d.Purpose, d.Catalog, d.MaxQuantity, d.SRI = Purpose, Catalog, MaxQuantity, sdk.SRI
	if d.Quantity == 0 {
		d.Quantity = 1
	}
	// See Options.FormCacheControl.
	c.Header("Cache-Control", a.formCC)
	c.HTML(status, page, d)
}

// check answers an order with mistakes with 422 and the form again,
// before its token is redeemed. The form keeps the token it was sent with,
// so it is still the same form: once it has placed an order, any copy of it
// is refused as a duplicate.
func (a *App) check(c *gin.Context) {
	o, problems := parseOrder(c)
	if len(problems) == 0 {
		c.Set(orderKey, o)
		return
	}
	c.Abort()
	var field template.HTML // empty: a fresh token
	if tok := requestToken(c.Request); tok != "" {
		if claims, err := a.tokens.Parse(tok); err == nil && claims.Purpose == Purpose {
			field = guard.HiddenField(tok)
		}
	}
	a.form(c, http.StatusUnprocessableEntity, "invalid", formData{
		FormID: FormID, Field: field, Problems: problems, Name: o.Name, Item: o.SKU, Quantity: o.Quantity,
	})
}

// orderKey holds the checked order in the Gin context.
const orderKey = "checkout.order"

// requestToken is the token a request carries, where Guard looks for it.
func requestToken(r *http.Request) string {
	if tok := r.Header.Get(token.Header); tok != "" {
		return tok
	}
	return r.PostFormValue(token.FormField)
}

// place runs once per token: RequireToken has redeemed it.
func (a *App) place(c *gin.Context) {
	claims, _ := guard.TokenFrom(c.Request.Context())
	o, ok := c.Value(orderKey).(Order)
	if !ok { // check did not run: a wiring bug
		problem.Write(c.Writer, problem.ErrInternal)
		return
	}
	if a.delay > 0 {
		select { // a slow payment provider
		case <-time.After(a.delay):
		case <-c.Request.Context().Done():
		}
	}
	if a.hold != nil {
		a.hold(c.Request.Context())
	}
	a.mu.Lock()
	o.ID = len(a.orders) + 1
	o.Placed = time.Now()
	o.TokenID = claims.ID
	a.orders = append(a.orders, o)
	a.byToken[claims.ID] = o.ID
	a.stats.Orders++
	a.mu.Unlock()
	guard.SeeOther(c.Writer, c.Request, "/orders/"+strconv.Itoa(o.ID))
}

// parseOrder reads and checks the posted order.
func parseOrder(c *gin.Context) (Order, []string) {
	o := Order{Name: strings.TrimSpace(c.PostForm("name")), SKU: c.PostForm("item"), Shipping: c.PostForm("shipping")}
	var problems []string
	if o.Name == "" || len(o.Name) > 100 {
		problems = append(problems, "Enter your name (at most 100 characters).")
	}
	var price int
	for _, p := range Catalog {
		if p.SKU == o.SKU {
			o.ItemName, price = p.Name, p.Price
		}
	}
	if o.ItemName == "" {
		problems = append(problems, "Choose an item from the list.")
	}
	q, err := strconv.Atoi(c.PostForm("quantity"))
	if err != nil || q < 1 || q > MaxQuantity {
		problems = append(problems, fmt.Sprintf("Choose a quantity from 1 to %d.", MaxQuantity))
	}
	o.Quantity = q
	// The clicked button's value; Enter in a field "clicks" the first one.
	switch o.Shipping {
	case "standard":
		o.Total = price * q
	case "express":
		o.Total = price*q + expressSurcharge
	default:
		problems = append(problems, "Choose standard or express shipping.")
	}
	return o, problems
}

func (a *App) show(c *gin.Context) {
	id, err := strconv.Atoi(c.Param("id"))
	a.mu.Lock()
	var o Order
	found := err == nil && id >= 1 && id <= len(a.orders)
	if found {
		o = a.orders[id-1]
	}
	a.mu.Unlock()
	if !found {
		c.HTML(http.StatusNotFound, "notfound", nil)
		return
	}
	c.HTML(http.StatusOK, "order", o)
}

// refusal fills the "refused" template.
type refusal struct {
	Title, Message, Again string
	Order                 int // the order the token placed, when known
}

// refusedPage renders the page for a submission RequireToken refused, with the
// problem's status: 409 for an order that was already placed, 400, 401 or
// 503 for a form that must be reloaded.
func (a *App) refusedPage(w http.ResponseWriter, r *http.Request) {
	reason := guard.FailureReason(r)
	p := refusal{Title: "Please reload the form", Again: "Reload the order form"}
	switch {
	case errors.Is(reason, token.ErrUsed) && r.URL.Path == exportsPath:
		p = refusal{
			Title:   "This export was already sent",
			Message: "This form was already sent once. Reload the list of orders to export it again.",
			Again:   "Place an order",
		}
	case errors.Is(reason, token.ErrUsed):
		p = refusal{
			Title:   "This order was already placed",
			Message: "This form was already sent, so it was not placed a second time. Nothing more was charged.",
			Again:   "Place another order",
			Order:   a.orderFor(r),
		}
	case errors.Is(reason, token.ErrExpired):
		p.Message = "This form has expired. Reload it and send it again; no order was placed."
	case errors.Is(reason, store.ErrUnavailable), errors.Is(reason, store.ErrFull):
		p.Message = "We could not check this form just now, so no order was placed. Try again in a moment."
	default:
		p.Message = "This form could not be accepted, so no order was placed. Reload it and send it again."
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(problem.For(reason).Status)
	_ = pages.ExecuteTemplate(w, "refused", p)
}

// orderFor finds the order placed with the request's (spent) token.
func (a *App) orderFor(r *http.Request) int {
	claims, err := a.tokens.Parse(requestToken(r))
	if err != nil {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.byToken[claims.ID]
}
