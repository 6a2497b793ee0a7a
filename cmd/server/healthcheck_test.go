package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHealthcheckURL(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"", "http://127.0.0.1:8080/healthz"},
		{"auto", "http://127.0.0.1:8080/healthz"},
		{":8080", "http://127.0.0.1:8080/healthz"},
		{"0.0.0.0:9000", "http://127.0.0.1:9000/healthz"},
		{"[::]:9000", "http://127.0.0.1:9000/healthz"},
		{"127.0.0.1:8080", "http://127.0.0.1:8080/healthz"},
		{"[::1]:8080", "http://[::1]:8080/healthz"},
		{"localhost:8080", "http://localhost:8080/healthz"},
	} {
		got, err := healthcheckURL(tc.addr)
		if err != nil || got != tc.want {
			t.Errorf("healthcheckURL(%q) = %q, %v; want %q", tc.addr, got, err, tc.want)
		}
	}
	if _, err := healthcheckURL("8080"); err == nil {
		t.Error("healthcheckURL(8080) succeeded, want an error: no port")
	}
}

// TestHealthcheck probes servers that answer 200, answer 500, hang, or
// are not there: only the first is healthy, and a hanging one is given up
// on within healthcheckTimeout.
func TestHealthcheck(t *testing.T) {
	serve := func(h http.HandlerFunc) string {
		s := httptest.NewServer(h)
		t.Cleanup(s.Close)
		_, port, _ := net.SplitHostPort(s.Listener.Addr().String())
		return ":" + port // an unspecified host, as compose and Kubernetes set it
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	for _, tc := range []struct {
		name, addr string
		want       int
	}{
		{"healthy", serve(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/healthz" {
				http.NotFound(w, r)
			}
		}), 0},
		{"answers 500", serve(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }), 1},
		{"hangs", serve(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}), 1},
		{"not listening", closed, 1},
		{"bad address", "nonsense", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			start := time.Now()
			code := command([]string{"-healthcheck"}, func(k string) string {
				if k == "REPLAYGUARD_ADDR" {
					return tc.addr
				}
				return ""
			}, &out, &errOut)
			// Bounded by the timeout (the hanging server never answers);
			// as long again is for a loaded machine.
			if d := time.Since(start); d > 2*healthcheckTimeout {
				t.Errorf("took %v, want at most %v (and as long again for a loaded machine)", d, healthcheckTimeout)
			}
			if code != tc.want {
				t.Errorf("exit %d, want %d; stdout %q, stderr %q", code, tc.want, out.String(), errOut.String())
			}
			if line := out.String() + errOut.String(); !strings.HasPrefix(line, "healthcheck: ") {
				t.Errorf("output %q, want one healthcheck: line", line)
			}
		})
	}
}

// TestHealthcheckOfARunningServer runs the binary's -healthcheck, as the
// compose file and the image do, against the server in a subprocess; the
// -addr flag wins over REPLAYGUARD_ADDR as it does for the server.
func TestHealthcheckOfARunningServer(t *testing.T) {
	_, addr, _ := server(t)
	_, port, _ := net.SplitHostPort(addr)
	if _, stderr, code := runMain(t, []string{"-healthcheck"}, "REPLAYGUARD_ADDR=:"+port); code != 0 {
		t.Fatalf("-healthcheck of :%s: exit %d, %s", port, code, stderr)
	}
	if _, stderr, code := runMain(t, []string{"-healthcheck", "-addr", addr}, "REPLAYGUARD_ADDR=127.0.0.1:1"); code != 0 {
		t.Fatalf("-healthcheck -addr %s: exit %d, %s", addr, code, stderr)
	}
	if _, _, code := runMain(t, []string{"-healthcheck"}, "REPLAYGUARD_ADDR=127.0.0.1:1"); code != 1 {
		t.Fatalf("-healthcheck of a closed port: exit %d, want 1", code)
	}
}
