package main

import (
	"context"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/internal/testenv"
	redisstore "github.com/replayguard/replayguard/store/redis"
)

// The shared Sentinel deployment of CI (.ci/run).
const (
	envTestSentinelAddrs  = "REPLAYGUARD_TEST_REDIS_SENTINEL_ADDRS"
	envTestSentinelMaster = "REPLAYGUARD_TEST_REDIS_SENTINEL_MASTER"
)

func TestSentinelSettings(t *testing.T) {
	dir := t.TempDir()
	secretFile := func(name, value string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sentinelPass, redisPass := secretFile("sentinel-pass", "s3cret-sentinel"), secretFile("redis-pass", "s3cret-redis")

	t.Run("defaults", func(t *testing.T) {
		c, err := loadConfig(nil, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		if c.RedisSentinel != nil || c.RedisSentinelMaster != "" || c.RedisMinReplicas != redisstore.DefaultMinReplicas {
			t.Fatalf("defaults = %+v", c)
		}
	})

	t.Run("variables, files and flags", func(t *testing.T) {
		env := map[string]string{
			"REPLAYGUARD_REDIS_SENTINEL_ADDRS":         "10.0.0.1:26379, 10.0.0.2:26379,10.0.0.3:26379",
			"REPLAYGUARD_REDIS_SENTINEL_MASTER":        "mymaster",
			"REPLAYGUARD_REDIS_SENTINEL_PASSWORD_FILE": sentinelPass,
			"REPLAYGUARD_REDIS_USERNAME":               "replayguard",
			"REPLAYGUARD_REDIS_PASSWORD_FILE":          redisPass,
			"REPLAYGUARD_STORE_TIMEOUT":                "250ms",
		}
		c, err := loadConfig([]string{"-redis-min-replicas", "2"}, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		o := c.failoverOptions()
		if strings.Join(o.SentinelAddrs, ",") != "10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379" || o.MasterName != "mymaster" ||
			o.SentinelPassword != "s3cret-sentinel" || o.Username != "replayguard" || o.Password != "s3cret-redis" ||
			c.RedisMinReplicas != 2 {
			t.Fatalf("config %+v, failover options %+v", c, o)
		}
		// As the other Redis settings: every I/O bounded by the store timeout.
		if !o.ContextTimeoutEnabled || o.DialTimeout != 250*time.Millisecond || o.ReadTimeout != 250*time.Millisecond ||
			o.WriteTimeout != 250*time.Millisecond || o.PoolTimeout != 250*time.Millisecond {
			t.Fatalf("failover timeouts %+v", o)
		}
	})

	t.Run("min replicas with a single server or a cluster", func(t *testing.T) {
		for _, env := range []map[string]string{
			{"REPLAYGUARD_REDIS_URL": "redis://10.0.0.1:6379/0", "REPLAYGUARD_REDIS_MIN_REPLICAS": "1"},
			{"REPLAYGUARD_REDIS_CLUSTER_ADDRS": "10.0.0.1:7000", "REPLAYGUARD_REDIS_MIN_REPLICAS": "1"},
		} {
			if c, err := loadConfig(nil, func(k string) string { return env[k] }); err != nil || c.RedisMinReplicas != 1 {
				t.Fatalf("%v: %+v, %v", env, c, err)
			}
		}
	})

	sentinel := map[string]string{"REPLAYGUARD_REDIS_SENTINEL_ADDRS": "10.0.0.1:26379", "REPLAYGUARD_REDIS_SENTINEL_MASTER": "mymaster"}
	with := func(kv ...string) map[string]string {
		env := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			env[kv[i]] = kv[i+1]
		}
		return env
	}
	plus := func(base map[string]string, kv ...string) map[string]string {
		env := with(kv...)
		for k, v := range base {
			env[k] = v
		}
		return env
	}
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"sentinels without the master's name", with("REPLAYGUARD_REDIS_SENTINEL_ADDRS", "10.0.0.1:26379"),
			"REPLAYGUARD_REDIS_SENTINEL_ADDRS is set but REPLAYGUARD_REDIS_SENTINEL_MASTER is not"},
		{"the master's name without sentinels", with("REPLAYGUARD_REDIS_SENTINEL_MASTER", "mymaster"),
			"REPLAYGUARD_REDIS_SENTINEL_MASTER is set but REPLAYGUARD_REDIS_SENTINEL_ADDRS is not"},
		{"a sentinel that is not host:port", with("REPLAYGUARD_REDIS_SENTINEL_ADDRS", "10.0.0.1", "REPLAYGUARD_REDIS_SENTINEL_MASTER", "m"),
			"REPLAYGUARD_REDIS_SENTINEL_ADDRS: \"10.0.0.1\" is not host:port"},
		{"sentinel and a URL", plus(sentinel, "REPLAYGUARD_REDIS_URL", "redis://:s3cret@10.0.0.1:6379/0"),
			"REPLAYGUARD_REDIS_URL and REPLAYGUARD_REDIS_SENTINEL_ADDRS are all set: choose one"},
		{"sentinel and cluster seeds", plus(sentinel, "REPLAYGUARD_REDIS_CLUSTER_ADDRS", "10.0.0.1:7000"),
			"REPLAYGUARD_REDIS_CLUSTER_ADDRS and REPLAYGUARD_REDIS_SENTINEL_ADDRS are all set: choose one"},
		{"sentinel and a cluster URL", plus(sentinel, "REPLAYGUARD_REDIS_CLUSTER_URL", "redis://10.0.0.1:7000"),
			"REPLAYGUARD_REDIS_CLUSTER_URL and REPLAYGUARD_REDIS_SENTINEL_ADDRS are all set: choose one"},
		{"a master's name and a URL", with("REPLAYGUARD_REDIS_SENTINEL_MASTER", "m", "REPLAYGUARD_REDIS_URL", "redis://10.0.0.1:6379/0"),
			"REPLAYGUARD_REDIS_URL and REPLAYGUARD_REDIS_SENTINEL_MASTER are all set: choose one"},
		{"a Redis password without sentinel", with("REPLAYGUARD_REDIS_URL", "redis://10.0.0.1:6379/0", "REPLAYGUARD_REDIS_PASSWORD", "s3cret"),
			"REPLAYGUARD_REDIS_PASSWORD is set but REPLAYGUARD_REDIS_SENTINEL_ADDRS is not"},
		{"a Redis password file without sentinel", with("REPLAYGUARD_REDIS_PASSWORD_FILE", redisPass),
			"REPLAYGUARD_REDIS_PASSWORD is set but REPLAYGUARD_REDIS_SENTINEL_ADDRS is not"},
		{"a sentinel password without sentinel", with("REPLAYGUARD_REDIS_SENTINEL_PASSWORD", "s3cret"),
			"REPLAYGUARD_REDIS_SENTINEL_PASSWORD is set but REPLAYGUARD_REDIS_SENTINEL_ADDRS is not"},
		{"a username without sentinel", with("REPLAYGUARD_REDIS_USERNAME", "rg"),
			"REPLAYGUARD_REDIS_USERNAME is set but REPLAYGUARD_REDIS_SENTINEL_ADDRS is not"},
		{"a missing password file", plus(sentinel, "REPLAYGUARD_REDIS_PASSWORD_FILE", filepath.Join(dir, "nope")),
			"REPLAYGUARD_REDIS_PASSWORD_FILE:"},
		{"negative min replicas", plus(sentinel, "REPLAYGUARD_REDIS_MIN_REPLICAS", "-1"),
			"REPLAYGUARD_REDIS_MIN_REPLICAS: must be an integer of 0 or more"},
		{"min replicas not a number", plus(sentinel, "REPLAYGUARD_REDIS_MIN_REPLICAS", "one"),
			"REPLAYGUARD_REDIS_MIN_REPLICAS: must be an integer of 0 or more"},
		{"min replicas on the memory store", with("REPLAYGUARD_REDIS_MIN_REPLICAS", "1"),
			"REPLAYGUARD_REDIS_MIN_REPLICAS is above 0 but no Redis is set"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfig(nil, func(k string) string { return tc.env[k] })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("the error quotes a password: %v", err)
			}
		})
	}
}

