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
// may run only redis.ACLCommands on the store's keys, plus +select when
// the test URL names a database other than 0 (go-redis selects it on every
// new connection): the rule the README gives operators covers every
// command the store sends.
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
	if admin.Options().DB != 0 {
		args = append(args, aclSelect)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "ACL", "DELUSER", user).Err() })

	storetest.Run(t, func(t *testing.T) storetest.Instance {
		opt := admin.Options()
		limited := *opt
		limited.Username, limited.Password = user, pass
		limited.ReadTimeout, limited.WriteTimeout = contextOnly, contextOnly // Options() holds 0 for them, which is 3s again
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

// aclSelect is what the README adds to redis.ACLCommands for a URL that
// names a database other than 0, and what TestConformanceACLUser adds then.
const aclSelect = "+select"

// TestREADMEQuotesTheACL keeps the README's ACL rule the one tested above,
// including the +select it asks for on a database other than 0.
func TestREADMEQuotesTheACL(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"`" + redis.ACLCommands + "`",
		"plus `" + aclSelect + "` when the URL names a database other than 0",
	} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not say %s", want)
		}
	}
}
