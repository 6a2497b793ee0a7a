package redis_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/store/storetest"
)

// TestConformanceACLUser runs the conformance suite as a Redis user that
// may run only redis.ACLCommands on the store's keys: the rule the README
// gives operators covers every command the store sends.
func TestConformanceACLUser(t *testing.T) {
	admin := newRedisClient(t)
	t.Cleanup(func() { _ = admin.Close() })
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	user, pass := "rgtest-acl-"+hex.EncodeToString(b), hex.EncodeToString(b)+"-pw"
	ctx := context.Background()
	// uniquePrefix keys begin with "rgtest:".
	args := []any{"ACL", "SETUSER", user, "reset", "on", ">" + pass, "~rgtest:*", "~rate:rgtest:*"}
	for _, c := range strings.Fields(redis.ACLCommands) {
		args = append(args, c)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "ACL", "DELUSER", user).Err() })

	storetest.Run(t, func(t *testing.T) storetest.Instance {
		opt := admin.Options()
		limited := *opt
		limited.Username, limited.Password = user, pass
		client := goredis.NewClient(&limited)
		t.Cleanup(func() { _ = client.Close() })
		s := redis.New(client, redis.WithPrefix(uniquePrefix(t)), redis.WithTimeout(loadedTimeout))
		// TTLs are read as the admin: PTTL is not the store's to send.
		return storetest.Instance{
			Store: s, Limiter: s, Now: time.Now, Advance: time.Sleep,
			TTL: pttl(t, admin, s.TokenKey), RecordTTL: pttl(t, admin, s.RecordKey),
		}
	})
}

// TestREADMEQuotesTheACL keeps the README's ACL rule the one tested above.
func TestREADMEQuotesTheACL(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "`"+redis.ACLCommands+"`") {
		t.Fatalf("README.md does not quote redis.ACLCommands: `%s`", redis.ACLCommands)
	}
}
