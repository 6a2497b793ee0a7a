package browser

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/target"
	"github.com/chromedp/chromedp"

	"github.com/replayguard/replayguard/examples/checkout/shop"
)

// Submissions that do not leave the page: the export form on /orders
// sends its "Print" button's submission to a new tab (formtarget="_blank")
// and answers its "Download CSV" button (data-replayguard-download) with
// an attachment. The page stays, so the SDK must give the controls back
// and the form a fresh token, while a double click still sends one.

// exportButton is the selector of the export form's button whose value is
// format: "csv" (a download) or "html" (a page to print, in a new tab).
func exportButton(format string) string {
	return fmt.Sprintf("#%s button[value=%s]", shop.ExportFormID, format)
}

// exportLabels are the export form's button labels when it is usable.
var exportLabels = []string{"Download CSV", "Print"}

// waitUsable waits until the form whose id is form is not busy and none of
// its buttons is disabled.
func (f *fixture) waitUsable(form string) {
	f.t.Helper()
	expr := fmt.Sprintf(`(function (s) {
		return !s.busy && s.disabled.every(function (d) { return !d; });
	})((%s)(%q))`, formStateJS, form)
	f.waitFor("form #"+form+" to be usable", func() bool {
		ok, err := try[bool](f, expr)
		return err == nil && ok
	})
}

// wantExportFormUsable checks that the export form is usable, its labels
// restored, and returns its state.
func (f *fixture) wantExportFormUsable() formState {
	f.t.Helper()
	s := f.formState(shop.ExportFormID)
	if s.Busy || len(s.Disabled) != 2 || s.Disabled[0] || s.Disabled[1] || strings.Join(s.Labels, "|") != strings.Join(exportLabels, "|") {
		f.t.Errorf("export form is %+v; want it usable, labelled %q", s, exportLabels)
	}
	return s
}

// recordBusy makes the page note, in window.__busy, the export form's
// state the first time it turns busy: the test cannot catch that moment
// itself without racing the guard.
func (f *fixture) recordBusy() {
	f.t.Helper()
	eval[chromedp.Void](f, fmt.Sprintf(`(function () {
		var form = document.getElementById(%q);
		new MutationObserver(function () {
			var s = (%s)(form.id);
			if (s.busy && !window.__busy) window.__busy = s;
		}).observe(form, {attributes: true, subtree: true, childList: true, characterData: true});
	})()`, shop.ExportFormID, formStateJS))
}

// wantWasBusy checks that the export form was busy, both buttons disabled
// and the clicked one labelled label, during the submission.
func (f *fixture) wantWasBusy(clicked int, label string) {
	f.t.Helper()
	busy := eval[formState](f, "window.__busy || {}")
	if !busy.Busy || len(busy.Disabled) != 2 || !busy.Disabled[0] || !busy.Disabled[1] || busy.Labels[clicked] != label {
		f.t.Errorf("during the submission the export form was %+v; want it busy, both buttons disabled, button %d labelled %q", busy, clicked, label)
	}
}

// waitExportPosts waits until the shop has answered n export POSTs,
// refused or not; its count of exports is then final for them.
func (f *fixture) waitExportPosts(n int) {
	f.t.Helper()
	f.waitFor(fmt.Sprintf("%d export POSTs answered", n), func() bool { return f.app.Stats().ExportPosts >= n })
}

// wantExports checks the shop's counts of export POSTs answered and of
// exports answered. As each token is redeemed once, equal counts mean
// every POST carried a token of its own.
func (f *fixture) wantExports(posts, exports int) {
	f.t.Helper()
	if got := f.app.Stats(); got.ExportPosts != posts || got.Exports != exports {
		f.t.Errorf("shop counted %d export POSTs and %d exports, want %d POSTs and %d exports",
			got.ExportPosts, got.Exports, posts, exports)
	}
}

// openedPages counts the pages of the tab's browser context, beside the
// tab itself, that show path (with any query).
func (f *fixture) openedPages(path string) int {
	f.t.Helper()
	res, err := chromedp.CallBrowser(f.ctx, target.GetTargets, target.GetTargetsParams{})
	if err != nil {
		f.t.Fatal(err)
	}
	c := chromedp.FromContext(f.tab)
	n := 0
	for _, ti := range res.TargetInfos {
		if ti.Type == "page" && ti.BrowserContextID == c.BrowserContextID && ti.TargetID != c.Target.TargetID && strings.Split(ti.URL, "?")[0] == f.url+path {
			n++
		}
	}
	return n
}

