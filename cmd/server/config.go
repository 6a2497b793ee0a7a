package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/fileread"
	"github.com/replayguard/replayguard/internal/size"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/token"
)

// maxSecretFile bounds a *_FILE setting's file: a secret (keys, a URL, a
// password) is a few KiB at most, and a wrong path (a log, a device) must
// fail with a clear error rather than fill the memory.
const maxSecretFile = 1 << 20

// config is the server's configuration, from flags, then environment
// variables, then defaults.
type config struct {
	Addr string
	// LoopbackOnly: Addr was auto and, with no signing keys and no API
	// keys (the development setup), became devAddr.
	LoopbackOnly bool
	SigningKeys  []token.Key
	APIKeys      []string
	AdminKeys    []string
	MachineID    *uint16
	TokenTTL     time.Duration
	TokenMaxTTL  time.Duration
	ClientKeys   string
	ReplayWindow time.Duration
	// Idempotency records (the gateway's, and later the API's).
	IdempotencyLockTTL   time.Duration
	IdempotencyGrace     time.Duration // 0: one lock TTL
	IdempotencyRetention time.Duration
	IdempotencyMaxBody   int
	PerCaller            int                        // records per caller and retention; -1: auto
	PerAddress           int                        // records per client address and retention; -1: auto
	BytesPerAddress      int64                      // bytes of records per client address and retention; -1: auto
	IdempotencyScope     func(*http.Request) string // nil: the client IP
	FingerprintWindow    time.Duration
	// Gateway mode: Upstream nil means off.
	Upstream        *url.URL
	RoutesPath      string
	Routes          []gateway.Route
	RedisURL        *goredis.Options
	RedisCluster    []string
	RedisClusterURL *goredis.ClusterOptions
	// Sentinel: the sentinels, the master's name, and the credentials
	// for the sentinels and for the master and replicas.
	RedisSentinel         []string
	RedisSentinelMaster   string
	RedisSentinelPassword string
	RedisUsername         string
	RedisPassword         string
	RedisMinReplicas      int
	PostgresURL           string // checked by pgxpool.ParseConfig
	KeyPrefix             string
	StoreTimeout          time.Duration
	MemoryMax             int
	MemoryMaxBytes        int64
	IssueRate             store.Limit
	CORSOrigins           []string
	TrustedProxies        []string
	LogLevel              slog.Level
	ShutdownTimeout       time.Duration
}

// storeSettings lists the store settings c has (Redis and PostgreSQL),
// of which one at most may be set. Sentinel counts as one, named by
// whichever of its addresses and master name are set.
func storeSettings(c *config) []string {
	var set []string
	if c.PostgresURL != "" {
		set = append(set, "REPLAYGUARD_POSTGRES_URL")
	}
	if c.RedisURL != nil {
		set = append(set, "REPLAYGUARD_REDIS_URL")
	}
	if len(c.RedisCluster) > 0 {
		set = append(set, "REPLAYGUARD_REDIS_CLUSTER_ADDRS")
	}
	if c.RedisClusterURL != nil {
		set = append(set, "REPLAYGUARD_REDIS_CLUSTER_URL")
	}
	switch {
	case len(c.RedisSentinel) > 0:
		set = append(set, "REPLAYGUARD_REDIS_SENTINEL_ADDRS")
	case c.RedisSentinelMaster != "":
		set = append(set, "REPLAYGUARD_REDIS_SENTINEL_MASTER")
	}
	return set
}

// checkSentinel refuses a Sentinel setting without its pair, and the
// Sentinel credentials without Sentinel: a single server's or a
// cluster's password goes in its URL.
func checkSentinel(c *config) error {
	switch {
	case len(c.RedisSentinel) > 0 && c.RedisSentinelMaster == "":
		return errors.New("REPLAYGUARD_REDIS_SENTINEL_ADDRS is set but REPLAYGUARD_REDIS_SENTINEL_MASTER is not: name the master the sentinels monitor")
	case c.RedisSentinelMaster != "" && len(c.RedisSentinel) == 0:
		return errors.New("REPLAYGUARD_REDIS_SENTINEL_MASTER is set but REPLAYGUARD_REDIS_SENTINEL_ADDRS is not: list the sentinels as host:port")
	case len(c.RedisSentinel) > 0:
		return nil
	}
	for _, s := range []struct {
		name string
		set  bool
	}{
		{"REPLAYGUARD_REDIS_SENTINEL_PASSWORD", c.RedisSentinelPassword != ""},
		{"REPLAYGUARD_REDIS_USERNAME", c.RedisUsername != ""},
		{"REPLAYGUARD_REDIS_PASSWORD", c.RedisPassword != ""},
	} {
		if s.set {
			return fmt.Errorf("%s is set but REPLAYGUARD_REDIS_SENTINEL_ADDRS is not: it is for Sentinel; give a single server's or a cluster's credentials in its URL", s.name)
		}
	}
	return nil
}

