// Command server runs Replayguard as a standalone HTTP service.
//
// With no configuration it listens on 127.0.0.1:8080 (loopback only:
// without signing or API keys it is a development server) with the
// embedded memory store; REPLAYGUARD_REDIS_URL, REPLAYGUARD_REDIS_CLUSTER_ADDRS (or _URL)
// or REPLAYGUARD_REDIS_SENTINEL_ADDRS moves it onto Redis. REPLAYGUARD_CLIENT_KEYS turns on POST /v1/signatures/verify
// for signed requests; SIGHUP re-reads that file. Run it with -h for every
// flag; each mirrors a REPLAYGUARD_* environment variable (see README.md).
// With -healthcheck it probes a running server's /healthz instead and
// exits 0 or 1: the container healthcheck of the distroless image.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/replayguard/replayguard/gateway"
	"github.com/replayguard/replayguard/guard"
	"github.com/replayguard/replayguard/handlers"
	"github.com/replayguard/replayguard/idempotency"
	"github.com/replayguard/replayguard/internal/logjson"
	"github.com/replayguard/replayguard/internal/request"
	"github.com/replayguard/replayguard/metrics"
	"github.com/replayguard/replayguard/problem"
	"github.com/replayguard/replayguard/replay"
	"github.com/replayguard/replayguard/store"
	"github.com/replayguard/replayguard/store/memory"
	"github.com/replayguard/replayguard/store/postgres"
	redisstore "github.com/replayguard/replayguard/store/redis"
	"github.com/replayguard/replayguard/token"
	"github.com/replayguard/replayguard/tracing"
)

