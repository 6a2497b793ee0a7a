package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"strings"
	"testing"
)

func noEnv(string) string { return "" }

func TestRunServesTheShopUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0"}, noEnv, &out, func(addr string) { addrc <- addr })
	}()

	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("run returned before listening: %v", err)
	}
	res, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `data-replayguard="checkout"`) {
		t.Errorf("GET / = %d; body: %.200s", res.StatusCode, body)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
	if !strings.Contains(out.String(), "open http://"+addr+"/") {
		t.Errorf("output %q does not say where to open the shop", out.String())
	}
}

func TestRunRejectsBadConfiguration(t *testing.T) {
	cases := []struct {
		name      string
		args      []string
		keys      string // REPLAYGUARD_SIGNING_KEYS
		want      error  // nil: any error
		wantUsage bool
	}{
		{"-h prints the usage", []string{"-h"}, "", flag.ErrHelp, true},
		{"an unknown flag is an error", []string{"-port", "1"}, "", nil, true},
		{"a malformed delay is an error", []string{"-delay", "soon"}, "", nil, true},
		{"malformed signing keys are an error", nil, "k1:not-base64!", nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			getenv := func(name string) string {
				if name == "REPLAYGUARD_SIGNING_KEYS" {
					return c.keys
				}
				return ""
			}
			err := run(context.Background(), append(c.args, "-addr", "127.0.0.1:0"), getenv, &out, nil)
			if err == nil || (c.want != nil && !errors.Is(err, c.want)) {
				t.Errorf("run = %v, want an error (%v)", err, c.want)
			}
			if got := strings.Contains(out.String(), "-addr"); got != c.wantUsage {
				t.Errorf("output %q: usage printed %v, want %v", out.String(), got, c.wantUsage)
			}
		})
	}
}
