// Package browser drives headless Chromium through the checkout example
// (examples/checkout/shop), served in-process on 127.0.0.1, and checks
// every duplicate-submission scenario of the browser SDK against the
// server's own counts of POSTs received and orders placed.
//
// Chromium is REPLAYGUARD_TEST_CHROMIUM, else /usr/bin/chromium, else
// chromium, chromium-browser or google-chrome on PATH. Without one the
// tests skip, unless REPLAYGUARD_TEST_REQUIRE=1 or CI=true, when they fail.
// One browser serves the package; every test gets its own tab in its own
// browser context (no shared cookies, cache or history) and its own shop.
package browser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/examples/checkout/shop"
	"github.com/replayguard/replayguard/internal/testenv"
)

const (
	envChromium = "REPLAYGUARD_TEST_CHROMIUM" // path to a Chromium or Chrome binary

	// testTimeout bounds one test's browser work.
	testTimeout = 20 * time.Second
)

// The package's browsers, started on first use and stopped by TestMain.
var (
	// chromiumBrowser is Chromium as it comes, back/forward cache and all.
	chromiumBrowser = &chromium{}
	// noBFCacheBrowser has no back/forward cache, as when Chrome evicted the
	// page or another browser never had one: Back loads the page again.
	noBFCacheBrowser = &chromium{flags: []chromedp.ExecAllocatorOption{
		chromedp.Flag("disable-features", "Translate,BlinkGenPropertyTrees,BackForwardCache"),
	}}
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.ReleaseMode)
	code := m.Run()
	chromiumBrowser.stop()
	noBFCacheBrowser.stop()
	os.Exit(code)
}

// errNoChromium means no browser binary was found.
var errNoChromium = errors.New("no Chromium found: set " + envChromium + " or install chromium")

// debianChromium is where Debian's chromium package installs the browser;
// a variable for tests.
var debianChromium = "/usr/bin/chromium"

// findChromium returns the browser binary to use.
func findChromium() (string, error) {
	if p := os.Getenv(envChromium); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", envChromium, p, err)
		}
		return p, nil
	}
	if _, err := os.Stat(debianChromium); err == nil {
		return debianChromium, nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errNoChromium
}

// chromium is a headless Chromium shared by the tests, started once.
type chromium struct {
	flags  []chromedp.ExecAllocatorOption // beside the defaults
	once   sync.Once
	ctx    context.Context // the browser; nil when it did not start
	cancel func()
	err    error
}

// get returns the browser's context, starting it on first use.
func (c *chromium) get() (context.Context, error) {
	c.once.Do(func() { c.ctx, c.cancel, c.err = c.start() })
	return c.ctx, c.err
}

func (c *chromium) start() (context.Context, func(), error) {
	path, err := findChromium()
	if err != nil {
		return nil, nil, err
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // the tests may run as root, where the sandbox cannot start
		chromedp.DisableGPU,
		chromedp.WindowSize(1024, 900),
	)
	opts = append(opts, c.flags...)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	stop := func() { cancel(); cancelAlloc() }
	// The first Do binds the browser's life to its context, so it cannot
	// take a deadline of its own: wait for it on the side.
	done := make(chan error, 1)
	go func() { done <- chromedp.Do(ctx) }()
	timer := time.NewTimer(30 * time.Second)
	defer timer.Stop()
	select {
	case err = <-done:
	case <-timer.C:
		err = errors.New("timed out")
	}
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("starting %s: %w", path, err)
	}
	return ctx, stop, nil
}

// stop stops the browser if it was started.
func (c *chromium) stop() {
	if c.cancel != nil {
		c.cancel()
	}
}

func TestFindChromium(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "chromium")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		env      string // REPLAYGUARD_TEST_CHROMIUM
		debian   string // debianChromium
		path     string // PATH
		want     string
		wantErr  bool
		wantSkip bool // the error is errNoChromium: tests skip unless required
	}{
		{"the variable wins", fake, "/nonexistent", "", fake, false, false},
		{"a variable naming no file is an error, never a skip", "/nonexistent", fake, "", "", true, false},
		{"then Debian's chromium", "", fake, "", fake, false, false},
		{"then chromium on PATH", "", "/nonexistent", filepath.Dir(fake), fake, false, false},
		{"none at all", "", "/nonexistent", t.TempDir(), "", true, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(envChromium, c.env)
			t.Setenv("PATH", c.path)
			defer func(old string) { debianChromium = old }(debianChromium)
			debianChromium = c.debian

			got, err := findChromium()
			if got != c.want || (err != nil) != c.wantErr || errors.Is(err, errNoChromium) != c.wantSkip {
				t.Errorf("findChromium() = %q, %v; want %q, error %v, skip %v", got, err, c.want, c.wantErr, c.wantSkip)
			}
		})
	}
}

