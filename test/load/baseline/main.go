// Command baseline is the floor the load program (test/load) compares
// Replayguard with: the least a Gin service can do to hand out and
// consume single-use tokens in Redis.
//
//	POST /v1/tokens         128-bit random hex ID, SET NX EX 300,
//	                        201 {"token": "<id>"}
//	POST /v1/tokens/redeem  GETDEL of the Idempotency-Token header:
//	                        200 {"status":"redeemed"}, or 409 when absent
//	POST /noop              204
//
// It uses gin.New() with no middleware (no logging, no recovery, no
// request IDs), no signatures and no metrics, so that the difference to
// Replayguard is the cost of what Replayguard adds. It is a benchmark
// fixture, not a service: do not deploy it.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	goredis "github.com/redis/go-redis/v9"
)

// keyPrefix starts every key the baseline writes.
const keyPrefix = "baseline:t:"

// tokenTTL is how long an issued ID lives.
const tokenTTL = 300 * time.Second

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	redisAddr := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL (redis://host:port/db) or host:port")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *redisAddr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "baseline:", err)
		os.Exit(1)
	}
}

// run serves until ctx ends. onListen, when set, receives the bound
// address.
func run(ctx context.Context, addr, redisAddr string, onListen func(string)) error {
	opts, err := redisOptions(redisAddr)
	if err != nil {
		return err
	}
	client := goredis.NewClient(opts)
	defer client.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: newRouter(client), ReadHeaderTimeout: 5 * time.Second}
	if onListen != nil {
		onListen(ln.Addr().String())
	}
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

func redisOptions(s string) (*goredis.Options, error) {
	if strings.Contains(s, "://") {
		return goredis.ParseURL(s)
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		return nil, fmt.Errorf("-redis %q: want redis://host:port/db or host:port", s)
	}
	return &goredis.Options{Addr: s}, nil
}

type issued struct {
	Token string `json:"token"`
}

type redeemed struct {
	Status string `json:"status"`
}

type problem struct {
	Code string `json:"code"`
}

// newRouter returns the baseline's routes on gin.New() without middleware.
func newRouter(rdb goredis.UniversalClient) *gin.Engine {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/v1/tokens", func(c *gin.Context) {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			c.JSON(http.StatusInternalServerError, problem{"internal_error"})
			return
		}
		id := hex.EncodeToString(b[:])
		created, err := rdb.SetNX(c.Request.Context(), keyPrefix+id, "1", tokenTTL).Result()
		switch {
		case err != nil:
			c.JSON(http.StatusServiceUnavailable, problem{"store_unavailable"})
		case !created:
			c.JSON(http.StatusServiceUnavailable, problem{"id_collision"})
		default:
			c.JSON(http.StatusCreated, issued{id})
		}
	})
	r.POST("/v1/tokens/redeem", func(c *gin.Context) {
		id := c.GetHeader("Idempotency-Token")
		if id == "" {
			c.JSON(http.StatusBadRequest, problem{"invalid_request"})
			return
		}
		err := rdb.GetDel(c.Request.Context(), keyPrefix+id).Err()
		switch {
		case errors.Is(err, goredis.Nil):
			c.JSON(http.StatusConflict, problem{"token_used"})
		case err != nil:
			c.JSON(http.StatusServiceUnavailable, problem{"store_unavailable"})
		default:
			c.JSON(http.StatusOK, redeemed{"redeemed"})
		}
	})
	r.POST("/noop", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	return r
}