// watchDownloads lets the tab's browser context save downloads into a
// directory of the test's own and returns a func that lists the contents
// of the downloads completed so far.
func (f *fixture) watchDownloads() (completed func() []string) {
	f.t.Helper()
	dir := f.t.TempDir()
	ctx, cancel := context.WithCancel(f.ctx)
	events := chromedp.BrowserEvents(ctx, browser.DownloadProgress)
	if _, err := chromedp.CallBrowser(f.ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior:         browser.SetDownloadBehaviorBehaviorAllowAndName, // saved as dir/GUID
		BrowserContextID: chromedp.FromContext(f.tab).BrowserContextID,
		DownloadPath:     dir,
		EventsEnabled:    new(true),
	}); err != nil {
		cancel()
		f.t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		files []string
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for ev, err := range events {
			if err != nil {
				return // the test is over
			}
			if ev.State != browser.DownloadProgressStateCompleted {
				continue
			}
			// The browser reports every context's downloads; this test's
			// are the ones in dir.
			b, err := os.ReadFile(filepath.Join(dir, ev.GUID))
			if err != nil {
				continue
			}
			mu.Lock()
			files = append(files, string(b))
			mu.Unlock()
		}
	})
	f.t.Cleanup(func() { cancel(); wg.Wait() })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), files...)
	}
}

// waitDownloads waits until n downloads have completed and returns their
// contents.
func (f *fixture) waitDownloads(completed func() []string, n int) []string {
	f.t.Helper()
	f.waitFor(fmt.Sprintf("%d downloads", n), func() bool { return len(completed()) >= n })
	return completed()
}

func TestSubmissionToAnotherWindowLeavesFormUsable(t *testing.T) {
	cases := []struct {
		name     string
		setup    string // JavaScript run on /orders before the clicks; form and print are at hand
		sdkToken bool   // the form has no server-rendered token: the SDK fetches one
		tabs     int    // new tabs showing the print page in the end
		frame    bool   // the print page shows in the page's iframe
	}{
		{"button with formtarget=_blank", "", false, 2, false},
		{"form with target=_blank, token fetched by the SDK",
			"form.target = '_blank'; print.removeAttribute('formtarget')", true, 2, false},
		{"page with <base target=_blank>",
			"document.head.insertAdjacentHTML('beforeend', '<base target=\"_blank\">'); print.removeAttribute('formtarget')", false, 2, false},
		{"a named window, opened once and reused",
			"print.setAttribute('formtarget', 'invoice')", false, 1, false},
		{"an iframe of the page, token fetched by the SDK",
			"document.querySelector('main').insertAdjacentHTML('beforeend', '<iframe name=\"preview\"></iframe>'); print.setAttribute('formtarget', 'preview')", true, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, shop.Options{NoServerToken: c.sdkToken})
			f.open("/orders", "#"+shop.ExportFormID)
			eval[chromedp.Void](f, fmt.Sprintf(`(function (form, print) { %s })(document.getElementById(%q), document.querySelector(%q))`,
				c.setup, shop.ExportFormID, exportButton("html")))
			f.recordBusy()
			first := f.formState(shop.ExportFormID).Token

			f.clickTwice(exportButton("html"), doubleClickGap)
			f.waitExportPosts(1)
			f.waitUsable(shop.ExportFormID)

			f.wantWasBusy(1, "Opening…")
			f.wantExports(1, 1) // the second click of the double click was swallowed
			if s := f.wantExportFormUsable(); first != "" && s.Token == first {
				t.Errorf("the form still carries the token it sent to the other window")
			}

			f.click(exportButton("html"))
			f.waitExportPosts(2)
			f.waitUsable(shop.ExportFormID)
			f.wantExports(2, 2) // the second submission carried a fresh token
			f.wantExportFormUsable()
			if got := f.path(); got != "/orders" {
				t.Errorf("the tab left for %s", got)
			}
			f.waitFor(fmt.Sprintf("%d tabs showing /exports", c.tabs), func() bool { return f.openedPages("/exports") == c.tabs })
			if c.frame {
				f.waitJS(`(function (d) { return !!d && !!d.querySelector('h1') && d.querySelector('h1').textContent == 'Orders to print'; })(document.querySelector('iframe[name=preview]').contentDocument)`)
			}
			f.wantStats(0, 0)
		})
	}
}

// csvHeader is the first line of the shop's CSV export.
const csvHeader = "id,name,item,quantity,shipping,total\n"