// required reports whether a missing browser fails the tests instead of
// skipping them.
func required() bool { return testenv.Required() }

// fixture is one test's shop, its server and a browser tab on it.
type fixture struct {
	t   *testing.T
	app *shop.App
	url string          // the shop's base URL
	ctx context.Context // the tab, with the test's deadline
	tab context.Context // the tab, without it
}

// newFixture starts a shop with opts on 127.0.0.1 and opens a tab on
// Chromium in a fresh browser context, all closed when the test ends.
func newFixture(t *testing.T, opts shop.Options) *fixture {
	t.Helper()
	return newFixtureIn(t, chromiumBrowser, opts)
}

// newFixtureIn is newFixture on browser b.
func newFixtureIn(t *testing.T, b *chromium, opts shop.Options) *fixture {
	t.Helper()
	browser, err := b.get()
	if err != nil {
		if errors.Is(err, errNoChromium) && !required() {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	app, err := shop.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(app) // listens on 127.0.0.1
	t.Cleanup(func() { srv.Close(); _ = app.Close() })

	tab, closeTab := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(closeTab)
	if err := chromedp.Do(tab); err != nil { // opens the tab, with no deadline of its own
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(tab, testTimeout)
	t.Cleanup(cancel)
	return &fixture{t: t, app: app, url: srv.URL, ctx: ctx, tab: tab}
}

// do runs steps in the tab and fails the test on error.
func (f *fixture) do(steps ...chromedp.Action[chromedp.Void]) {
	f.t.Helper()
	if err := chromedp.Do(f.ctx, steps...); err != nil {
		f.t.Fatal(err)
	}
}

// eval evaluates a JavaScript expression in the page and fails the test
// on error.
func eval[T any](f *fixture, expr string) T {
	f.t.Helper()
	v, err := evaluate[T](f.ctx, expr)
	if err != nil {
		f.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// try evaluates a JavaScript expression in whatever page is current, with
// a short deadline: while a navigation is under way it may fail. (While a
// form's POST is under way Chrome answers no evaluation at all until the
// next page commits, so no test looks into a page it is leaving.)
func try[T any](f *fixture, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(f.ctx, 2*time.Second)
	defer cancel()
	return evaluate[T](ctx, expr)
}

// evaluate sends Runtime.evaluate to the tab's current document and
// decodes the result's JSON into T; undefined leaves T's zero value.
func evaluate[T any](ctx context.Context, expr string) (T, error) {
	var v T
	res, err := chromedp.Call(ctx, runtime.Evaluate, runtime.EvaluateParams{Expression: expr, ReturnByValue: new(true)})
	switch {
	case err != nil:
		return v, err
	case res.ExceptionDetails != nil:
		return v, fmt.Errorf("%s: %s", res.ExceptionDetails.Text, res.ExceptionDetails.Exception.Description)
	case len(res.Result.Value) == 0: // undefined
		return v, nil
	}
	return v, json.Unmarshal(res.Result.Value, &v)
}

// The helpers below read and click the page through JavaScript and input
// events, not through chromedp's DOM mirror: the mirror does not follow a
// page the back/forward cache restores.

// open navigates to path and waits until sel is in the page.
func (f *fixture) open(path, sel string) {
	f.t.Helper()
	f.do(chromedp.Navigate(f.url + path))
	f.waitJS(fmt.Sprintf("!!document.querySelector(%q)", sel))
}

// waitJS waits until the JavaScript expression is true in the current
// page, across navigations and back/forward cache restores, polling every
// 10 ms until the test's deadline.
func (f *fixture) waitJS(expr string) {
	f.t.Helper()
	f.waitFor(expr, func() bool {
		ok, err := try[bool](f, expr)
		return err == nil && ok
	})
}

// describe says where the tab is, for failure messages.
func (f *fixture) describe() string {
	ctx, cancel := context.WithTimeout(f.tab, 2*time.Second)
	defer cancel()
	where, err := evaluate[string](ctx,
		`location.pathname + ' (' + document.readyState + '): ' + (document.querySelector('h1') || {}).textContent`)
	if err != nil {
		where = err.Error()
	}
	s := f.app.Stats()
	return fmt.Sprintf("the tab is on %s; the shop counted %d POSTs and %d orders", where, s.Posts, s.Orders)
}

// waitFor polls cond every 10 ms until it holds, failing the test with
// what at the test's deadline.
func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-f.ctx.Done():
			f.t.Fatalf("waiting for %s: %v; %s", what, f.ctx.Err(), f.describe())
		case <-tick.C:
		}
	}
}

// waitPage waits until the current page's path is path and sel is in it.
// It fails at once when the shop shows a message (a refusal, a mistake in
// the form, a failed fetch) or an order page that sel does not ask for.
func (f *fixture) waitPage(path, sel string) {
	f.t.Helper()
	from, _ := try[string](f, "location.pathname") // an order page already shown is no surprise
	expr := fmt.Sprintf(`(function () {
		if (document.readyState != 'complete') return '';
		if (location.pathname == %q && document.querySelector(%q)) return 'ok';
		var msg = document.querySelector('[data-message], #outcome.alert');
		if (msg) return location.pathname + ' says: ' + msg.textContent.replace(/\s+/g, ' ').trim();
		if (document.querySelector('#shipping') && location.pathname != %q) return 'an order was placed: ' + location.pathname;
		return '';
	})()`, path, sel, from)
	var got string
	f.waitFor(fmt.Sprintf("%s with %s", path, sel), func() bool {
		var err error
		got, err = try[string](f, expr)
		return err == nil && got != ""
	})
	if got != "ok" {
		f.t.Fatalf("waiting for %s with %s: %s (the shop counted %+v)", path, sel, got, f.app.Stats())
	}
}

// text returns the trimmed text content of the first element matching sel,
// waiting for it to be in the page.
func (f *fixture) text(sel string) string {
	f.t.Helper()
	q := fmt.Sprintf("document.querySelector(%q)", sel)
	f.waitJS("!!" + q)
	return strings.TrimSpace(eval[string](f, q+".textContent"))
}

// path returns the page's location.pathname.
func (f *fixture) path() string {
	f.t.Helper()
	return eval[string](f, "location.pathname")
}

// centre scrolls the first element matching sel into view and returns its
// centre in viewport coordinates.
func (f *fixture) centre(sel string) (x, y float64) {
	f.t.Helper()
	p := eval[[]float64](f, fmt.Sprintf(`(function () {
		var e = document.querySelector(%q);
		e.scrollIntoView({block: 'center'});
		var r = e.getBoundingClientRect();
		return [r.left + r.width / 2, r.top + r.height / 2];
	})()`, sel))
	return p[0], p[1]
}

// click clicks the centre of the first element matching sel with the mouse.
func (f *fixture) click(sel string) {
	f.t.Helper()
	x, y := f.centre(sel)
	f.do(chromedp.MouseClickXY(x, y))
}

// clickTwice clicks the centre of the element matching sel twice, gap
// apart, as a double-clicking user does: the second click lands where the
// first did, whatever the page did meanwhile.
func (f *fixture) clickTwice(sel string, gap time.Duration) {
	f.t.Helper()
	x, y := f.centre(sel)
	f.do(chromedp.MouseClickXY(x, y))
	pause(gap)
	f.do(chromedp.MouseClickXY(x, y, chromedp.ClickCount(2)))
}

// holdOrders makes opts hold every order until the func it returns is
// called (or the test ends): a test clicks again or presses Enter again
// while the first submission is under way, as on a slow checkout, with no
// race against the server.
func holdOrders(t *testing.T, opts *shop.Options) (release func()) {
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	opts.Hold = func(ctx context.Context) {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	t.Cleanup(release) // before the server closes: it waits for held requests
	return release
}

// pause is the gap between two user actions in a scenario: a duration the
// scenario is about, never a wait for something to happen.
func pause(d time.Duration) { time.Sleep(d) }

// typeInto focuses the first element matching sel and types keys into it.
func (f *fixture) typeInto(sel, keys string) {
	f.t.Helper()
	eval[chromedp.Void](f, fmt.Sprintf("document.querySelector(%q).focus()", sel))
	f.do(chromedp.KeyEvent(keys))
}

// wantStats checks the shop's counts of POSTs received and orders placed.
func (f *fixture) wantStats(posts, orders int) {
	f.t.Helper()
	if got := f.app.Stats(); got.Posts != posts || got.Orders != orders {
		f.t.Errorf("shop counted %d POSTs and %d orders, want %d POSTs and %d orders",
			got.Posts, got.Orders, posts, orders)
	}
}

// recordPageshows records every pageshow event's persisted flag, in every
// document the tab loads from now on, in window.__pageshows.
func (f *fixture) recordPageshows() {
	f.t.Helper()
	f.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: `window.__pageshows = []; addEventListener('pageshow', function (e) { window.__pageshows.push(e.persisted); });`,
		})
		return err
	}))
}

// back goes one entry back in the tab's history, as the Back button does.
// It does not wait: a page restored from the back/forward cache fires no
// load event, so callers wait for what they expect to see.
func (f *fixture) back() {
	f.t.Helper()
	f.do(chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		h, err := cdp.Call(ctx, t, page.GetNavigationHistory, cdp.Empty{})
		if err != nil {
			return err
		}
		if h.CurrentIndex < 1 {
			return errors.New("no history entry to go back to")
		}
		_, err = cdp.Call(ctx, t, page.NavigateToHistoryEntry, page.NavigateToHistoryEntryParams{EntryID: h.Entries[h.CurrentIndex-1].ID})
		return err
	}))
}