// wantRedeems redeems tok at base and requires the statuses in order.
func wantRedeems(t *testing.T, base, tok string, statuses ...int) {
	t.Helper()
	for i, want := range statuses {
		r := try(newReq(t, "POST", base+"/v1/tokens/redeem", "", "Idempotency-Token", tok))
		if r.status != want {
			t.Fatalf("redeem %d = %d %s, want %d", i+1, r.status, r.body, want)
		}
	}
}

// TestSentinel runs the server on the shared Sentinel deployment, with
// every change confirmed by its replica.
func TestSentinel(t *testing.T) {
	addrs := testenv.Var(t, envTestSentinelAddrs)
	master := testenv.Var(t, envTestSentinelMaster)
	_, addr, out := server(t,
		"REPLAYGUARD_REDIS_SENTINEL_ADDRS="+addrs, "REPLAYGUARD_REDIS_SENTINEL_MASTER="+master,
		"REPLAYGUARD_REDIS_MIN_REPLICAS=1", "REPLAYGUARD_STORE_TIMEOUT=5s",
		"REPLAYGUARD_KEY_PREFIX=rgtest:sentinel:"+randomHex(t)+":")
	if rec := out.waitForLog(t, 0, "store: redis sentinel"); rec["master"] != master {
		t.Fatalf("log = %v", rec)
	}
	base := "http://" + addr
	if r := try(newReq(t, "GET", base+"/readyz", "")); r.status != http.StatusOK {
		t.Fatalf("readyz = %d %s", r.status, r.body)
	}
	tok, _ := issueToken(t, base, "default")
	wantRedeems(t, base, tok, http.StatusOK, http.StatusConflict)
}

