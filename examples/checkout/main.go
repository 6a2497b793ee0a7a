// Command checkout is a small Gin shop whose order form is protected end to
// end: the Replayguard browser SDK keeps one token per form and swallows
// double clicks and repeated Enter presses, Guard.RequireToken places each
// token's order once, and a placed order answers 303 See Other to its page
// (Post-Redirect-Get), so neither Reload nor Back sends it again.
//
// Run it with
//
//	go run ./examples/checkout
//
// and open http://127.0.0.1:8090/ (or /fetch-demo for the same form sent
// with ReplayGuard.submit). It keeps its tokens in the embedded memory
// store and signs them with a random key, unless REPLAYGUARD_SIGNING_KEYS
// is set. The application itself is package shop, which the browser tests
// in test/browser run in-process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/replayguard/replayguard/examples/checkout/shop"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr, nil); err != nil && !errors.Is(err, flag.ErrHelp) {
		log.Fatal(err)
	}
}

// run serves the shop until ctx ends. onListen, when set, receives the
// bound address.
func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer, onListen func(addr string)) error {
	fs := flag.NewFlagSet("checkout", flag.ContinueOnError)
	fs.SetOutput(out)
	addr := fs.String("addr", "127.0.0.1:8090", "listen address")
	delay := fs.Duration("delay", 0, "hold every order this long before placing it, as a slow payment would (try 2s, then double-click)")
	if err := fs.Parse(args); err != nil {
		return err
	}

	gin.SetMode(gin.ReleaseMode)
	app, err := shop.New(shop.Options{Delay: *delay, SigningKeys: getenv("REPLAYGUARD_SIGNING_KEYS")})
	if err != nil {
		return err
	}
	defer app.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: app, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(out, "checkout: open http://%s/\n", ln.Addr())
	if onListen != nil {
		onListen(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}