// Defaults of the server's own settings; every other default is its
// package's constant.
const (
	defaultShutdownTimeout = 8 * time.Second
	// REPLAYGUARD_ADDR's auto: devAddr, loopback only, when neither
	// signing keys nor API keys are set (a server anyone who reaches it
	// can use, and whose tokens no other instance accepts), else addr.
	devAddr     = "127.0.0.1:8080"
	defaultAddr = ":8080"
)

// duration writes d as a setting's default: the shortest Go duration that
// parses back to it (5m, not 5m0s).
func duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// rate writes l as REPLAYGUARD_ISSUE_RATE does: N/s, N/m or N/h.
func rate(l store.Limit) string {
	if l.IsZero() {
		return "0"
	}
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[l.Period]
	return strconv.Itoa(l.Rate) + "/" + unit
}

// setting is one configuration variable and the flag that mirrors it.
type setting struct {
	env, flag, def, usage string
	secret                bool // also readable from the file named by env+"_FILE"
	parse                 func(c *config, v string) error
}

// settings lists every variable the server reads, in README order.
var settings = []setting{
	{"REPLAYGUARD_ADDR", "addr", autoValue, "listen address (any Go listen address); auto: " + devAddr + " (loopback only) when neither signing keys nor API keys are set, the development setup, else " + defaultAddr, false,
		func(c *config, v string) error { c.Addr = v; return nil }},
	{"REPLAYGUARD_SIGNING_KEYS", "signing-keys", "", "comma-separated kid:base64key HS256 keys; the first signs, all verify (at least 32 bytes each)", true,
		func(c *config, v string) (err error) {
			if v != "" {
				c.SigningKeys, err = token.ParseKeys(v)
			}
			return err
		}},
	{"REPLAYGUARD_API_KEYS", "api-keys", "", "comma-separated API keys; when set, redeem requires Authorization: Bearer <key>", true,
		func(c *config, v string) error { c.APIKeys = splitList(v); return nil }},
	{"REPLAYGUARD_ADMIN_KEYS", "admin-keys", "", "comma-separated admin keys; when set, operators look idempotency records up and release them under /v1/admin/ with Authorization: Bearer <key>", true,
		func(c *config, v string) error { c.AdminKeys = splitList(v); return nil }},
	{"REPLAYGUARD_MACHINE_ID", "machine-id", "", "sonyflake machine ID, 0-65535; empty: from the private IPv4 address", false,
		func(c *config, v string) error {
			if v == "" {
				return nil
			}
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return errors.New("must be an integer from 0 to 65535")
			}
			id := uint16(n)
			c.MachineID = &id
			return nil
		}},
	{"REPLAYGUARD_TOKEN_TTL", "token-ttl", duration(token.DefaultTTL), "default token lifetime, within [10s, max TTL]", false,
		func(c *config, v string) (err error) { c.TokenTTL, err = parseDuration(v); return err }},
	{"REPLAYGUARD_TOKEN_MAX_TTL", "token-max-ttl", duration(token.DefaultMaxTTL), "longest lifetime a request may ask for", false,
		func(c *config, v string) (err error) { c.TokenMaxTTL, err = parseDuration(v); return err }},
	{"REPLAYGUARD_CLIENT_KEYS", "client-keys", "", "path of the JSON client keys file for signed requests (RFC 9421); re-read on SIGHUP", false,
		func(c *config, v string) error { c.ClientKeys = v; return nil }},
	{"REPLAYGUARD_REPLAY_WINDOW", "replay-window", duration(replay.DefaultWindow), "how far a signature's created time may lie from the server's clock, either side", false,
		func(c *config, v string) (err error) { c.ReplayWindow, err = parseDuration(v); return err }},
	{"REPLAYGUARD_IDEMPOTENCY_LOCK_TTL", "idempotency-lock-ttl", duration(idempotency.DefaultLockTTL), "lease of a processing idempotency record, renewed while the request runs; a crashed request blocks its key this long (at least 1s)", false,
		func(c *config, v string) (err error) {
			if c.IdempotencyLockTTL, err = parseDuration(v); err == nil && c.IdempotencyLockTTL < idempotency.MinLockTTL {
				err = fmt.Errorf("must be at least %v", idempotency.MinLockTTL)
			}
			return err
		}},
	{"REPLAYGUARD_IDEMPOTENCY_GRACE", "idempotency-grace", "", "how long a processing record outlives its lease, so that a holder the store stalled completes first (duplicates get 409 meanwhile); a holder that died blocks its key for the lease and the grace; empty: one lock TTL", false,
		func(c *config, v string) (err error) {
			if v == "" {
				c.IdempotencyGrace = 0
				return nil
			}
			if c.IdempotencyGrace, err = parseDuration(v); err == nil && c.IdempotencyGrace <= 0 {
				err = errors.New("must be positive")
			}
			return err
		}},
	{"REPLAYGUARD_IDEMPOTENCY_RETENTION", "idempotency-retention", duration(idempotency.DefaultRetention), "how long a completed idempotency record, and the response it replays, is kept", false,
		func(c *config, v string) (err error) {
			if c.IdempotencyRetention, err = parseDuration(v); err == nil && c.IdempotencyRetention <= 0 {
				err = errors.New("must be positive")
			}
			return err
		}},
	{"REPLAYGUARD_IDEMPOTENCY_MAX_BODY", "idempotency-max-body", size.Format(idempotency.DefaultMaxBody), "largest response body an idempotency record stores, in bytes or with a KiB or MiB suffix (at most 64MiB)", false,
		func(c *config, v string) error {
			n, err := size.Parse(v, idempotency.MaxBodyLimit)
			c.IdempotencyMaxBody = int(n)
			return err
		}},
	{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER", "idempotency-max-per-caller", autoValue, "idempotency records one caller may open per retention period (429 past it); auto: a tenth of the memory store's records, none on Redis", false,
		func(c *config, v string) (err error) { c.PerCaller, err = parseQuota(v); return err }},
	{"REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS", "idempotency-max-per-address", autoValue, "idempotency records all callers from one client IP (an IPv6 /64) may open per retention period (429 past it); auto: an eighth of the memory store's records, never below the per-caller bound, none on Redis", false,
		func(c *config, v string) (err error) { c.PerAddress, err = parseQuota(v); return err }},
	{"REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS", "idempotency-max-bytes-per-address", autoValue, "bytes the idempotency records of all callers from one client IP (an IPv6 /64) may take per retention period, stored responses included (429 past it), with a KiB, MiB or GiB suffix; auto: an eighth of the memory store's bytes for records; only the memory store counts them", false,
		func(c *config, v string) (err error) { c.BytesPerAddress, err = parseByteQuota(v); return err }},
	{"REPLAYGUARD_IDEMPOTENCY_SCOPE", "idempotency-scope", guard.DefaultScope, "whom a stored idempotency key belongs to: credentials (Authorization and Cookie, else the client IP), or header:<Name> to add that request header", false,
		func(c *config, v string) (err error) { c.IdempotencyScope, err = guard.ParseScope(v); return err }},
	{"REPLAYGUARD_FINGERPRINT_WINDOW", "fingerprint-window", duration(guard.DefaultFingerprintWindow), "how long fingerprint routes replay a keyless request's response to identical requests, from its completion", false,
		func(c *config, v string) (err error) {
			if c.FingerprintWindow, err = parseDuration(v); err == nil && c.FingerprintWindow <= 0 {
				err = errors.New("must be positive")
			}
			return err
		}},
	{"REPLAYGUARD_UPSTREAM", "upstream", "", "base URL of the app to protect in gateway mode (http or https); empty: no gateway", false,
		func(c *config, v string) error {
			if v == "" {
				return nil
			}
			u, err := url.Parse(v)
			if err == nil && u.User != nil {
				return errors.New("must not carry a user or password") // not quoted: it may hold a password
			}
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
				return fmt.Errorf("%q is not an http or https base URL such as http://127.0.0.1:3000 (no query or fragment)", v)
			}
			c.Upstream = u
			return nil
		}},
	{"REPLAYGUARD_ROUTES", "routes", "", "path of the gateway's YAML routes file", false,
		func(c *config, v string) (err error) {
			if v != "" {
				c.RoutesPath = v
				c.Routes, err = gateway.LoadRoutes(v)
			}
			return err
		}},
	{"REPLAYGUARD_REDIS_URL", "redis-url", "", "redis:// or rediss:// URL of a single Redis server", true,
		func(c *config, v string) error {
			if v == "" {
				return nil
			}
			o, err := goredis.ParseURL(v)
			if err != nil {
				return errors.New("must be a redis:// or rediss:// URL") // the URL may hold a password
			}
			c.RedisURL = o
			return nil
		}},
	{"REPLAYGUARD_REDIS_CLUSTER_ADDRS", "redis-cluster-addrs", "", "comma-separated host:port seeds of a Redis Cluster", false,
		func(c *config, v string) error {
			c.RedisCluster = splitList(v)
			for _, a := range c.RedisCluster {
				if _, _, err := net.SplitHostPort(a); err != nil {
					return fmt.Errorf("%q is not host:port", a)
				}
			}
			return nil
		}},
	{"REPLAYGUARD_REDIS_CLUSTER_URL", "redis-cluster-url", "", "redis:// or rediss:// URL of a Redis Cluster seed, with more seeds as addr= parameters", true,
		func(c *config, v string) error {
			if v == "" {
				return nil
			}
			o, err := goredis.ParseClusterURL(v)
			if err != nil {
				return errors.New("must be a redis:// or rediss:// URL such as redis://:password@10.0.0.1:7000?addr=10.0.0.2:7000") // the URL may hold a password
			}
			c.RedisClusterURL = o
			return nil
		}},
	{"REPLAYGUARD_POSTGRES_URL", "postgres-url", "", "postgres:// URL or key=value DSN of a PostgreSQL database for the store (pgx syntax: sslmode, pool_max_conns, …)", true,
		func(c *config, v string) error {
			if v == "" {
				return nil
			}
			if _, err := pgxpool.ParseConfig(v); err != nil {
				return errors.New("must be a postgres:// URL or a key=value DSN that pgx can parse") // it may hold a password
			}
			c.PostgresURL = v
			return nil
		}},
	{"REPLAYGUARD_REDIS_SENTINEL_ADDRS", "redis-sentinel-addrs", "", "comma-separated host:port of the Redis Sentinels that monitor the master", false,
		func(c *config, v string) error {
			c.RedisSentinel = splitList(v)
			for _, a := range c.RedisSentinel {
				if _, _, err := net.SplitHostPort(a); err != nil {
					return fmt.Errorf("%q is not host:port", a)
				}
			}
			return nil
		}},
	{"REPLAYGUARD_REDIS_SENTINEL_MASTER", "redis-sentinel-master", "", "name of the master the sentinels monitor", false,
		func(c *config, v string) error { c.RedisSentinelMaster = v; return nil }},
	{"REPLAYGUARD_REDIS_SENTINEL_PASSWORD", "redis-sentinel-password", "", "password of the sentinels (their requirepass)", true,
		func(c *config, v string) error { c.RedisSentinelPassword = v; return nil }},
	{"REPLAYGUARD_REDIS_USERNAME", "redis-username", "", "Redis ACL user on the Sentinel master and replicas; empty: default", false,
		func(c *config, v string) error { c.RedisUsername = v; return nil }},
	{"REPLAYGUARD_REDIS_PASSWORD", "redis-password", "", "password of the Sentinel master and replicas", true,
		func(c *config, v string) error { c.RedisPassword = v; return nil }},
	{"REPLAYGUARD_REDIS_MIN_REPLICAS", "redis-min-replicas", strconv.Itoa(redisstore.DefaultMinReplicas), "replicas that must acknowledge every change (WAIT) before it counts as done", false,
		func(c *config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return errors.New("must be an integer of 0 or more")
			}
			c.RedisMinReplicas = n
			return nil
		}},
	{"REPLAYGUARD_KEY_PREFIX", "key-prefix", redisstore.DefaultPrefix, "prefix of every Redis key", false,
		func(c *config, v string) error {
			if v == "" || strings.ContainsAny(v, "{}") {
				return errors.New("must be non-empty and free of { and }, which Redis Cluster reads as a hash tag")
			}
			c.KeyPrefix = v
			return nil
		}},
	{"REPLAYGUARD_STORE_TIMEOUT", "store-timeout", duration(redisstore.DefaultTimeout), "deadline of every store call", false,
		func(c *config, v string) (err error) { c.StoreTimeout, err = parseDuration(v); return err }},
	{"REPLAYGUARD_MEMORY_MAX_ENTRIES", "memory-max-entries", strconv.Itoa(memory.DefaultMaxEntries), "entries (tokens, nonces, records) the embedded store holds at most; idempotency records take at most half", false,
		func(c *config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return errors.New("must be a positive integer")
			}
			c.MemoryMax = n
			return nil
		}},
	{"REPLAYGUARD_MEMORY_MAX_BYTES", "memory-max-bytes", size.Format(memory.DefaultMaxBytes), "bytes the embedded store's entries and stored responses take at most, with a KiB, MiB or GiB suffix; idempotency records take at most half", false,
		func(c *config, v string) (err error) { c.MemoryMaxBytes, err = size.Parse(v, 1<<40); return err }},
	{"REPLAYGUARD_ISSUE_RATE", "issue-rate", rate(handlers.DefaultIssueRate), "tokens per client IP as N/s, N/m or N/h (burst N); 0 turns it off", false,
		func(c *config, v string) (err error) { c.IssueRate, err = parseRate(v); return err }},
	{"REPLAYGUARD_CORS_ORIGINS", "cors-origins", "", "comma-separated exact origins allowed to issue tokens from a browser", false,
		func(c *config, v string) error {
			c.CORSOrigins = splitList(v)
			for _, o := range c.CORSOrigins {
				u, err := url.Parse(o)
				if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil || o != u.Scheme+"://"+u.Host {
					return fmt.Errorf("%q is not an exact origin like https://shop.example (no wildcard, path or slash)", o)
				}
			}
			return nil
		}},
	{"REPLAYGUARD_TRUSTED_PROXIES", "trusted-proxies", "", "comma-separated proxy IPs or CIDRs whose forwarded headers are believed", false,
		func(c *config, v string) error {
			c.TrustedProxies = splitList(v)
			for _, p := range c.TrustedProxies {
				if _, err := netip.ParsePrefix(p); err != nil {
					if _, err := netip.ParseAddr(p); err != nil {
						return fmt.Errorf("%q is not an IP or CIDR", p)
					}
				}
			}
			return nil
		}},
	{"REPLAYGUARD_LOG_LEVEL", "log-level", strings.ToLower(slog.LevelInfo.String()), "debug, info, warn or error", false,
		func(c *config, v string) error { return c.LogLevel.UnmarshalText([]byte(v)) }},
	{"REPLAYGUARD_SHUTDOWN_TIMEOUT", "shutdown-timeout", duration(defaultShutdownTimeout), "how long SIGTERM waits for in-flight requests before closing them (keep it under your orchestrator's grace period)", false,
		func(c *config, v string) (err error) { c.ShutdownTimeout, err = parseDuration(v); return err }},
}