func TestDownloadLeavesFormUsable(t *testing.T) {
	cases := []struct {
		name     string
		setup    string // JavaScript run on /orders before the clicks; form and csv are at hand
		sdkToken bool
	}{
		{"button marked data-replayguard-download", "", false},
		{"form marked data-replayguard-download, token fetched by the SDK",
			"csv.removeAttribute('data-replayguard-download'); form.setAttribute('data-replayguard-download', '')", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, shop.Options{NoServerToken: c.sdkToken})
			downloads := f.watchDownloads()
			f.open("/orders", "#"+shop.ExportFormID)
			eval[chromedp.Void](f, fmt.Sprintf(`(function (form, csv) { %s })(document.getElementById(%q), document.querySelector(%q))`,
				c.setup, shop.ExportFormID, exportButton("csv")))
			f.recordBusy()
			first := f.formState(shop.ExportFormID).Token

			f.clickTwice(exportButton("csv"), doubleClickGap)
			f.waitDownloads(downloads, 1)
			f.waitExportPosts(1)
			f.waitUsable(shop.ExportFormID)

			f.wantWasBusy(0, "Exporting…")
			f.wantExports(1, 1)
			if s := f.wantExportFormUsable(); first != "" && s.Token == first {
				t.Errorf("the form still carries the token its download spent")
			}

			f.click(exportButton("csv"))
			files := f.waitDownloads(downloads, 2)
			f.waitExportPosts(2)
			f.waitUsable(shop.ExportFormID)
			f.wantExports(2, 2)
			for i, b := range files {
				if b != csvHeader {
					t.Errorf("download %d = %q, want %q", i+1, b, csvHeader)
				}
			}
			if got := f.path(); got != "/orders" {
				t.Errorf("the tab left for %s", got)
			}
		})
	}
}

func TestUnmarkedDownloadWaitsForReset(t *testing.T) {
	f := newFixture(t, shop.Options{})
	downloads := f.watchDownloads()
	f.open("/orders", "#"+shop.ExportFormID)
	// Without the mark the SDK cannot tell a download from a slow answer:
	// it keeps the controls disabled and the spent token, as for any
	// submission it expects to leave the page. With no guard at all, a
	// wrongly marked submission would have its controls back at once, long
	// before the download arrives.
	eval[chromedp.Void](f, fmt.Sprintf(`ReplayGuard.configure({guard: 0});
		document.querySelector(%q).removeAttribute('data-replayguard-download')`, exportButton("csv")))
	first := f.formState(shop.ExportFormID).Token

	f.click(exportButton("csv"))
	f.waitDownloads(downloads, 1)
	if s := f.formState(shop.ExportFormID); !s.Busy || !s.Disabled[0] || !s.Disabled[1] || s.Token != first {
		t.Errorf("after an unmarked download the export form is %+v; want it busy, buttons disabled, token kept", s)
	}

	// The page knows better (here: the test does) and resets the form.
	eval[chromedp.Void](f, fmt.Sprintf("ReplayGuard.reset(document.getElementById(%q))", shop.ExportFormID))
	if s := f.wantExportFormUsable(); s.Token != "" {
		t.Errorf("after reset the form carries token %q, want none until the next submission fetches one", s.Token)
	}
	f.click(exportButton("csv"))
	f.waitDownloads(downloads, 2)
	f.waitExportPosts(2)
	f.wantExports(2, 2)
	if got := f.app.Stats().TokenRequests; got != 1 {
		t.Errorf("the SDK asked for %d tokens, want 1 (for the submission after reset)", got)
	}
}

func TestSpentTokenStaysSpentAfterBack(t *testing.T) {
	cases := []struct {
		name    string
		browser *chromium
	}{
		// The page comes back as it was left: its input is empty, and
		// history.state names the spent token, which must not come back.
		{"back/forward cache", chromiumBrowser},
		// The page comes back from the HTTP cache with the server-rendered
		// token in its input, the one Print spent; history.state says so.
		{"HTTP cache", noBFCacheBrowser},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixtureIn(t, c.browser, shop.Options{})
			f.open("/orders", "#"+shop.ExportFormID)
			f.click(exportButton("html"))
			f.waitExportPosts(1)
			f.waitUsable(shop.ExportFormID)

			f.open("/", "#"+shop.FormID)
			f.back()
			f.waitPage("/orders", "#"+shop.ExportFormID)
			f.waitUsable(shop.ExportFormID)
			f.click(exportButton("html"))
			f.waitExportPosts(2)
			f.wantExports(2, 2) // not refused as a duplicate
			if got := f.app.Stats().TokenRequests; got != 1 {
				t.Errorf("the SDK asked for %d tokens, want 1 (for the submission after Back)", got)
			}
		})
	}
}

