package main

import (
	"context"
	"io"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/store/memory"
)

// TestWebhookModes runs the webhook modes against a gateway with the
// routes of webhook-routes.yaml, on the memory store, as webhook.sh does
// on Redis: every fresh delivery runs the app, and every redelivery is
// answered from the record; pass-through runs every request.
func TestWebhookModes(t *testing.T) {
	app := &orderApp{}
	appSrv := httptest.NewServer(app)
	defer appSrv.Close()
	routes, err := gateway.LoadRoutes("webhook-routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st := memory.New()
	defer st.Close()
	up, err := url.Parse(appSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(up, routes, gateway.WithKeeper(idempotency.New(st)),
		gateway.WithGetenv(func(name string) string { return map[string]string{"LOAD_WEBHOOK_SECRET": webhookSecret}[name] }))
	if err != nil {
		t.Fatal(err)
	}
	gwSrv := httptest.NewServer(gw)
	defer gwSrv.Close()

	const workers, requests = 4, 200
	for _, tt := range []struct {
		mode, path string
		wantRuns   int64
	}{
		{"passthrough", "/plain", requests},
		{"wh-first", "/hooks/orders", requests},
		{"wh-replay", "/hooks/orders", workers},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			before := app.runs.Load()
			cfg, err := parseFlags([]string{"-url", gwSrv.URL, "-mode", tt.mode, "-path", tt.path, "-workers", strconv.Itoa(workers), "-duration", "1m", "-max-requests", strconv.Itoa(requests)}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			s, err := run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			wantReplayed := int64(0)
			if gatewayModes[tt.mode].repeat {
				wantReplayed = requests
			}
			if !s.Clean || s.OK != requests || s.Replayed != wantReplayed {
				t.Fatalf("summary = %+v, want %d successes, %d replayed", s, requests, wantReplayed)
			}
			if runs := app.runs.Load() - before; runs != tt.wantRuns {
				t.Fatalf("the app ran %d times, want %d", runs, tt.wantRuns)
			}
		})
	}
}

// TestWebhookModeRefusesAnotherSecret: deliveries signed with another
// secret than the route's are refused, and the run is not clean.
func TestWebhookModeRefusesAnotherSecret(t *testing.T) {
	appSrv := httptest.NewServer(&orderApp{})
	defer appSrv.Close()
	routes, err := gateway.LoadRoutes("webhook-routes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st := memory.New()
	defer st.Close()
	up, _ := url.Parse(appSrv.URL)
	gw, err := gateway.New(up, routes, gateway.WithKeeper(idempotency.New(st)),
		gateway.WithGetenv(func(string) string { return "whsec_b3RoZXIgc2VjcmV0IG9mIHRoZSByb3V0ZQ==" }))
	if err != nil {
		t.Fatal(err)
	}
	gwSrv := httptest.NewServer(gw)
	defer gwSrv.Close()
	cfg, err := parseFlags([]string{"-url", gwSrv.URL, "-mode", "wh-first", "-path", "/hooks/orders", "-workers", "2", "-max-requests", "10"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s, err := run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s.Clean || s.OK != 0 || !strings.Contains(s.FirstError, "401") {
		t.Fatalf("summary = %+v, want every delivery refused with 401", s)
	}
}
