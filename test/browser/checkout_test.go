package browser

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/replayguard/replayguard/examples/checkout/shop"
)

// doubleClickGap is the time between the two clicks of a double click.
const doubleClickGap = 100 * time.Millisecond

// button is the selector of the submit button of form (shop.FormID or
// shop.FetchFormID) whose value is shipping.
func button(form, shipping string) string {
	return fmt.Sprintf("#%s button[value=%s]", form, shipping)
}

// recordEvents collects the SDK's events on the current page in
// window.__rg as {type, reason, status}.
func (f *fixture) recordEvents() {
	f.t.Helper()
	eval[chromedp.Void](f, `window.__rg = [];
		['token', 'submit-start', 'submit-end', 'error'].forEach(function (n) {
			document.addEventListener('replayguard:' + n, function (e) {
				window.__rg.push({type: n, reason: e.detail.reason || '', status: e.detail.status || 0});
			});
		})`)
}

// formState is what a user sees of a form's submit controls.
type formState struct {
	Busy     bool     `json:"busy"`     // aria-busy is set
	Disabled []bool   `json:"disabled"` // per submit button
	Labels   []string `json:"labels"`   // per submit button
	Token    string   `json:"token"`    // the hidden token's value
}

// formState reads the state of the form whose id is form.
func (f *fixture) formState(form string) formState {
	f.t.Helper()
	return eval[formState](f, fmt.Sprintf("(%s)(%q)", formStateJS, form))
}

// formStateJS is a JavaScript function of a form's id that returns its
// formState.
const formStateJS = `function (id) {
	var form = document.getElementById(id);
	var buttons = [].slice.call(form.querySelectorAll('button'));
	var tok = form.querySelector('input[name=idempotency_token]');
	return {
		busy: form.hasAttribute('aria-busy'),
		disabled: buttons.map(function (b) { return b.disabled; }),
		labels: buttons.map(function (b) { return b.textContent; }),
		token: tok ? tok.value : ''
	};
}`

// wantUsable checks that form's two order buttons are enabled, with their
// own labels, and that the form is not busy.
func (f *fixture) wantUsable(form string) {
	f.t.Helper()
	s := f.formState(form)
	want := []string{"Place order · standard", "Place order · express +€5"}
	if s.Busy || len(s.Disabled) < 2 || s.Disabled[0] || s.Disabled[1] || s.Labels[0] != want[0] || s.Labels[1] != want[1] {
		f.t.Errorf("form #%s is not usable: %+v; want enabled buttons labelled %q and no aria-busy", form, s, want)
	}
}

func TestDoubleClickPlacesOneOrder(t *testing.T) {
	cases := []struct {
		name, path, form string
		sdkToken         bool // the form has no server-rendered token: the SDK fetches one
		wantTokens       int  // token requests the shop receives
	}{
		{"form with a server-rendered token", "/", shop.FormID, false, 0},
		{"form whose token the SDK fetches", "/", shop.FormID, true, 1},
		{"form sent with ReplayGuard.submit", "/fetch-demo", shop.FetchFormID, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := shop.Options{NoServerToken: c.sdkToken}
			release := holdOrders(t, &opts)
			f := newFixture(t, opts)
			f.open(c.path, "#"+c.form)
			if got := eval[string](f, "typeof ReplayGuard"); got != "object" {
				t.Fatalf("typeof ReplayGuard = %q: the SDK did not load (integrity mismatch?)", got)
			}
			f.typeInto("#"+c.form+" input[name=name]", "Ada")

			f.clickTwice(button(c.form, "standard"), doubleClickGap)
			release()

			f.waitPage("/orders/1", "#shipping")
			f.wantStats(1, 1)
			if got := f.app.Stats().TokenRequests; got != c.wantTokens {
				t.Errorf("the SDK asked for %d tokens, want %d", got, c.wantTokens)
			}
		})
	}
}

func TestEnterPressedTenTimesPlacesOneOrder(t *testing.T) {
	var opts shop.Options
	release := holdOrders(t, &opts)
	f := newFixture(t, opts)
	f.open("/", "#order")
	f.typeInto("#order input[name=name]", "Ada")

	f.do(chromedp.KeyEvent(strings.Repeat("\r", 10))) // ten Enter presses, as fast as input goes
	release()

	f.waitPage("/orders/1", "#shipping")
	f.wantStats(1, 1)
	if got := f.text("#shipping"); got != "standard" {
		t.Errorf("shipping = %q, want standard (the default button's value)", got)
	}
}

