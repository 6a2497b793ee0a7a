package integration

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/token"
)

// TestFullRedis fills a Redis with the noeviction policy to its maxmemory:
// new tokens and new records are refused with 503 store_full, and the
// tokens issued before still redeem once: nothing live was evicted to
// make room.
func TestFullRedis(t *testing.T) {
	bin := redisServerBinary(t)
	port := freePort(t)
	startRedis(t, bin, port, t.TempDir(), "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	addr := "127.0.0.1:" + strconv.Itoa(port)
	st := redisstore.New(goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true}), redisstore.WithPrefix(uniquePrefix(t)))
	s := startServer(t, st, serverConfig{apiOpts: []handlers.Option{handlers.WithRecords(idempotency.New(st))}})

	var live []issued
	for range 20 {
		live = append(live, s.issue(t, ""))
	}

	// Fill the rest of its memory from the side, as other tenants would.
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()
	// Ever smaller values, until not even a small write fits.
	n := 0
	for _, size := range []int{64 << 10, 4 << 10, 256, 16} {
		for ; ; n++ {
			if n > 100_000 {
				t.Fatal("Redis never reported OOM")
			}
			err := admin.Set(ctx, "filler:"+strconv.Itoa(n), strings.Repeat("f", size), 0).Err()
			if err == nil {
				continue
			}
			if !strings.HasPrefix(err.Error(), "OOM ") {
				t.Fatalf("filling: %v", err)
			}
			break
		}
	}

	wantProblem(t, s.do(t, http.MethodPost, "/v1/tokens", ""), http.StatusServiceUnavailable, "store_full")
	// A redemption that would open a record needs room: refused, and the
	// token stays for later.
	wantProblem(t, s.redeem(t, live[0].Token, `{"record":true}`), http.StatusServiceUnavailable, "store_full")
	// Every token issued before was kept, and redeems once.
	for _, is := range live {
		wantRedeemed(t, s.redeem(t, is.Token, ""), is.ID, token.DefaultPurpose, "")
		wantProblem(t, s.redeem(t, is.Token, ""), http.StatusConflict, "token_used")
	}
}