func main() {
	os.Exit(command(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// command runs the command line args and returns the exit code: 0, 1
// when the server stops on an error (logged as JSON on stdout), 2 for a
// command line that does not parse (with the usage on stderr); -h
// prints the usage on stdout. -healthcheck probes a running server.
func command(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cl, err := parseFlags(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printUsage(stdout)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "replayguard: %v\n\n", err)
		printUsage(stderr)
		return 2
	case cl.healthcheck:
		addr, ok := cl.set["addr"]
		if !ok {
			addr = getenv("REPLAYGUARD_ADDR")
		}
		return healthcheck(context.Background(), addr, stdout, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, args, getenv, stdout, nil); err != nil {
		slog.New(slog.NewJSONHandler(stdout, nil)).Error("replayguard stopped", "error", err.Error())
		return 1
	}
	return 0
}

// run starts the server and blocks until ctx ends, then drains in-flight
// requests. onListen, when set, receives the bound address. With client
// keys configured, SIGHUP re-reads them until run returns.
func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer, onListen func(addr string)) error {
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg, err := loadConfig(args, getenv)
	if err != nil {
		return err
	}
	logs := logjson.NewWriter(out, 100*time.Millisecond)
	defer logs.Close()
	log := slog.New(logjson.NewHandler(logs, cfg.LogLevel))
	// A panic in a goroutine ends the process without running any other
	// goroutine's deferred calls, logs.Close among them: every goroutine
	// the server starts, and the Keeper's heartbeats, log it and flush
	// first. This goroutine's own panics unwind through logs.Close.
	onPanic := logPanic(log, logs)
	defer repanic(onPanic)
	for _, v := range unknownVariables(environ()) {
		log.Warn(unknownVariableMsg, "variable", v.name, "closest_setting", v.closest)
	}
	gin.SetMode(gin.ReleaseMode)
	gin.DefaultWriter, gin.DefaultErrorWriter = io.Discard, io.Discard
	goredis.SetLogger(redisLogger{log})

	var clientKeys *replay.KeyRing
	if cfg.ClientKeys != "" {
		if clientKeys, err = replay.NewKeyRing(cfg.ClientKeys); err != nil {
			return fmt.Errorf("REPLAYGUARD_CLIENT_KEYS: %w", err)
		}
	}
	// Before the store opens, as the other settings that fail: a typo
	// here stops the server even with tracing off.
	prop, err := newPropagator(getenv)
	if err != nil {
		return err
	}

	m := metrics.New()
	st, err := openStore(ctx, cfg, log, onPanic)
	if err != nil {
		return err
	}
	defer st.Close()
	gogc, memLimit := tuneGC(getenv, st, cfg.MemoryMaxBytes)
	log.Debug("garbage collector", "gogc", gogc, "memory_limit", memLimit)
	inst := m.Instrument(st)
	tp, err := newTracerProvider(ctx, getenv, log)
	if err != nil {
		return err
	}
	if tp != nil {
		defer shutdownTracing(tp, log)
		inst = tracing.Store(inst, tp)
	}

	keys := cfg.SigningKeys
	if len(keys) == 0 {
		k, err := token.GenerateKey()
		if err != nil {
			return err
		}
		keys = []token.Key{k}
		log.Warn("REPLAYGUARD_SIGNING_KEYS is not set: signing with a random key; tokens will not survive a restart or be valid on other instances")
	}
	topts := []token.Option{token.WithDefaultTTL(cfg.TokenTTL), token.WithMaxTTL(cfg.TokenMaxTTL)}
	if cfg.MachineID != nil {
		topts = append(topts, token.WithMachineID(*cfg.MachineID))
	}
	svc, err := token.New(inst, keys, topts...)
	if err != nil {
		return err
	}
	if id, random := svc.MachineID(); random {
		log.Warn("no private IPv4 address for the sonyflake machine ID: using a random one; set REPLAYGUARD_MACHINE_ID", "machine_id", id)
	}

	opts := []handlers.Option{
		handlers.WithMetrics(m),
		handlers.WithLogger(log),
		handlers.WithAPIKeys(cfg.APIKeys...),
		handlers.WithCORSOrigins(cfg.CORSOrigins...),
		handlers.WithTrustedProxies(cfg.TrustedProxies...),
	}
	if tp != nil {
		opts = append(opts, handlers.WithTracerProvider(tp), handlers.WithPropagator(prop))
	}
	if lim, ok := inst.(store.Limiter); ok {
		opts = append(opts, handlers.WithIssueRate(lim, cfg.IssueRate))
	}
	if u, ok := st.(store.Usager); ok {
		opts = append(opts, handlers.WithUsage(u))
	}
	if len(cfg.APIKeys) == 0 {
		log.Warn("REPLAYGUARD_API_KEYS is not set: POST /v1/tokens/redeem is open to every caller")
	}
	var ver *replay.Verifier
	if clientKeys != nil {
		ver = verifier(cfg, clientKeys, st, inst, start, log)
		opts = append(opts, handlers.WithVerifier(ver))
		if len(cfg.APIKeys) == 0 {
			log.Warn("REPLAYGUARD_API_KEYS is not set: POST /v1/signatures/verify is open to every caller")
		}
		reloadOnHangup(ctx, clientKeys, cfg.ClientKeys, log, onPanic)
	}
	// One Keeper for every idempotency record; routes override its
	// settings with Keeper.With.
	keeper := idempotency.New(testStore(inst),
		idempotency.WithPanicHandler(onPanic),
		idempotency.WithLogger(log),
		idempotency.WithLockTTL(cfg.IdempotencyLockTTL),
		idempotency.WithGrace(cfg.IdempotencyGrace),
		idempotency.WithRetention(cfg.IdempotencyRetention),
		idempotency.WithMaxBody(cfg.IdempotencyMaxBody))
	m.Completions(keeper.Pending, keeper.GivenUp)
	opts = append(opts, handlers.WithRecords(keeper), handlers.WithAdminKeys(cfg.AdminKeys...))
	var upstreamTimeout time.Duration // 0: not a gateway
	var gw *gateway.Gateway
	if cfg.Upstream != nil {
		upstreamTimeout = gateway.DefaultTimeout
		gopts := []gateway.Option{
			gateway.WithTimeout(upstreamTimeout),
			gateway.WithKeeper(keeper),
			gateway.WithTokens(svc),
			gateway.WithVerifier(ver),
			gateway.WithScope(cfg.IdempotencyScope),
			gateway.WithFingerprintWindow(cfg.FingerprintWindow),
			gateway.WithLogger(log),
			gateway.WithMetrics(m),
			gateway.WithGetenv(getenv), // webhook routes' secret_env
		}
		if tp != nil {
			gopts = append(gopts, gateway.WithTracerProvider(tp), gateway.WithPropagator(prop))
		}
		if _, ok := st.(*memory.Store); ok {
			// The memory store forgets the deliveries it ran on restart.
			notBefore := start.Truncate(time.Second)
			gopts = append(gopts, gateway.WithWebhookNotBefore(notBefore))
			if slices.ContainsFunc(cfg.Routes, func(rt gateway.Route) bool { return rt.Policy == gateway.PolicyWebhook }) {
				log.Info("webhook routes on the embedded memory store: deliveries timestamped before the process started are refused as signature_expired, since the deliveries run before a restart are forgotten",
					"not_before", notBefore.UTC().Format(time.RFC3339))
			}
		}
		quotas, err := recordQuotas(cfg, st, inst, log)
		if err != nil {
			return err
		}
		gopts = append(gopts, quotas...)
		if gw, err = gateway.New(cfg.Upstream, cfg.Routes, gopts...); err != nil {
			return fmt.Errorf("REPLAYGUARD_ROUTES: %w", err)
		}
		opts = append(opts, handlers.WithRecordKeys(gw.RecordKey)) // operators look records up by request
		log.Info("gateway: proxying every other path to the upstream", "upstream", cfg.Upstream.String(), "routes", len(cfg.Routes), "routes_file", cfg.RoutesPath)
		if len(cfg.Routes) == 0 {
			log.Warn("gateway: no routes (REPLAYGUARD_ROUTES): every request passes through to the upstream without a policy")
		}
	}
	engine, err := handlers.New(svc, opts...).Engine()
	if err != nil {
		return fmt.Errorf("REPLAYGUARD_TRUSTED_PROXIES: %w", err)
	}
	if gw != nil {
		engine.NoRoute(serveGateway(gw))
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("REPLAYGUARD_ADDR: %w", err)
	}
	srv := newServer(engine, upstreamTimeout)
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	if cfg.LoopbackOnly {
		log.Info("replayguard listening", "addr", ln.Addr().String(), "signing_kid", svc.SigningKeyID(), "loopback_only", true,
			"why", "no signing keys and no API keys (the development setup): listening on loopback only; set REPLAYGUARD_ADDR (:8080, say) to listen on every interface")
	} else {
		log.Info("replayguard listening", "addr", ln.Addr().String(), "signing_kid", svc.SigningKeyID())
	}
	_ = logs.Flush() // start-up lines now, not at the first tick
	if onListen != nil {
		onListen(ln.Addr().String())
	}
	served := make(chan error, 1)
	go func() {
		defer repanic(onPanic)
		served <- srv.Serve(problemListener{ln})
	}()

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: draining in-flight requests", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("drain incomplete; closing open connections", "error", err.Error())
		_ = srv.Close()
	}
	// Outcomes the store did not confirm are retried in the background;
	// they get what is left of the same time (each one given up is logged).
	if n := keeper.Pending(); n > 0 {
		log.Info("shutting down: recording the outcomes the store has not confirmed yet", "pending", n)
	}
	if err := keeper.Shutdown(sctx); err != nil {
		log.Error("outcomes not recorded at shutdown: once their lease and grace end, one retry of each may run again", "error", err.Error())
	}
	log.Info("replayguard stopped")
	return nil
}

// environ is the process's environment, in which run looks for
// REPLAYGUARD_* variables that are no setting (unknownVariables): run's
// getenv can only look names up.
var environ = os.Environ

// testStore wraps the store of the idempotency records. It is the
// identity; only the tests replace it (TestMain, in the server's
// subprocess), to make a record's heartbeat panic.
var testStore = func(st store.Store) store.Store { return st }

// Server timeouts. Outside gateway mode every request is Replayguard's
// own, and short.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 15 * time.Second
	idleTimeout       = 60 * time.Second
	// gatewayMargin is what a gateway request may take beyond its body
	// and the app: store calls, and writing the response out.
	gatewayMargin = 5 * time.Second
)