func TestRequestSubmitAgainPlacesOneOrder(t *testing.T) {
	f := newFixture(t, shop.Options{})
	f.open("/", "#order")
	f.typeInto("#order input[name=name]", "Ada")

	// The second requestSubmit comes in a later task, once the SDK has
	// started the first submission.
	eval[chromedp.Void](f, `(function () {
		var form = document.getElementById('order');
		form.addEventListener('replayguard:submit-start', function () {
			setTimeout(function () { form.requestSubmit(); }, 0);
		}, {once: true});
		form.requestSubmit(form.querySelector('button[value=express]'));
	})()`)

	f.waitPage("/orders/1", "#shipping")
	f.wantStats(1, 1)
	if got := f.text("#shipping"); got != "express" {
		t.Errorf("shipping = %q, want express", got)
	}
}

func TestBackAfterOrderThenSubmitAgainPlacesNoSecondOrder(t *testing.T) {
	cases := []struct {
		name     string
		browser  *chromium
		cache    string // the form page's Cache-Control; "" for the shop's default
		sdkToken bool   // the form has no server-rendered token: the SDK fetches one
	}{
		{"back/forward cache, server-rendered token", chromiumBrowser, "", false},
		{"back/forward cache, token fetched by the SDK", chromiumBrowser, "", true},
		{"HTTP cache, server-rendered token", noBFCacheBrowser, "", false},
		{"HTTP cache, token fetched by the SDK", noBFCacheBrowser, "", true},
		{"page fetched again (no-store), server-rendered token", noBFCacheBrowser, "no-store", false},
		{"page fetched again (no-store), token fetched by the SDK", noBFCacheBrowser, "no-store", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixtureIn(t, c.browser, shop.Options{FormCacheControl: c.cache, NoServerToken: c.sdkToken})
			f.open("/", "#order")
			f.typeInto("#order input[name=name]", "Ada")
			f.click(button(shop.FormID, "express"))
			f.waitPage("/orders/1", "#shipping")

			f.back()
			f.waitPage("/", "#order")
			f.wantUsable(shop.FormID)
			f.click(button(shop.FormID, "express"))

			f.waitPage("/orders", "[data-message]")
			if got, want := f.text("h1"), "This order was already placed"; got != want {
				t.Errorf("page title = %q, want %q", got, want)
			}
			if got, want := f.text("main a[href='/orders/1']"), "See order #1"; got != want {
				t.Errorf("link = %q, want %q", got, want)
			}
			f.wantStats(2, 1)
		})
	}
}

func TestBackForwardCacheRestoreReenablesForm(t *testing.T) {
	f := newFixture(t, shop.Options{})
	bfcacheReasons := f.watchBFCache()
	f.recordPageshows()
	f.open("/", "#order")
	f.typeInto("#order input[name=name]", "Ada")
	before := f.formState(shop.FormID)
	// DevTools cannot look into a page whose form navigation is under way,
	// so the page notes its own form's state when it turns busy.
	eval[chromedp.Void](f, fmt.Sprintf(`new MutationObserver(function () {
		var s = (%s)('order');
		if (s.busy) sessionStorage.setItem('busy', JSON.stringify(s));
	}).observe(document.getElementById('order'), {attributes: true, subtree: true, childList: true})`, formStateJS))

	f.click(button(shop.FormID, "standard"))
	f.waitPage("/orders/1", "#shipping")

	// While the order was under way the form was busy, its buttons
	// disabled and labelled with data-disable-with.
	var busy formState
	if err := json.Unmarshal([]byte(eval[string](f, "sessionStorage.getItem('busy') || '{}'")), &busy); err != nil {
		t.Fatal(err)
	}
	if !busy.Busy || len(busy.Disabled) != 2 || !busy.Disabled[0] || !busy.Disabled[1] ||
		busy.Labels[0] != "Placing order…" || busy.Labels[1] != "Placing order…" {
		t.Errorf("during the submission the form was %+v; want it busy, both buttons disabled and labelled %q", busy, "Placing order…")
	}

	f.back()
	f.waitPage("/", "#order")
	if shows := eval[[]bool](f, "window.__pageshows"); len(shows) != 2 || !shows[1] {
		reasons := bfcacheReasons()
		if required() {
			t.Fatalf("Back did not restore the page from the back/forward cache (pageshow persisted: %v; reasons: %s)", shows, reasons)
		}
		t.Skipf("Back did not restore the page from the back/forward cache (pageshow persisted: %v; reasons: %s)", shows, reasons)
	}
	f.wantUsable(shop.FormID)
	if after := f.formState(shop.FormID); after.Token != before.Token {
		t.Errorf("the restored form carries another token: the server would not see a resubmission as a duplicate")
	}
	f.wantStats(1, 1)
}

