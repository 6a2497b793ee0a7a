// Command app is the protected application of the gateway benchmark
// (test/load/gateway.sh): the bare handler that Replayguard's gateway is
// compared with, and the upstream it proxies to.
//
//	go run ./test/load/app -addr 127.0.0.1:3000
//
// Every POST, to any path, is one execution of "create an order": it reads
// the request body (at most 64 KiB) and answers 201 with a Location of
// /orders/<n> and a JSON body of about 200 bytes that carries n, the
// number of the execution, so that a replayed answer can be told from a
// new one. GET /_count answers {"executions": n}. Other methods get 405.
//
// It is plain net/http with no middleware, no logging and no store: a
// benchmark fixture, not a service.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// maxBody bounds the request bodies the app reads.
const maxBody = 64 << 10

func main() {
	addr := flag.String("addr", "127.0.0.1:3000", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr); err != nil {
		fmt.Fprintln(os.Stderr, "app:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends.
func run(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: &app{}, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// app creates "orders": it only counts them.
type app struct {
	executions atomic.Int64
}

// orderBody is the answer's JSON, about 200 bytes once n is filled in.
const orderBody = `{"id":%d,"status":"created","item":"load-test","quantity":1,"currency":"EUR","amount_cents":1999,` +
	`"customer":"cus_0000000000000000","created_at":"2026-01-01T00:00:00Z","links":{"self":"/orders/%d"}}`

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/_count":
		body := `{"executions":` + strconv.FormatInt(a.executions.Load(), 10) + "}\n"
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
		return
	case r.Method != http.MethodPost:
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxBody)); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "reading body", http.StatusBadRequest)
		return
	}
	n := a.executions.Add(1)
	body := fmt.Sprintf(orderBody, n, n)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Location", "/orders/"+strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, body)
}