// maxHeadBytes is how long a request's head may be: its request line,
// its header fields and the empty line that ends them, CRLFs included.
// A longer head is 431 headers_too_large. net/http reads a head of up to
// Server.MaxHeaderBytes plus headSlop bytes (its "bufio slop",
// initialReadLimitSize in net/http/server.go), counted from the head's
// first byte, so newServer sets MaxHeaderBytes headSlop below the limit.
// The count is exact when the head's first byte was not read along with
// the previous request, as it never is for a client that waits for an
// answer before it sends its next request; a pipelined request's head
// may run up to one more read buffer (4 KiB) over.
const (
	maxHeadBytes = 16 << 10
	headSlop     = 4096
)

// newServer returns the HTTP server for h; upstream is the gateway's
// timeout towards the app, 0 outside gateway mode. In gateway mode a
// request's body may take as long as upstream to arrive (it streams to
// the app, or is read first on routes that need it), and the app's answer
// as long again: ReadTimeout, from the request's first byte, allows the
// headers and then upstream; WriteTimeout, from the end of the headers,
// allows the body, then the app, then gatewayMargin. Neither is ever
// shorter than outside gateway mode. Serve it on a problemListener: its
// ConnState tells the listener's connections where responses end, so
// that net/http's own error answers (431, and 400 for a request it
// cannot parse) become problem+json.
func newServer(h http.Handler, upstream time.Duration) *http.Server {
	read, write := readTimeout, writeTimeout
	if upstream > 0 {
		read = max(read, readHeaderTimeout+upstream)
		write = max(write, read+upstream+gatewayMargin)
	}
	return &http.Server{
		Handler:           refuse(h),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       read,
		WriteTimeout:      write,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeadBytes - headSlop, // a head of maxHeadBytes
		ConnState:         problemConnState,
		ConnContext:       problemConnContext,
	}
}