// watchBFCache subscribes to Chrome's reports of history navigations that
// could not use the back/forward cache; the func it returns lists their
// reasons, waiting a second at most for the first report.
func (f *fixture) watchBFCache() (reasons func() string) {
	ctx, cancel := context.WithCancel(f.ctx)
	events := chromedp.Events(ctx, page.BackForwardCacheNotUsed)
	f.t.Cleanup(cancel)
	return func() string {
		timer := time.AfterFunc(time.Second, cancel)
		defer timer.Stop()
		for ev, err := range events {
			if err != nil {
				return "none reported"
			}
			var rs []string
			for _, r := range ev.NotRestoredExplanations {
				rs = append(rs, string(r.Reason))
			}
			return strings.Join(rs, ", ")
		}
		return "none reported"
	}
}

// tokenOutage makes the browser's requests for tokens fail: status 0 is a
// network failure, any other status the server's answer. It returns how
// many requests it failed so far, and a func that ends the outage.
func (f *fixture) tokenOutage(status int) (failed *atomic.Int64, end func()) {
	f.t.Helper()
	ctx, cancel := context.WithCancel(f.ctx)
	paused := chromedp.Events(ctx, fetch.RequestPaused)
	if _, err := chromedp.Call(f.ctx, fetch.Enable, fetch.EnableParams{
		Patterns: []*fetch.RequestPattern{{URLPattern: "*/v1/tokens"}},
	}); err != nil {
		f.t.Fatal(err)
	}
	failed = new(atomic.Int64)
	var (
		wg   sync.WaitGroup
		errs []error
	)
	wg.Go(func() {
		for ev, err := range paused {
			if err != nil {
				return // the outage ended
			}
			if status == 0 {
				_, err = chromedp.Call(f.ctx, fetch.FailRequest, fetch.FailRequestParams{
					RequestID: ev.RequestID, ErrorReason: network.ErrorReasonInternetDisconnected,
				})
			} else {
				_, err = chromedp.Call(f.ctx, fetch.FulfillRequest, fetch.FulfillRequestParams{
					RequestID:    ev.RequestID,
					ResponseCode: int64(status),
					ResponseHeaders: []*fetch.HeaderEntry{
						{Name: "Content-Type", Value: "application/problem+json"},
						{Name: "Retry-After", Value: "30"},
					},
					Body: []byte(fmt.Sprintf(`{"status":%d,"title":"injected by the test"}`, status)),
				})
			}
			if err != nil {
				errs = append(errs, err)
			}
			failed.Add(1)
		}
	})
	var once sync.Once
	end = func() {
		once.Do(func() {
			if _, err := chromedp.Call(f.ctx, fetch.Disable, cdp.Empty{}); err != nil {
				f.t.Error(err)
			}
			cancel()
			wg.Wait()
			for _, err := range errs {
				f.t.Errorf("failing a token request: %v", err)
			}
		})
	}
	f.t.Cleanup(end)
	return failed, end
}

func TestFailedTokenFetchSubmitsNothingAndLeavesFormUsable(t *testing.T) {
	cases := []struct {
		name       string
		status     int // 0: the network fails
		wantReason string
	}{
		{"network failure", 0, "network"},
		{"rate limited", 429, "rate_limited"},
		{"server error", 503, "server"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, shop.Options{NoServerToken: true})
			f.open("/", "#order")
			f.recordEvents()
			// A button the page itself disabled stays disabled.
			eval[chromedp.Void](f, `document.querySelector('#order .actions').insertAdjacentHTML('beforeend',
				'<button name="shipping" value="pickup" disabled>Pick up (closed today)</button>')`)
			failed, end := f.tokenOutage(c.status)

			f.typeInto("#order input[name=name]", "Ada")
			f.click(button(shop.FormID, "express"))

			f.waitJS(`window.__rg.some(function (e) { return e.type == 'error'; })`)
			type event struct {
				Type, Reason string
				Status       int
			}
			var errs []event
			for _, e := range eval[[]event](f, "window.__rg") {
				if e.Type == "error" {
					errs = append(errs, e)
				}
			}
			if want := (event{"error", c.wantReason, c.status}); len(errs) != 1 || errs[0] != want {
				t.Errorf("replayguard:error events = %+v, want one %+v", errs, want)
			}
			f.wantUsable(shop.FormID)
			s := f.formState(shop.FormID)
			if s.Token != "" {
				t.Errorf("the form holds token %q after the fetch failed", s.Token)
			}
			if !s.Disabled[2] {
				t.Error("the SDK enabled a button the page had disabled")
			}
			if f.path() != "/" {
				t.Errorf("the page left for %s", f.path())
			}
			f.wantStats(0, 0)
			if failed.Load() == 0 {
				t.Error("no token request was made")
			}

			// Once the token endpoint is back, the same form places the order.
			end()
			f.click(button(shop.FormID, "express"))
			f.waitPage("/orders/1", "#shipping")
			f.wantStats(1, 1)
		})
	}
}