// TestSentinelCredentials runs the server on a private Sentinel deployment
// whose sentinels, master and replica all require a password, as a Redis
// ACL user with redis.ACLCommands and +wait, with every password read
// from a file; a wrong sentinel password leaves the store unavailable.
// No password reaches the logs.
func TestSentinelCredentials(t *testing.T) {
	s := testenv.StartSentinel(t, testenv.RedisServer(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// do runs a command as the admin: with the password once it is set.
	do := func(addr string, args ...any) any {
		t.Helper()
		c := goredis.NewClient(&goredis.Options{Addr: addr, Password: "s3cret-admin", DisableIdentity: true})
		defer c.Close()
		v, err := c.Do(ctx, args...).Result()
		if err != nil && strings.Contains(err.Error(), "without any password configured") {
			c = goredis.NewClient(&goredis.Options{Addr: addr, DisableIdentity: true})
			defer c.Close()
			v, err = c.Do(ctx, args...).Result()
		}
		if err != nil {
			t.Fatalf("%s %v: %v", addr, args, err)
		}
		return v
	}
	// The sentinels learn the data nodes' password first, so they never
	// lose sight of them; then the nodes require it; then the sentinels
	// require their own (and give it to each other).
	for _, sn := range s.SentinelAddrs() {
		do(sn, "SENTINEL", "SET", s.MasterName, "auth-pass", "s3cret-admin")
	}
	do(s.Replica().Addr(), "CONFIG", "SET", "masterauth", "s3cret-admin")
	aclUser := []any{"ACL", "SETUSER", "replayguard", "reset", "on", ">s3cret-redis", "~rgtest:*", "~rate:rgtest:*", "+wait"}
	for _, c := range strings.Fields(redisstore.ACLCommands) {
		aclUser = append(aclUser, c)
	}
	for _, n := range []string{s.Master().Addr(), s.Replica().Addr()} {
		do(n, aclUser...)
		do(n, "CONFIG", "SET", "requirepass", "s3cret-admin")
	}
	for _, sn := range s.SentinelAddrs() {
		do(sn, "SENTINEL", "CONFIG", "SET", "sentinel-pass", "s3cret-sentinel")
		do(sn, "ACL", "SETUSER", "default", "resetpass", ">s3cret-sentinel")
	}
	// After its first sync the replica counts for WAIT only once it has
	// acknowledged it, up to a second after it reports its link up.
	if n := do(s.Master().Addr(), "WAIT", "1", "20000"); n != int64(1) {
		t.Fatalf("WAIT 1 = %v: the replica is not online", n)
	}
	dir := t.TempDir()
	file := func(name, value string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	env := func(sentinelPass string) []string {
		return []string{
			"REPLAYGUARD_REDIS_SENTINEL_ADDRS=" + strings.Join(s.SentinelAddrs(), ","),
			"REPLAYGUARD_REDIS_SENTINEL_MASTER=" + s.MasterName,
			"REPLAYGUARD_REDIS_SENTINEL_PASSWORD_FILE=" + file("sentinel-pass-"+sentinelPass, sentinelPass),
			"REPLAYGUARD_REDIS_USERNAME=replayguard",
			"REPLAYGUARD_REDIS_PASSWORD_FILE=" + file("redis-pass", "s3cret-redis"),
			"REPLAYGUARD_REDIS_MIN_REPLICAS=1",
			"REPLAYGUARD_STORE_TIMEOUT=2s",
			"REPLAYGUARD_KEY_PREFIX=rgtest:creds:",
		}
	}

	t.Run("right passwords", func(t *testing.T) {
		_, addr, out := server(t, env("s3cret-sentinel")...)
		base := "http://" + addr
		if r := try(newReq(t, "GET", base+"/readyz", "")); r.status != http.StatusOK {
			t.Fatalf("readyz = %d %s\n%s", r.status, r.body, out.String())
		}
		tok, _ := issueToken(t, base, "default")
		wantRedeems(t, base, tok, http.StatusOK, http.StatusConflict)
		if logs := out.String(); strings.Contains(logs, "s3cret") {
			t.Fatalf("a password reached the logs:\n%s", logs)
		}
	})

	t.Run("wrong sentinel password", func(t *testing.T) {
		_, addr, out := server(t, env("wrong-sentinel-password")...)
		if r := try(newReq(t, "POST", "http://"+addr+"/v1/tokens", "")); r.status != http.StatusServiceUnavailable || r.code() != "store_unavailable" {
			t.Fatalf("issue = %d %s", r.status, r.body)
		}
		if logs := out.String(); strings.Contains(logs, "wrong-sentinel-password") {
			t.Fatalf("a password reached the logs:\n%s", logs)
		}
	})
}

// TestMinReplicasWithoutReplica runs the server with
// REPLAYGUARD_REDIS_MIN_REPLICAS=1 on a single Redis that has no replica,
// in gateway mode in front of an app: issue, redeem and the protected
// route answer 503 store_unavailable within the store timeout (and as
// long again for a loaded machine), and the app never runs. The redemption happened on the master
// all the same, unconfirmed: its token is used up.
func TestMinReplicasWithoutReplica(t *testing.T) {
	r := testenv.StartRedis(t, testenv.RedisServer(t))
	up := startUpstream(t, buildUpstream(t))
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - {match: \"POST /checkout\", policy: token, purpose: checkout}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The gateway under test waits out each WAIT, less 150ms: the
	// script before it must still finish inside the timeout on a loaded
	// machine, for the redemption to be made; the issuer's calls must
	// succeed, and get as long as they need.
	const timeout = 2 * time.Second
	common := []string{
		"REPLAYGUARD_REDIS_URL=redis://" + r.Addr() + "/0",
		"REPLAYGUARD_KEY_PREFIX=rgtest:noreplica:",
		"REPLAYGUARD_SIGNING_KEYS=k1:" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32))),
		"REPLAYGUARD_UPSTREAM=http://" + up.addr,
		"REPLAYGUARD_ROUTES=" + routes,
	}
	// An instance that needs no replica issues the tokens; the one under
	// test shares its Redis, prefix and keys.
	issuer := startGateway(t, append(common, "REPLAYGUARD_STORE_TIMEOUT=10s")...)
	tok, _ := issueToken(t, issuer, "default")
	checkoutTok, _ := issueToken(t, issuer, "checkout")
	gw := startGateway(t, append(common, "REPLAYGUARD_REDIS_MIN_REPLICAS=1", "REPLAYGUARD_STORE_TIMEOUT="+timeout.String())...)

	tests := []struct {
		name string
		req  *http.Request
	}{
		{"issue", newReq(t, "POST", gw+"/v1/tokens", "")},
		{"redeem", newReq(t, "POST", gw+"/v1/tokens/redeem", "", "Idempotency-Token", tok)},
		{"protected route", newReq(t, "POST", gw+"/checkout", "item=book&idempotency_token="+checkoutTok,
			"Content-Type", "application/x-www-form-urlencoded", "X-Test-Case", "checkout")},
	}
	for _, tc := range tests {
		start := time.Now()
		res := try(tc.req)
		took := time.Since(start)
		t.Logf("%s: %d in %v", tc.name, res.status, took.Round(time.Millisecond))
		if res.status != http.StatusServiceUnavailable || res.code() != "store_unavailable" {
			t.Errorf("%s = %d %s, want 503 store_unavailable", tc.name, res.status, res.body)
		}
		if took > 2*timeout {
			t.Errorf("%s took %v, want the store timeout (%v), and as long again for a loaded machine, at most", tc.name, took, timeout)
		}
	}
	up.wantCount(t, "checkout", 0)
	// Neither token comes back: each was redeemed on the master, and
	// only its confirmation failed.
	wantRedeems(t, issuer, tok, http.StatusConflict)
	res := try(newReq(t, "POST", issuer+"/v1/tokens/redeem?purpose=checkout", "", "Idempotency-Token", checkoutTok))
	if res.status == http.StatusOK {
		t.Errorf("the gateway's unconfirmed redemption came back: %d %s", res.status, res.body)
	}
	up.wantCount(t, "checkout", 0)
	// A replica makes the instance whole again.
	testenv.StartRedis(t, testenv.RedisServer(t), "--replicaof", "127.0.0.1", strconv.Itoa(r.Port()))
	var last result
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if last = try(newReq(t, "POST", gw+"/v1/tokens", "")); last.status == http.StatusCreated {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("issue with a replica attached = %d %s", last.status, last.body)
		case <-time.After(50 * time.Millisecond): // polling the replica's sync
		}
	}
}