// envNames returns every environment variable the server reads.
func envNames() []string {
	var names []string
	for _, s := range settings {
		names = append(names, s.env)
		if s.secret {
			names = append(names, s.env+"_FILE")
		}
	}
	return names
}

// unknownVariable is a REPLAYGUARD_* environment variable that is no
// setting, and the setting whose name is closest to its name.
type unknownVariable struct{ name, closest string }

// unknownVariableMsg is the start-up warning for an unknownVariable.
const unknownVariableMsg = "a REPLAYGUARD_* variable is not a setting: ignored"

// testVariablePrefix starts the tests' own variables, which the server
// does not read (REPLAYGUARD_TEST_REDIS_URL and the like).
const testVariablePrefix = "REPLAYGUARD_TEST_"

// unknownVariables returns the REPLAYGUARD_* variables of environ
// (NAME=value, as os.Environ gives it) that are no setting, nor a
// setting's _FILE form (envNames), each once, with the closest setting
// by editDistance (the first in README order on a tie). A misspelt
// variable is not an error, since a setting it was meant to be has a
// default, but nothing else would say that it was ignored.
// REPLAYGUARD_TEST_* variables are left out.
func unknownVariables(environ []string) []unknownVariable {
	known := envNames()
	var unknown []unknownVariable
	seen := map[string]bool{}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "REPLAYGUARD_") || strings.HasPrefix(name, testVariablePrefix) ||
			slices.Contains(known, name) || seen[name] {
			continue
		}
		seen[name] = true
		closest, best := "", -1
		for _, k := range known {
			if d := editDistance(name, k); best < 0 || d < best {
				closest, best = k, d
			}
		}
		unknown = append(unknown, unknownVariable{name, closest})
	}
	return unknown
}

