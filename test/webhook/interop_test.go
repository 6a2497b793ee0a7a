package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/replayguard/replayguard/internal/testenv"
)

// interopDir is the Node side of the webhook interop tests
// (webhook/interop), from this package's directory.
var interopDir = filepath.Join(repoRoot, "webhook", "interop")

// TestProviderLibrariesThroughTheGateway: deliveries that the providers'
// own npm libraries sign (standardwebhooks, stripe,
// @octokit/webhooks-methods) and Node's fetch sends reach the app once
// through the server; each redelivery, signed again by the library, gets
// the first answer back. Without node or webhook/interop/node_modules it
// skips, unless REPLAYGUARD_TEST_REQUIRE=1 or CI=true.
func TestProviderLibrariesThroughTheGateway(t *testing.T) {
	node, err := exec.LookPath("node")
	for _, p := range []string{"standardwebhooks", "stripe", "@octokit/webhooks-methods"} {
		if err == nil {
			_, err = os.Stat(filepath.Join(interopDir, "node_modules", p, "package.json"))
		}
	}
	if err != nil {
		testenv.Missing(t, "webhook interop needs node and webhook/interop/node_modules (run npm ci in webhook/interop): "+err.Error())
	}
	app := newCountingApp(t)
	sec := newSecrets(t)
	srv := runServer(t, gatewayEnv(t, app.srv.URL, sec)...)
	run := randomHex(t, 6)
	for _, tc := range []struct {
		scheme, secret, id, body, key string
	}{
		{"standard", sec.standard, "msg_node_" + run, `{"type":"contact.created","data":{"name":"Zoë"}}`, "msg_node_" + run},
		{"stripe", sec.stripe, "", `{"id":"evt_node_` + run + `","object":"event","type":"invoice.paid"}`, "evt_node_" + run},
		{"github", sec.github, "72d3162e-cc78-11e3-81ab-" + run, `{"zen":"Keep it logically awesome.","hook_id":1}`, "72d3162e-cc78-11e3-81ab-" + run},
	} {
		t.Run(tc.scheme, func(t *testing.T) {
			var first string
			for i := range 3 {
				got := nodeSend(t, node, map[string]any{
					"scheme": tc.scheme, "secret": tc.secret, "id": tc.id, "timestamp": time.Now().Unix() + int64(i),
					"body": tc.body, "url": srv.base + "/hooks/" + tc.scheme,
				})
				if got.Status != 200 || (i > 0) != (got.Replayed == "true") {
					t.Fatalf("delivery %d: %d replayed=%q %s", i, got.Status, got.Replayed, got.Response)
				}
				if i == 0 {
					first = got.Response
				} else if got.Response != first {
					t.Fatalf("delivery %d got %s, want the first answer %s", i, got.Response, first)
				}
			}
			if n := app.count(tc.key); n != 1 {
				t.Fatalf("the app ran %s %d times, want 1", tc.key, n)
			}
		})
	}
}

// nodeSent is what sign.mjs prints after sending a delivery.
type nodeSent struct {
	Status   int
	Response string
	Replayed string
}

func nodeSend(t *testing.T, node string, in map[string]any) nodeSent {
	t.Helper()
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "sign.mjs")
	cmd.Dir = interopDir
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(fmt.Errorf("node sign.mjs: %w: %s", err, strings.TrimSpace(stderr.String())))
	}
	var sent nodeSent
	if err := json.Unmarshal(out, &sent); err != nil {
		t.Fatalf("sign.mjs printed %s: %v", out, err)
	}
	return sent
}
