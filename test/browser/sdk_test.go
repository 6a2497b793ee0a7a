package browser

import (
	"encoding/json"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/replayguard/replayguard/examples/checkout/shop"
	"github.com/replayguard/replayguard/web/sdk"
)

// runAsync runs the body of an async JavaScript function in the page and
// returns what it returns, as JSON. (evaluate does not await promises.)
func runAsync(f *fixture, body string) string {
	f.t.Helper()
	eval[any](f, `window.__result = undefined; (async function () {`+body+`})().then(
		function (v) { window.__result = JSON.stringify(v); },
		function (e) { window.__result = JSON.stringify({error: String(e)}); }), 0`)
	f.waitJS("window.__result !== undefined")
	return eval[string](f, "window.__result")
}

// TestSDKAsServed checks the SDK as Chromium gets it from the server: the
// minified script arrives compressed, passes its integrity check and runs;
// its source map names the readable source, which is served; and the ES
// module entry, on a page without the classic script, gives the object the
// script defines.
func TestSDKAsServed(t *testing.T) {
	f := newFixture(t, shop.Options{})
	f.open("/", "#"+shop.FormID)
	f.waitJS("document.readyState == 'complete' && !!window.ReplayGuard")

	var page struct {
		Error                      string
		Integrity                  string
		Version                    string
		Encoded, Decoded           int
		Encoding                   string
		MapURL, Source             string
		SourceServed, MapHasSource bool
	}
	out := runAsync(f, `
		var src = '/sdk/replayguard.js';
		var el = document.querySelector('script[src="' + src + '"]');
		var t = performance.getEntriesByName(new URL(src, location.href).href)[0];
		var res = await fetch(src);
		var text = await res.text();
		var mapURL = new URL(/\/\/# sourceMappingURL=(\S+)\n$/.exec(text)[1], res.url);
		var map = await (await fetch(mapURL)).json();
		var source = new URL(map.sources[0], mapURL);
		var served = await fetch(source);
		return {
			integrity: el.integrity, version: ReplayGuard.version,
			encoded: t.encodedBodySize, decoded: t.decodedBodySize,
			encoding: res.headers.get('content-encoding'),
			mapURL: mapURL.pathname, source: source.pathname,
			sourceServed: served.ok, mapHasSource: served.ok && (await served.text()) == map.sourcesContent[0],
		};`)
	if err := json.Unmarshal([]byte(out), &page); err != nil || page.Error != "" {
		t.Fatalf("%s (%v)", out, err)
	}
	if page.Integrity != sdk.SRI || page.Version == "" {
		t.Errorf("the script with integrity %q did not run as it should: version %q", page.Integrity, page.Version)
	}
	if page.Encoding != "br" || page.Decoded != len(sdk.Script()) || page.Encoded == 0 || page.Encoded >= page.Decoded {
		t.Errorf("the script arrived with Content-Encoding %q, %d bytes for %d decoded; want br, smaller than the %d of the minified file",
			page.Encoding, page.Encoded, page.Decoded, len(sdk.Script()))
	}
	if page.MapURL != sdk.SourceMapPath || page.Source != sdk.SourcePath || !page.SourceServed || !page.MapHasSource {
		t.Errorf("source map %s names %s: served %v, the same as the map's copy %v", page.MapURL, page.Source, page.SourceServed, page.MapHasSource)
	}

	// A page without the classic script: the module entry runs it once.
	f.do(chromedp.Navigate(f.url + sdk.SRIPath))
	out = runAsync(f, `
		var m = await import('/sdk/replayguard.mjs');
		return {same: m.default === window.ReplayGuard && m.ReplayGuard === m.default, version: m.default.version};`)
	var mod struct {
		Error, Version string
		Same           bool
	}
	if err := json.Unmarshal([]byte(out), &mod); err != nil || mod.Error != "" || !mod.Same || mod.Version != page.Version {
		t.Fatalf("import('/sdk/replayguard.mjs'): %s (%v)", out, err)
	}
}