// replayguardPath reports whether path belongs to Replayguard's own API,
// which the gateway never forwards: /v1/..., /sdk/..., /healthz, /readyz
// and /metrics. Unknown paths there are 404 not_found.
func replayguardPath(path string) bool {
	return strings.HasPrefix(path, "/v1/") || strings.HasPrefix(path, "/sdk/") ||
		path == "/healthz" || path == "/readyz" || path == "/metrics"
}

// serveGateway is the engine's NoRoute handler in gateway mode: paths
// that are not Replayguard's go to gw, with Gin's client IP (which
// believes only REPLAYGUARD_TRUSTED_PROXIES) for gw's scope and
// X-Forwarded-For.
func serveGateway(gw *gateway.Gateway) gin.HandlerFunc {
	return func(c *gin.Context) {
		if replayguardPath(c.Request.URL.Path) {
			c.Abort()
			problem.Write(c.Writer, problem.ErrNotFound)
			return
		}
		gw.ServeHTTP(c.Writer, request.WithClientIP(c.Request, c.ClientIP()))
	}
}

// verifier checks signed requests with the client keys, recording nonces
// in inst, the same (instrumented) store as tokens. On the memory store,
// which forgets its nonces on restart, signatures created before start
// (truncated to the second) are refused.
func verifier(cfg *config, keys *replay.KeyRing, st, inst store.Store, start time.Time, log *slog.Logger) *replay.Verifier {
	opts := []replay.Option{replay.WithWindow(cfg.ReplayWindow)}
	if _, ok := st.(*memory.Store); ok {
		notBefore := start.Truncate(time.Second)
		opts = append(opts, replay.WithNotBefore(notBefore))
		log.Info("signed requests on the embedded memory store: signatures created before the process started are refused as signature_expired, since the nonces seen before a restart are gone",
			"not_before", notBefore.UTC().Format(time.RFC3339))
	}
	log.Info("client keys loaded", "keys", keys.Len(), "path", cfg.ClientKeys, "replay_window", cfg.ReplayWindow.String())
	return replay.NewVerifier(keys, inst, opts...)
}