func TestFormAddedAfterLoadIsProtected(t *testing.T) {
	var opts shop.Options
	release := holdOrders(t, &opts)
	f := newFixture(t, opts)
	f.open("/", "#order")
	eval[chromedp.Void](f, `(function () {
		var form = document.createElement('form');
		form.id = 'late';
		form.method = 'post';
		form.action = '/orders';
		form.setAttribute('data-replayguard', 'checkout');
		form.innerHTML = '<input type="hidden" name="name" value="Grace">' +
			'<input type="hidden" name="item" value="mug">' +
			'<input type="hidden" name="quantity" value="2">' +
			'<button name="shipping" value="express">Buy two mugs</button>';
		document.querySelector('main').prepend(form);
	})()`)

	f.clickTwice("#late button", doubleClickGap)
	release()

	f.waitPage("/orders/1", "#shipping")
	f.wantStats(1, 1)
	if got := f.app.Stats().TokenRequests; got != 1 {
		t.Errorf("the SDK asked for %d tokens for the new form, want 1", got)
	}
	if got := f.text("#quantity") + " × " + f.text("#item"); got != "2 × Ceramic mug" {
		t.Errorf("order is %q, want 2 × Ceramic mug", got)
	}
}

func TestClickedButtonNameAndValueArrive(t *testing.T) {
	for _, p := range []struct{ path, form string }{{"/", shop.FormID}, {"/fetch-demo", shop.FetchFormID}} {
		for _, shipping := range []string{"standard", "express"} {
			t.Run(p.path+" "+shipping, func(t *testing.T) {
				f := newFixture(t, shop.Options{})
				f.open(p.path, "#"+p.form)
				f.typeInto("#"+p.form+" input[name=name]", "Ada")
				f.click(button(p.form, shipping))
				f.waitPage("/orders/1", "#shipping")
				if got := f.text("#shipping"); got != shipping {
					t.Errorf("shipping = %q, want %q", got, shipping)
				}
				f.wantStats(1, 1)
			})
		}
	}
}

func TestSubmitThroughFetchLeavesNoPOSTInHistory(t *testing.T) {
	f := newFixture(t, shop.Options{})
	f.open("/orders", "main table, main .card")
	f.open("/fetch-demo", "#"+shop.FetchFormID)
	before := eval[int](f, "history.length")
	f.typeInto("#fetch-order input[name=name]", "Ada")

	f.click(button(shop.FetchFormID, "express"))

	f.waitPage("/orders/1", "#shipping")
	if got, want := eval[string](f, "location.href"), f.url+"/orders/1"; got != want {
		t.Errorf("location.href = %q, want %q", got, want)
	}
	if got := eval[int](f, "history.length"); got != before {
		t.Errorf("history.length = %d, was %d before the submission: the form's entry was not replaced", got, before)
	}
	h, err := chromedp.Call(f.ctx, page.GetNavigationHistory, cdp.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, e := range h.Entries {
		urls = append(urls, strings.TrimPrefix(e.URL, f.url))
	}
	if got, want := strings.Join(urls, " "), "/orders /orders/1"; !strings.HasSuffix(got, want) {
		t.Errorf("history = %s, want it to end with %s", got, want)
	}
	f.wantStats(1, 1)

	// Reload shows the order again; Back goes to the page before the form.
	// Neither sends the order again.
	f.do(chromedp.Reload())
	f.waitPage("/orders/1", "#shipping")
	f.back()
	f.waitPage("/orders", "main .card")
	f.wantStats(1, 1)
}

func TestServerRenderedTokenWorksWithoutJavaScript(t *testing.T) {
	f := newFixture(t, shop.Options{})
	// The page's scripts do not run; the test still reads the page through
	// DevTools, which this does not stop.
	if _, err := chromedp.Call(f.ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true}); err != nil {
		t.Fatal(err)
	}
	f.open("/", "#order")
	if got := eval[string](f, "typeof ReplayGuard"); got != "undefined" {
		t.Fatalf("typeof ReplayGuard = %s: JavaScript is not disabled", got)
	}
	f.typeInto("#order input[name=name]", "Ada")
	f.click(button(shop.FormID, "express"))
	f.waitPage("/orders/1", "#shipping")
	if got := f.text("#shipping"); got != "express" {
		t.Errorf("shipping = %q, want express", got)
	}
	f.wantStats(1, 1)

	// Without the SDK nothing is disabled, but the server still refuses the
	// same form sent again.
	f.back()
	f.waitPage("/", "#order")
	f.click(button(shop.FormID, "express"))
	f.waitPage("/orders", "[data-message]")
	if got, want := f.text("h1"), "This order was already placed"; got != want {
		t.Errorf("page title = %q, want %q", got, want)
	}
	f.wantStats(2, 1)
	if got := f.app.Stats().TokenRequests; got != 0 {
		t.Errorf("%d token requests without JavaScript, want 0", got)
	}
}
