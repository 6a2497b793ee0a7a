// Command upstream is a tiny app for the gateway's end-to-end tests: it
// counts how often it executed each request and tells what it received.
//
//	go run ./test/upstream -addr 127.0.0.1:3000
//
// It prints {"listening":"<addr>"} once it listens. Every request except
// GET /_counts is an execution, counted under its X-Test-Case header (or
// "<method> <path>" without one) and answered with a JSON echo:
//
//	{"case","execution","method","uri","headers","body"}
//
// with 201, or 303 to /orders/<n> for paths under /checkout (a form's
// answer), or 500 for the first execution of a case sent with
// X-Test-Fail-First (a transient failure). GET /_counts answers the
// counts as {"<case>": n}.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxBody bounds the request bodies it reads.
const maxBody = 1 << 20

type app struct {
	mu     sync.Mutex
	counts map[string]int
	total  int
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/_counts" {
		a.mu.Lock()
		data, _ := json.Marshal(a.counts)
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(data)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	name := r.Header.Get("X-Test-Case")
	if name == "" {
		name = r.Method + " " + r.URL.Path
	}
	a.mu.Lock()
	a.counts[name]++
	a.total++
	n, total := a.counts[name], a.total
	a.mu.Unlock()

	data, _ := json.Marshal(map[string]any{
		"case": name, "execution": n, "method": r.Method, "uri": r.URL.RequestURI(),
		"headers": r.Header, "body": string(body),
	})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(data)))
	h.Set("X-Upstream", "1")
	status := http.StatusCreated
	switch {
	case r.Header.Get("X-Test-Fail-First") != "" && n == 1:
		status = http.StatusInternalServerError
	case strings.HasPrefix(r.URL.Path, "/checkout"):
		h.Set("Location", fmt.Sprintf("/orders/%d", total))
		status = http.StatusSeeOther
	}
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	line, _ := json.Marshal(map[string]string{"listening": ln.Addr().String()})
	fmt.Fprintln(os.Stdout, string(line))
	srv := &http.Server{Handler: &app{counts: map[string]int{}}, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.Serve(ln))
}