// editDistance is the optimal string alignment distance of a and b: how
// many insertions, deletions, substitutions and swaps of two adjacent
// bytes turn a into b (Damerau-Levenshtein, with no substring edited
// twice), so that TOKN and TOKNE are both one edit from TOKEN.
func editDistance(a, b string) int {
	prev2, prev, cur := make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// loadConfig reads args (flags win), then getenv, then the defaults. Its
// errors name the variable and never quote a secret; a command line that
// does not parse is a *usageError, and -h is flag.ErrHelp.
func loadConfig(args []string, getenv func(string) string) (*config, error) {
	cl, err := parseFlags(args)
	if err != nil {
		return nil, err
	}
	c := &config{}
	for _, s := range settings {
		v, from := s.def, s.env
		fv, set := cl.set[s.flag]
		switch {
		case set:
			v, from = fv, "-"+s.flag
		case getenv(s.env) != "":
			v = getenv(s.env)
		case s.secret && getenv(s.env+"_FILE") != "":
			from = s.env + "_FILE"
			b, err := fileread.AtMost(getenv(s.env+"_FILE"), maxSecretFile)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", from, err)
			}
			v = strings.TrimSpace(string(b))
		}
		if err := s.parse(c, strings.TrimSpace(v)); err != nil {
			return nil, fmt.Errorf("%s: %w", from, err)
		}
	}
	if c.Addr == autoValue {
		c.Addr = defaultAddr
		if len(c.SigningKeys) == 0 && len(c.APIKeys) == 0 {
			c.Addr, c.LoopbackOnly = devAddr, true
		}
	}
	stores := storeSettings(c)
	if len(stores) > 1 {
		return nil, fmt.Errorf("%s are all set: choose one", strings.Join(stores, " and "))
	}
	if err := checkSentinel(c); err != nil {
		return nil, err
	}
	if c.RedisMinReplicas > 0 && (len(stores) == 0 || c.PostgresURL != "") {
		return nil, errors.New("REPLAYGUARD_REDIS_MIN_REPLICAS is above 0 but no Redis is set: the embedded memory store and PostgreSQL have no Redis replicas")
	}
	if c.TokenMaxTTL < token.MinTTL {
		return nil, fmt.Errorf("REPLAYGUARD_TOKEN_MAX_TTL: must be at least %v", token.MinTTL)
	}
	if c.TokenTTL < token.MinTTL || c.TokenTTL > c.TokenMaxTTL {
		return nil, fmt.Errorf("REPLAYGUARD_TOKEN_TTL: must lie within [%v, %v]", token.MinTTL, c.TokenMaxTTL)
	}
	if c.ReplayWindow <= 0 {
		return nil, errors.New("REPLAYGUARD_REPLAY_WINDOW: must be positive")
	}
	if c.StoreTimeout <= 0 || c.StoreTimeout > time.Minute {
		return nil, errors.New("REPLAYGUARD_STORE_TIMEOUT: must lie within (0, 1m]")
	}
	if c.RoutesPath != "" && c.Upstream == nil {
		return nil, errors.New("REPLAYGUARD_ROUTES is set but REPLAYGUARD_UPSTREAM is not: set the base URL of the app the routes protect")
	}
	for i, rt := range c.Routes {
		if rt.Policy == gateway.PolicySignature && c.ClientKeys == "" {
			return nil, fmt.Errorf("REPLAYGUARD_ROUTES: routes[%d] (line %d) has policy signature, which needs REPLAYGUARD_CLIENT_KEYS", i, rt.Line)
		}
	}
	for _, k := range c.AdminKeys {
		if slices.Contains(c.APIKeys, k) {
			return nil, errors.New("REPLAYGUARD_ADMIN_KEYS: a key is also in REPLAYGUARD_API_KEYS; give operators keys of their own, so that a backend's key cannot release records")
		}
	}
	if c.ShutdownTimeout <= 0 {
		return nil, errors.New("REPLAYGUARD_SHUTDOWN_TIMEOUT: must be positive")
	}
	return c, nil
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parseDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a Go duration such as 500ms, 5m or 1h", v)
	}
	return d, nil
}