// reloadOnHangup re-reads the client keys file on every SIGHUP until ctx
// ends. Requests keep being served throughout: a reload swaps the whole
// key set at once, and a file that does not load leaves the keys in force.
// Errors name the file, never key material.
func reloadOnHangup(ctx context.Context, keys *replay.KeyRing, path string, log *slog.Logger, onPanic func(any)) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer repanic(onPanic)
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := keys.Reload(); err != nil {
					log.Error("client keys not reloaded: keeping the keys in force", "path", path, "error", err.Error(), "keys", keys.Len())
					continue
				}
				log.Info("client keys reloaded", "path", path, "keys", keys.Len())
			}
		}
	}()
}

// openStore builds the configured store. A Redis that is down at start is
// logged and reported by /readyz, not fatal.
func openStore(ctx context.Context, cfg *config, log *slog.Logger, onPanic func(any)) (store.Store, error) {
	var client goredis.UniversalClient
	switch {
	case cfg.RedisURL != nil:
		o := cfg.RedisURL
		o.ContextTimeoutEnabled = true
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = cfg.StoreTimeout, cfg.StoreTimeout, cfg.StoreTimeout, cfg.StoreTimeout
		if cfg.RedisMinReplicas > 0 {
			o.MaintNotificationsConfig = noMaintNotifications()
		}
		client = goredis.NewClient(o)
		log.Info("store: redis", "addr", o.Addr, "db", o.DB, "tls", o.TLSConfig != nil)
	case len(cfg.RedisCluster) > 0 || cfg.RedisClusterURL != nil:
		o := cfg.RedisClusterURL
		if o == nil {
			o = &goredis.ClusterOptions{Addrs: cfg.RedisCluster}
		}
		t := cfg.StoreTimeout
		o.ContextTimeoutEnabled = true
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = t, t, t, t
		if cfg.RedisMinReplicas > 0 {
			o.MaintNotificationsConfig = noMaintNotifications()
		}
		client = goredis.NewClusterClient(o)
		log.Info("store: redis cluster", "seeds", o.Addrs, "tls", o.TLSConfig != nil)
	case cfg.PostgresURL != "":
		return openPostgres(ctx, cfg, log, onPanic)
	case len(cfg.RedisSentinel) > 0:
		o := cfg.failoverOptions()
		client = goredis.NewFailoverClient(o)
		log.Info("store: redis sentinel", "sentinels", o.SentinelAddrs, "master", o.MasterName,
			"sentinel_auth", o.SentinelPassword != "", "username", o.Username, "auth", o.Password != "")
	default:
		log.Warn("store: embedded memory: single instance only; tokens are lost on restart and not shared with other instances; set REPLAYGUARD_REDIS_URL or REPLAYGUARD_POSTGRES_URL to scale out",
			"max_entries", cfg.MemoryMax, "max_bytes", cfg.MemoryMaxBytes)
		return memory.New(append(cfg.memoryOptions(), memory.WithPanicHandler(onPanic))...), nil
	}
	st := redisstore.New(client, redisstore.WithPrefix(cfg.KeyPrefix), redisstore.WithTimeout(cfg.StoreTimeout),
		redisstore.WithMinReplicas(cfg.RedisMinReplicas))
	if cfg.RedisMinReplicas > 0 {
		log.Info("store: every change waits for replicas (WAIT); it fails with 503 when fewer acknowledge it within the store timeout",
			"min_replicas", cfg.RedisMinReplicas, "timeout", cfg.StoreTimeout.String())
	}
	if err := st.Ping(ctx); err != nil {
		log.Warn("redis is not reachable at start; /readyz answers 503 and requests fail closed until it is", "error", err.Error())
	}
	return st, nil
}

