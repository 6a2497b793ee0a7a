package browser

import (
	"os"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/replayguard/replayguard/examples/checkout/shop"
)

// envScreenshot names the PNG file TestScreenshot writes; unset, it skips.
const envScreenshot = "REPLAYGUARD_SCREENSHOT"

// TestScreenshot takes the README's picture of the checkout form:
//
//	REPLAYGUARD_SCREENSHOT=$PWD/docs/checkout.png go test -run Screenshot ./test/browser/
func TestScreenshot(t *testing.T) {
	path := os.Getenv(envScreenshot)
	if path == "" {
		t.Skip(envScreenshot + " is not set")
	}
	f := newFixture(t, shop.Options{})
	f.do(chromedp.EmulateViewport(820, 570))
	f.open("/", "#order")
	f.typeInto("#order input[name=name]", "Ada Lovelace")
	eval[chromedp.Void](f, `document.activeElement.blur()`)
	png, err := chromedp.Run(f.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", path, len(png))
}