// parseQuota reads a quota of records: auto (-1), or 0 (none) or more.
func parseQuota(v string) (int, error) {
	if v == autoValue {
		return -1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, errors.New("must be auto or an integer of 0 (none) or more")
	}
	return n, nil
}

// parseByteQuota reads a quota of bytes: auto (-1), or 0 (none), or a
// size.
func parseByteQuota(v string) (int64, error) {
	switch v {
	case autoValue:
		return -1, nil
	case "0":
		return 0, nil
	}
	n, err := size.Parse(v, 1<<40)
	if err != nil {
		return 0, fmt.Errorf("must be auto, 0 (none) or a size: %w", err)
	}
	return n, nil
}

// parseRate reads "N/s", "N/m" or "N/h" (burst N) or "0" (off).
func parseRate(v string) (store.Limit, error) {
	if v == "0" {
		return store.Limit{}, nil
	}
	n, unit, ok := strings.Cut(v, "/")
	periods := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}
	rate, err := strconv.Atoi(n)
	if !ok || err != nil || rate < 1 || periods[unit] == 0 {
		return store.Limit{}, fmt.Errorf("%q is not N/s, N/m, N/h or 0", v)
	}
	return store.Limit{Rate: rate, Burst: rate, Period: periods[unit]}, nil
}