// openPostgres opens the PostgreSQL store and applies its migrations. A
// database that is down at start is logged, not fatal: the migrations are
// retried in the background until they apply, /readyz answers 503 and
// requests fail closed meanwhile.
func openPostgres(ctx context.Context, cfg *config, log *slog.Logger, onPanic func(any)) (store.Store, error) {
	st, err := postgres.Open(ctx, cfg.PostgresURL, postgres.WithTimeout(cfg.StoreTimeout))
	if err != nil {
		return nil, errors.New("REPLAYGUARD_POSTGRES_URL: cannot open a pool for it") // the error may quote the URL
	}
	log.Info("store: postgresql")
	migrate := func() error {
		mctx, cancel := context.WithTimeout(ctx, migrateTimeout)
		defer cancel()
		return st.Migrate(mctx)
	}
	if err := migrate(); err != nil {
		log.Warn("postgresql: migrations not applied at start; retrying until they are: /readyz answers 503 and requests fail closed meanwhile", "error", err.Error())
		go func() {
			defer repanic(onPanic)
			t := time.NewTicker(migrateRetry)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if err := migrate(); err == nil {
					log.Info("postgresql: migrations applied")
					return
				}
			}
		}()
	}
	return st, nil
}

// How long one attempt to apply the migrations may take, and how often a
// failed one is tried again.
const (
	migrateTimeout = 30 * time.Second
	migrateRetry   = 2 * time.Second
)

// noMaintNotifications turns off go-redis's maintenance notifications
// (a Redis Enterprise feature), as redisstore.WithMinReplicas asks: the
// store's pinned connections share their client's options, and in the
// default auto mode the first connections rewrite them when the server
// refuses the feature, a data race in go-redis v9.23. FailoverClients
// never negotiate it.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// redisLogger sends go-redis's internal messages to slog, so every line
// the server writes is JSON. Each message says "redis: " once: many of
// go-redis's already begin with it, the others ("sentinel: …") get it.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if !strings.HasPrefix(msg, "redis: ") {
		msg = "redis: " + msg
	}
	l.log.WarnContext(ctx, msg)
}

// recordQuotas are the gateway's bounds on the idempotency records of
// one caller and of one client address (see config.perCaller,
// perAddress and bytesPerAddress), counted in inst's limiter, and the
// bytes in st's own (the memory store's Charge: the instrumented store
// has none).
func recordQuotas(cfg *config, st, inst store.Store, log *slog.Logger) ([]gateway.Option, error) {
	lim, ok := inst.(store.Limiter)
	if !ok {
		return nil, nil
	}
	var opts []gateway.Option
	perCaller, perAddress, bytesPerAddress := cfg.perCaller(st), cfg.perAddress(st), cfg.bytesPerAddress(st)
	if perCaller > 0 {
		opts = append(opts, gateway.WithCallerQuota(lim, perCaller))
	}
	if perAddress > 0 {
		opts = append(opts, gateway.WithAddressQuota(lim, perAddress))
	}
	if bytesPerAddress > 0 {
		ch, ok := st.(guard.Charger)
		if !ok {
			return nil, errors.New("REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS: only the memory store counts the bytes of records per address; set it to 0 or auto on this store, and bound Redis with maxmemory")
		}
		opts = append(opts, gateway.WithAddressBytes(ch, int(bytesPerAddress)))
	}
	if len(opts) > 0 {
		log.Info("gateway: idempotency records per retention (0: no bound)", "max_per_caller", perCaller, "max_per_address", perAddress, "max_bytes_per_address", bytesPerAddress)
	}
	return opts, nil
}