func TestBackAfterOrderThenSubmissionToAnotherWindowPlacesNoSecondOrder(t *testing.T) {
	// After an order and Back the form holds the token the order used. A
	// submission to another window in between (a "Preview" into a new tab)
	// carries that token too, but did not bring it into the form: it must
	// leave it there, so that "Place order" again is the duplicate it is.
	cases := []struct {
		name     string
		browser  *chromium
		cache    string // the form page's Cache-Control; "" for the shop's default
		sdkToken bool   // the form has no server-rendered token: the SDK fetches one
	}{
		{"back/forward cache, server-rendered token", chromiumBrowser, "", false},
		{"back/forward cache, token fetched by the SDK", chromiumBrowser, "", true},
		{"HTTP cache, server-rendered token", noBFCacheBrowser, "", false},
		{"page fetched again (no-store), server-rendered token", noBFCacheBrowser, "no-store", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixtureIn(t, c.browser, shop.Options{FormCacheControl: c.cache, NoServerToken: c.sdkToken})
			f.open("/", "#"+shop.FormID)
			f.typeInto("#order input[name=name]", "Ada")
			f.click(button(shop.FormID, "express"))
			f.waitPage("/orders/1", "#shipping")

			f.back()
			f.waitPage("/", "#"+shop.FormID)
			f.wantUsable(shop.FormID)
			eval[chromedp.Void](f, fmt.Sprintf(`document.getElementById(%q).insertAdjacentHTML('beforeend',
				'<button type="submit" id="preview" formtarget="_blank" formmethod="get" formaction="/stats">Preview</button>')`, shop.FormID))
			f.click("#preview")
			f.waitFor("the preview in a new tab", func() bool { return f.openedPages("/stats") == 1 })
			f.waitUsable(shop.FormID)

			f.click(button(shop.FormID, "express"))
			f.waitPage("/orders", "[data-message]")
			if got, want := f.text("h1"), "This order was already placed"; got != want {
				t.Errorf("page title = %q, want %q", got, want)
			}
			f.wantStats(2, 1)
			want := 0
			if c.sdkToken {
				want = 1 // for the order
			}
			if got := f.app.Stats().TokenRequests; got != want {
				t.Errorf("the SDK asked for %d tokens, want %d", got, want)
			}
		})
	}
}

func TestEmptyTargetSubmitsToThisWindow(t *testing.T) {
	// A target or formtarget attribute that is there wins even when it is
	// empty, and empty means this window, as HTML says. (Chromium 156 uses
	// the base target for an empty one, so the SDK pins the target it
	// resolved on the form: the submission goes where the SDK thinks.) The
	// SDK must see it as one that leaves the page: with no guard, were it
	// to take it for one that stays, it would give the controls back at
	// once, and the second click of a double click would place a second
	// order.
	cases := []struct {
		name  string
		setup string // JavaScript run on / before the clicks; form and order (the clicked button) are at hand
	}{
		{`form target="" under <base target=_blank>`,
			`document.head.insertAdjacentHTML('beforeend', '<base target="_blank">'); form.setAttribute('target', '')`},
		{`button formtarget="" on a form with target=_blank`,
			`form.setAttribute('target', '_blank'); order.setAttribute('formtarget', '')`},
		{`button formtarget="" under <base target=_blank>`,
			`document.head.insertAdjacentHTML('beforeend', '<base target="_blank">'); order.setAttribute('formtarget', '')`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var opts shop.Options
			release := holdOrders(t, &opts)
			f := newFixture(t, opts)
			f.open("/", "#"+shop.FormID)
			eval[chromedp.Void](f, fmt.Sprintf(`ReplayGuard.configure({guard: 0});
				(function (form, order) { %s })(document.getElementById(%q), document.querySelector(%q))`,
				c.setup, shop.FormID, button(shop.FormID, "standard")))
			f.typeInto("#order input[name=name]", "Ada")

			f.clickTwice(button(shop.FormID, "standard"), doubleClickGap)
			release()

			f.waitPage("/orders/1", "#shipping") // in this tab
			f.wantStats(1, 1)
			if n := f.openedPages("/orders") + f.openedPages("/orders/1"); n != 0 {
				t.Errorf("%d other tabs show the order, want none", n)
			}
		})
	}
}