// failoverOptions are the Sentinel client's options for c: the store
// timeout bounds every dial, read and write, as for the other Redis
// settings.
func (c *config) failoverOptions() *goredis.FailoverOptions {
	t := c.StoreTimeout
	return &goredis.FailoverOptions{
		MasterName:            c.RedisSentinelMaster,
		SentinelAddrs:         c.RedisSentinel,
		SentinelPassword:      c.RedisSentinelPassword,
		Username:              c.RedisUsername,
		Password:              c.RedisPassword,
		ContextTimeoutEnabled: true,
		DialTimeout:           t,
		ReadTimeout:           t,
		WriteTimeout:          t,
		PoolTimeout:           t,
	}
}

// memoryOptions are the embedded store's options for c.
func (c *config) memoryOptions() []memory.Option {
	return []memory.Option{memory.WithMaxEntries(c.MemoryMax), memory.WithMaxBytes(c.MemoryMaxBytes)}
}

// autoValue is a setting's value that lets the server choose.
const autoValue = "auto"

// perCaller is REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER for the store the
// server runs on: auto is a tenth of the memory store's half for records,
// and none on a store without a bound.
func (c *config) perCaller(st store.Store) int {
	if c.PerCaller >= 0 {
		return c.PerCaller
	}
	if u, ok := st.(store.Usager); ok {
		return int(max(u.Usage().MaxRecords/10, 1))
	}
	return 0
}

