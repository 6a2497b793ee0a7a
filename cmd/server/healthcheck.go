package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// healthcheckTimeout bounds the whole probe, connecting included: under
// the 3s timeout docker-compose.yml gives it.
const healthcheckTimeout = 2 * time.Second

// healthcheckURL is the /healthz URL of a server listening on addr (a
// REPLAYGUARD_ADDR value): auto is port 8080, and an unspecified host
// (":8080", "0.0.0.0:8080", "[::]:8080") is 127.0.0.1, which a server on
// every interface also listens on.
func healthcheckURL(addr string) (string, error) {
	if addr == "" || addr == autoValue {
		addr = devAddr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("REPLAYGUARD_ADDR %q: %w", addr, err)
	}
	if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/healthz", nil
}

// healthcheck probes the server at addr and returns the exit code: 0 when
// GET /healthz answers 200 within healthcheckTimeout, else 1, with one
// line on out or errOut saying which.
func healthcheck(ctx context.Context, addr string, out, errOut io.Writer) int {
	u, err := healthcheckURL(addr)
	if err != nil {
		fmt.Fprintf(errOut, "healthcheck: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		fmt.Fprintf(errOut, "healthcheck: %v\n", err)
		return 1
	}
	// No proxy from the environment: the probe is of this host's server.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintf(errOut, "healthcheck: %v\n", err)
		return 1
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(errOut, "healthcheck: GET %s: %s\n", u, resp.Status)
		return 1
	}
	fmt.Fprintf(out, "healthcheck: GET %s: %s\n", u, resp.Status)
	return 0
}