// perAddress is REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS for the store the
// server runs on. auto is an eighth of the memory store's half for
// records, but never below the per-caller bound (which it would make
// moot), and none on a store without a bound. An eighth: since the bound
// is a rate over the retention, one address holds at most about twice
// it, a quarter of the records, so that no single address can fill them
// however many credentials it invents; and at the default size that is
// 62,500 new records a day for an office behind one NAT, over a hundred
// for each of five hundred people.
func (c *config) perAddress(st store.Store) int {
	if c.PerAddress >= 0 {
		return c.PerAddress
	}
	if u, ok := st.(store.Usager); ok {
		return int(max(u.Usage().MaxRecords/8, int64(c.perCaller(st)), 1))
	}
	return 0
}

// bytesPerAddress is REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS for
// the store the server runs on. auto is an eighth of the memory store's
// bytes for records, as the per-address bound is an eighth of its
// records: one address then takes at most about a quarter of them, in
// bytes as in records, however large the answers it asks for (8 MiB a
// day at the default size: some eighty 100 KB answers, or twenty
// thousand small ones). None on a store without a bound.
func (c *config) bytesPerAddress(st store.Store) int64 {
	if c.BytesPerAddress >= 0 {
		return c.BytesPerAddress
	}
	if u, ok := st.(store.Usager); ok {
		return max(u.Usage().MaxRecordBytes/8, 1)
	}
	return 0
}
