#!/usr/bin/env bash
# Side-by-side benchmark of Replayguard against the baseline server, in one
# run, on this machine. Run from anywhere as: bash test/load/run.sh
#
# It starts its own redis-server on a free loopback port (no persistence),
# builds cmd/server, test/load/baseline, test/load/bound401,
# test/load/boundpairs and test/load, then:
#   1. the Go benchmarks of token/, store/memory/, store/redis/ and
#      replay/ (BenchmarkVerify, on memory and the run's Redis);
#   2. redis-benchmark for the Redis operations behind issue and redeem;
#   3. the load program against both servers: pairs for each, forged tokens
#      against Replayguard, the 204 no-op route against the baseline,
#      signed requests (hmac-sha256 and ed25519) against Replayguard's
#      POST /v1/signatures/verify, and redeems of pre-issued tokens
#      against the baseline's GETDEL route; in ROUNDS rounds, each in the
#      reverse order of the one before (ABCD DCBA), so that a drift in
#      what else the machine is doing falls on both sides of every
#      comparison alike; with VARIANTS=1 (default) a second Replayguard
#      with per-request logging off runs pairs and forged in the same
#      rounds; with POSTGRES=1 (default) a third Replayguard, on the
#      PostgreSQL store of a private PostgreSQL cluster, runs pairs in the
#      same rounds (label replayguard-postgres); with MEMORY=1 (default)
#      one on the embedded memory store (label replayguard-memory); with
#      CLUSTER=1 (default where redis-cli can create a cluster) one on a
#      private three-master Redis Cluster (label replayguard-cluster);
#      with ONECONN=1 (default) Replayguard (Redis) and the baseline also
#      run pairs at one worker (mode pairs-1conn); with BOUND=1 (default)
#      two bare Gin handlers run in the same rounds: test/load/bound401,
#      which gives Replayguard's forged-token answer (401 token_invalid,
#      the same headers and body) without doing anything else, runs
#      forged (label bound401), and test/load/boundpairs, which gives
#      Replayguard's issue and redeem answers (the same statuses, headers,
#      JSON members and sizes) from unsigned tokens in an in-process map,
#      runs pairs (label boundpairs): the most any server that gives those
#      answers can reach with this load program on this machine;
#   4. the report: tables and target pass/miss (load report) against
#      issue 13's targets, each with its throughput and per-CPU-second
#      ratio: pairs, p99, forged, verify against the baseline; bound401's
#      forged against the baseline's noop, and Replayguard's forged as a
#      share of bound401's (listed, no target); the
#      embedded server's pairs against the baseline's, and next to it
#      boundpairs' pairs against the baseline's and the embedded server's
#      as a share of boundpairs' (listed, no target); p50 and p99 at one
#      connection; the pairs/s, p50, p99 and ratios of every store's
#      instance (Redis, Cluster, PostgreSQL, memory; issues 11 §5, 13).
# Every process it starts is stopped by pid at exit, pass or fail. Traffic
# goes to 127.0.0.1 only.
#
# Environment:
#   DURATION=2.5s  length of each load run
#   ROUNDS=4       rounds of the load runs (4 x 2.5s = 10s per mode)
#   WORKERS=64     concurrent workers of each load run
#   VERIFY_POOL=36000  signed requests prepared before each verify run
#   REDEEM_POOL=70000  tokens issued before each redeem run; each request
#                  is sent once, so a run that uses them all up ends early
#                  (the report says so): raise both with DURATION
#   PROFILE=1      afterwards, perf-record each server during one more 5s
#                  run of each load run but the logging-off variant's,
#                  print the top symbols and the split of server CPU by
#                  category (load perfsplit); the measured runs are never
#                  profiled
#   KEEP=1         keep the work directory (logs, JSON lines, report)
#   REV=<commit>   measure that commit (git archive) instead of the work
#                  tree; test/load itself always comes from the work tree
#   VARIANTS=0     skip the extra Replayguard instance with per-request
#                  logging off (REPLAYGUARD_LOG_LEVEL=warn), label
#                  replayguard-quiet, measured in the same rounds
#   POSTGRES=0     skip the Replayguard instance on PostgreSQL, label
#                  replayguard-postgres. With POSTGRES=1 (default) the
#                  script needs PostgreSQL's server programs (initdb on
#                  PATH or Debian's /usr/lib/postgresql/*/bin: apt-get
#                  install postgresql) and makes its own cluster with
#                  initdb in a temp dir (as the postgres user when run as
#                  root), on a free loopback port, stopped by pid at exit
#                  (internal/testenv/postgres.sh, as CI does). It runs
#                  with PostgreSQL's defaults: fsync and synchronous_commit
#                  on, so each redeem waits for a WAL flush, where the
#                  run's Redis persists nothing
#   POSTGRES_SETTINGS="synchronous_commit=off"  server settings for that
#                  cluster (postgres -c name=value, space-separated)
#   POSTGRES_URL_OPTIONS="&pool_max_conns=16"  appended to the instance's
#                  REPLAYGUARD_POSTGRES_URL (pgx pool settings); without
#                  it the pool has pgx's default size, max(4, CPUs)
#   MEMORY=0       skip the Replayguard instance on the embedded memory
#                  store (no REPLAYGUARD_REDIS_URL), label
#                  replayguard-memory: its pairs, against the baseline's
#                  on Redis, are issue 13's "embedded server ≥ 2×"
#   CLUSTER=1      start a private Redis Cluster (three masters, no
#                  replicas, no persistence, on free loopback ports, as CI
#                  does: internal/testenv/redis.sh) and a Replayguard
#                  instance on it (REPLAYGUARD_REDIS_CLUSTER_ADDRS), label
#                  replayguard-cluster, whose pairs run in the same rounds.
#                  Default: on where redis-cli can create a cluster (Redis
#                  5 or later); CLUSTER=0 skips it, CLUSTER=1 fails
#                  without it. Its three nodes' CPU counts as the store's
#   BOUND=0        skip both bound fixtures, bare Gin handlers that give
#                  Replayguard's answers with nothing else done, each the
#                  ceiling of one of Replayguard's figures: bound401
#                  (test/load/bound401, label bound401, mode forged), the
#                  forged-token answer, whose forged tokens name the run's
#                  signing kid (-kid), since it issues none to read one
#                  from, and which has no store; and boundpairs
#                  (test/load/boundpairs, label boundpairs, mode pairs),
#                  the issue and redeem answers, with unsigned tokens in
#                  an in-process map (no store process watched). With REV,
#                  each is built from that commit's packages problem,
#                  token and store, and skipped where that does not build
#   ONECONN=0      skip pairs at one worker (mode pairs-1conn, load -name
#                  pairs-1conn -workers 1) of Replayguard on Redis and the
#                  baseline, whose p50 issue 13 wants not to rise
#   MODES="pairs"  run only the load runs of these modes (space-separated;
#                  pairs pairs-1conn forged noop verify redeem), for a
#                  quick check; pairs does not select pairs-1conn
#   MICRO=0        skip the Go benchmarks and redis-benchmark (steps 1, 2)
#   WARMUP=1s      before the first round, one unmeasured load run of this
#                  length per load run of the plan (0: none)
#   NICE=-10       priority of the run on a shared machine: the script
#                  re-runs itself in a session of its own (setsid) and sets
#                  that session's autogroup niceness (and each process's)
#                  to NICE, so that other sessions' work disturbs the
#                  figures less. The kernel's autogroups share CPU between
#                  sessions regardless of plain nice values. NICE=0 turns
#                  it off. Each load run reports the CPU other processes
#                  still took.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec </dev/null

NICE=${NICE:--10}
SCRIPT=test/load/run.sh
TOOLS="go redis-server redis-cli redis-benchmark curl"
# shellcheck source=test/load/lib.sh
. test/load/lib.sh
# shellcheck source=internal/testenv/postgres.sh
. internal/testenv/postgres.sh
load_session "$@"

DURATION=${DURATION:-2.5s}
ROUNDS=${ROUNDS:-4}
WORKERS=${WORKERS:-64}
VERIFY_POOL=${VERIFY_POOL:-36000}
REDEEM_POOL=${REDEEM_POOL:-70000}
PROFILE=${PROFILE:-0}
KEEP=${KEEP:-0}
REV=${REV:-}
VARIANTS=${VARIANTS:-1}
POSTGRES=${POSTGRES:-1}
POSTGRES_SETTINGS=${POSTGRES_SETTINGS:-}
POSTGRES_URL_OPTIONS=${POSTGRES_URL_OPTIONS:-}
MEMORY=${MEMORY:-1}
BOUND=${BOUND:-1}
CLUSTER=${CLUSTER:-}
ONECONN=${ONECONN:-1}
MODES=${MODES:-}
MICRO=${MICRO:-1}
WARMUP=${WARMUP:-1s}

load_setup
# redis-cli makes clusters (--cluster create) since Redis 5. Its help
# exits 1, so read its text, not its status.
cluster_capable() {
	local help
	help=$(redis-cli --cluster help 2>&1 || true)
	grep -q '^ *create ' <<<"$help"
}
if [[ -z "$CLUSTER" ]]; then
	CLUSTER=0
	if cluster_capable; then
		CLUSTER=1
	else
		echo "run.sh: this redis-cli cannot create a Redis Cluster (Redis 5 or later can): no replayguard-cluster" >&2
	fi
elif [[ "$CLUSTER" == 1 ]] && ! cluster_capable; then
	die "CLUSTER=1 but this redis-cli cannot create a Redis Cluster (Redis 5 or later can)"
fi
if [[ "$POSTGRES" == 1 ]]; then
	PG_BIN=$(pg_bin) || die "PostgreSQL's initdb not found (looked on PATH and in /usr/lib/postgresql/*/bin): apt-get install postgresql, or POSTGRES=0"
fi

section machine
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "nproc: $(nproc)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
echo "kernel: $(uname -r)"
echo "go: $(go version)"
echo "redis: $(redis-server --version)"
if [[ "$POSTGRES" == 1 ]]; then
	echo "postgresql: $("$PG_BIN/postgres" --version)"
fi
if [[ -n "$REV" ]]; then
	echo "source: commit $(git rev-parse --short "$REV^{commit}") ($REV, git archive; test/load from the work tree)"
	SRC="$WORK/src"
	mkdir -p "$SRC"
	git archive "$REV" | tar -x -C "$SRC"
	rm -rf "$SRC/test/load"
	mkdir -p "$SRC/test"
	cp -r test/load "$SRC/test/load"
	cd "$SRC"
else
	echo "source: work tree at $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ', with uncommitted changes')"
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "load: $ROUNDS rounds of $DURATION per mode, $WORKERS workers; pools: $VERIFY_POOL signed requests per verify run, $REDEEM_POOL tokens per redeem run"
echo "priority: niceness $NICE; autogroup: $(cat /proc/self/autogroup 2>/dev/null || echo none)"

section build
go build -o "$WORK/server" ./cmd/server
go build -o "$WORK/baseline" ./test/load/baseline
# BOUNDS lists the bound fixtures built; bound NAME: NAME is one.
BOUNDS=()
bound() { [[ " ${BOUNDS[*]-} " == *" $1 "* ]]; }
if [[ "$BOUND" == 1 ]]; then
	# They write their answers with the measured source's packages
	# problem, token and store: an older REV may lack what they call.
	for name in bound401 boundpairs; do
		if [[ -n "$REV" ]]; then
			go build -o "$WORK/$name" "./test/load/$name" || {
				echo "run.sh: test/load/$name does not build against $REV: no $name" >&2
				continue
			}
		else
			go build -o "$WORK/$name" "./test/load/$name"
		fi
		BOUNDS+=("$name")
	done
fi
go build -o "$WORK/load" ./test/load
# The client keys verify mode signs with: fixed test keys (load clientkeys).
(umask 077 && "$WORK/load" clientkeys >"$WORK/client-keys.json")
echo ok

section redis
load_redis
rcli() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" "$@"; }

if [[ "$CLUSTER" == 1 ]]; then
	section "redis cluster"
	CLUSTER_ADDRS=()
	CLUSTER_PIDS=()
	for _ in 1 2 3; do
		start_redis cluster
		CLUSTER_ADDRS+=("127.0.0.1:$STARTED_PORT")
		CLUSTER_PIDS+=("$STARTED_PID")
	done
	# redis-cli's account of the slots it assigns goes to a file; a
	# failure to stderr.
	redis_cluster_create "${CLUSTER_ADDRS[@]}" >"$WORK/redis-cluster-create.log"
	echo "redis cluster on ${CLUSTER_ADDRS[*]} (pids ${CLUSTER_PIDS[*]}): three masters, no replicas, --save '' --appendonly no"
fi

if [[ "$POSTGRES" == 1 ]]; then
	section postgres
	PG_DIR=$(mktemp -d /tmp/replayguard-load-pg-XXXXXX)
	TMPDIRS+=("$PG_DIR")
	pg_settings=()
	for kv in $POSTGRES_SETTINGS; do
		pg_settings+=(-c "$kv")
	done
	PG_NICE=$NICE pg_start "$PG_BIN" "$PG_DIR" ${pg_settings[@]+"${pg_settings[@]}"}
	PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable$POSTGRES_URL_OPTIONS"
	echo "postgres on 127.0.0.1:$PG_PORT (pid $PG_PID, dir $PG_DIR): ${POSTGRES_SETTINGS:-the default settings}"
	echo "its settings: $("$PG_BIN/psql" -X -A -t -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres \
		-c "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync','synchronous_commit','full_page_writes','shared_buffers','max_connections','wal_level')" 2>/dev/null || echo unknown)"
fi

if [[ "$MICRO" == 1 ]]; then
	section "go benchmarks"
	# Benchmarks that can use a Redis (token's BenchmarkStores, store/redis)
	# use the run's own, database 2.
	export REPLAYGUARD_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/2"
	echo "REPLAYGUARD_TEST_REDIS_URL=$REPLAYGUARD_TEST_REDIS_URL"
	echo '$ go test -run XXX -bench . -skip BenchmarkRedeemParallel ./token/ ./store/memory/'
	N go test -run XXX -bench . -skip BenchmarkRedeemParallel ./token/ ./store/memory/ | tee "$WORK/gobench.txt"
	# BenchmarkRedeemParallel redeems b.N live tokens, and its cost per
	# redemption grows with their number (DRAM and TLB misses: 2.5-3.0M/s
	# with one or two million, 1.6-2.4M/s with the 3.5 million the default
	# -benchtime picks). Run it on the live set a default memory store
	# holds at most (REPLAYGUARD_MEMORY_MAX_ENTRIES, 1,000,000), three
	# times; the report takes the lowest.
	echo '$ go test -run XXX -bench BenchmarkRedeemParallel -benchtime 1000000x -count 3 ./store/memory/'
	N go test -run XXX -bench BenchmarkRedeemParallel -benchtime 1000000x -count 3 ./store/memory/ | tee "$WORK/gobench-mem.txt"
	GOBENCH="$WORK/gobench.txt,$WORK/gobench-mem.txt"
	if grep -qs '^func Benchmark' store/redis/*_test.go; then
		echo '$ go test -run XXX -bench . ./store/redis/'
		N go test -run XXX -bench . ./store/redis/ | tee "$WORK/gobench-redis.txt"
		GOBENCH+=",$WORK/gobench-redis.txt"
	else
		echo "store/redis has no benchmarks"
	fi
	if grep -qs '^func BenchmarkVerify' replay/*_test.go; then
		echo '$ go test -run XXX -bench BenchmarkVerify ./replay/'
		N go test -run XXX -bench BenchmarkVerify ./replay/ | tee "$WORK/gobench-replay.txt"
		GOBENCH+=",$WORK/gobench-replay.txt"
	else
		echo "replay has no BenchmarkVerify"
	fi
	unset REPLAYGUARD_TEST_REDIS_URL
	rcli flushall >/dev/null

	section redis-benchmark
	RB="$WORK/redisbench.txt"
	rb() { N redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" "$@" | tr '\r' '\n' | grep 'requests per second' | tee -a "$RB"; }
	rb -n 200000 -q -t set,get
	rb -n 200000 -r 100000 -q SET 'rb:{__rand_int__}' x NX EX 300
	before=$(rcli dbsize)
	rb -n 200000 -r 100000 -q GETDEL 'rb:{__rand_int__}'
	after=$(rcli dbsize)
	echo "# GETDEL: $((before - after)) of 200000 calls found and deleted a key ($before keys before), the rest missed" | tee -a "$RB"
	rcli flushall >/dev/null
	rb -n 200000 -r 100000 -q SET 'rb:{__rand_int__}' x NX EX 300 >/dev/null
	SHA=$(rcli script load "$(cat store/redis/redeem.lua)")
	before=$(rcli dbsize)
	# KEYS[2] is the token's record key, which no token here has. ARGV[3]
	# (owner) and ARGV[4] (lease) are empty and 0: redeem without a record.
	# Scripts from before issue 9 take two ARGV and ignore the rest.
	rb -n 200000 -r 100000 -q EVALSHA "$SHA" 2 'rb:{__rand_int__}' 'rb:{__rand_int__}t' x x '' 0
	after=$(rcli dbsize)
	echo "# EVALSHA runs store/redis/redeem.lua (sha $SHA): $((before - after)) of 200000 calls redeemed a key ($before keys before), the rest found none" | tee -a "$RB"
	echo "# redis-benchmark: 50 clients, no pipelining; -r 100000 random keys" | tee -a "$RB"
	rcli flushall >/dev/null
else
	echo
	echo "MICRO=0: no Go benchmarks, no redis-benchmark"
	GOBENCH= RB=
fi

section servers
# A fixed 33-byte test key; never use it anywhere else.
SIGNING_KEYS="load:$(printf 'replayguard-load-test-signing-key' | base64 -w0)"
# start_replayguard LABEL VAR=VALUE...: starts the server under test at
# the run's niceness on a free port, with nothing from this environment
# but PATH and HOME, no issue rate, the fixed signing key and VAR=VALUE...,
# logging to $WORK/server-LABEL.log; waits for /readyz; sets SERVER_PORT
# and SERVER_PID.
start_replayguard() {
	local label=$1
	shift
	free_port || die "no free port"
	SERVER_PORT=$FREE_PORT
	nice -n "$NICE" env -i PATH="$PATH" HOME="${HOME:-/root}" \
		REPLAYGUARD_ADDR="127.0.0.1:$SERVER_PORT" \
		REPLAYGUARD_ISSUE_RATE=0 \
		REPLAYGUARD_SIGNING_KEYS="$SIGNING_KEYS" \
		"$@" "$WORK/server" >"$WORK/server-$label.log" 2>&1 &
	SERVER_PID=$!
	PIDS+=("$SERVER_PID")
	wait_http "http://127.0.0.1:$SERVER_PORT/readyz" GET 200 "$SERVER_PID" ||
		die "$label did not get ready: $(tail -5 "$WORK/server-$label.log")"
}
start_replayguard replayguard \
	REPLAYGUARD_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0" \
	REPLAYGUARD_MACHINE_ID=1 \
	REPLAYGUARD_CLIENT_KEYS="$WORK/client-keys.json"
RG_PORT=$SERVER_PORT RG_PID=$SERVER_PID
free_port || die "no free port"
BL_PORT=$FREE_PORT
nice -n "$NICE" "$WORK/baseline" -addr "127.0.0.1:$BL_PORT" -redis "redis://127.0.0.1:$REDIS_PORT/1" >"$WORK/baseline.log" 2>&1 &
BL_PID=$!
PIDS+=("$BL_PID")
wait_http "http://127.0.0.1:$BL_PORT/noop" POST 204 "$BL_PID" || die "baseline did not start: $(tail -5 "$WORK/baseline.log")"
echo "replayguard on 127.0.0.1:$RG_PORT (pid $RG_PID): REPLAYGUARD_ISSUE_RATE=0, no API keys, Redis db 0, REPLAYGUARD_MACHINE_ID=1, REPLAYGUARD_CLIENT_KEYS (load clientkeys), logs to a file"
echo "baseline    on 127.0.0.1:$BL_PORT (pid $BL_PID): Redis db 1"
# Each entry: label mode port pid [load flags...]; a mode with a suffix
# (pairs-1conn) is the load mode before the - under that name (see
# load_args). PROFILED lists the entries PROFILE=1 profiles.
PLAN=(
	"replayguard pairs $RG_PORT $RG_PID"
	"baseline pairs $BL_PORT $BL_PID"
	"replayguard forged $RG_PORT $RG_PID"
	"baseline noop $BL_PORT $BL_PID"
	"replayguard verify $RG_PORT $RG_PID -alg hmac -pool $VERIFY_POOL"
	"replayguard verify $RG_PORT $RG_PID -alg ed25519 -pool $VERIFY_POOL"
	"baseline redeem $BL_PORT $BL_PID -pool $REDEEM_POOL"
)
PROFILED=(0 1 2 3 4 5 6)
if [[ "$VARIANTS" == 1 ]]; then
	# The same server with its per-request log lines dropped (they are at
	# level info): what request logging costs. Its own machine ID and key
	# prefix, though it never runs at the same time as the other.
	start_replayguard replayguard-quiet \
		REPLAYGUARD_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0" \
		REPLAYGUARD_KEY_PREFIX="rgq:" \
		REPLAYGUARD_MACHINE_ID=2 \
		REPLAYGUARD_LOG_LEVEL=warn
	RQ_PORT=$SERVER_PORT RQ_PID=$SERVER_PID
	echo "replayguard-quiet on 127.0.0.1:$RQ_PORT (pid $RQ_PID): the same with REPLAYGUARD_LOG_LEVEL=warn, REPLAYGUARD_MACHINE_ID=2, key prefix rgq:"
	PLAN+=(
		"replayguard-quiet pairs $RQ_PORT $RQ_PID"
		"replayguard-quiet forged $RQ_PORT $RQ_PID"
	)
fi
# The store processes each target's runs watch (load -watch): the
# PostgreSQL instance's is the postmaster with its backends (+), the
# Cluster instance's its three nodes under one name, the memory
# instance's and the bound fixtures' none, the others' the run's Redis.
declare -A STORE_WATCH=()
if [[ "$POSTGRES" == 1 ]]; then
	# The same server on the PostgreSQL store: its own machine ID; it
	# migrates the empty cluster's database at start.
	start_replayguard replayguard-postgres \
		REPLAYGUARD_POSTGRES_URL="$PG_URL" \
		REPLAYGUARD_MACHINE_ID=3
	RP_PORT=$SERVER_PORT RP_PID=$SERVER_PID
	echo "replayguard-postgres on 127.0.0.1:$RP_PORT (pid $RP_PID): the same on REPLAYGUARD_POSTGRES_URL=$PG_URL, REPLAYGUARD_MACHINE_ID=3"
	STORE_WATCH[replayguard-postgres]="postgres:$PG_PID+"
	PLAN+=("replayguard-postgres pairs $RP_PORT $RP_PID")
	PROFILED+=("$((${#PLAN[@]} - 1))")
fi
if [[ "$MEMORY" == 1 ]]; then
	# The same server on the embedded memory store: no Redis at all.
	start_replayguard replayguard-memory REPLAYGUARD_MACHINE_ID=4
	RM_PORT=$SERVER_PORT RM_PID=$SERVER_PID
	echo "replayguard-memory on 127.0.0.1:$RM_PORT (pid $RM_PID): the same on the embedded memory store (no Redis), REPLAYGUARD_MACHINE_ID=4"
	STORE_WATCH[replayguard-memory]=""
	PLAN+=("replayguard-memory pairs $RM_PORT $RM_PID")
	PROFILED+=("$((${#PLAN[@]} - 1))")
fi
if [[ "$CLUSTER" == 1 ]]; then
	# The same server on the run's Redis Cluster.
	start_replayguard replayguard-cluster \
		REPLAYGUARD_REDIS_CLUSTER_ADDRS="$(IFS=,; echo "${CLUSTER_ADDRS[*]}")" \
		REPLAYGUARD_MACHINE_ID=5
	RC_PORT=$SERVER_PORT RC_PID=$SERVER_PID
	echo "replayguard-cluster on 127.0.0.1:$RC_PORT (pid $RC_PID): the same on REPLAYGUARD_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${CLUSTER_ADDRS[*]}"), REPLAYGUARD_MACHINE_ID=5"
	STORE_WATCH[replayguard-cluster]=$(printf 'redis:%s,' "${CLUSTER_PIDS[@]}")
	STORE_WATCH[replayguard-cluster]=${STORE_WATCH[replayguard-cluster]%,}
	PLAN+=("replayguard-cluster pairs $RC_PORT $RC_PID")
	PROFILED+=("$((${#PLAN[@]} - 1))")
fi
if bound bound401; then
	# Replayguard's forged answer with nothing else done: no store, no
	# token read. Not profiled.
	free_port || die "no free port"
	BD_PORT=$FREE_PORT
	nice -n "$NICE" "$WORK/bound401" -addr "127.0.0.1:$BD_PORT" >"$WORK/bound401.log" 2>&1 &
	BD_PID=$!
	PIDS+=("$BD_PID")
	wait_http "http://127.0.0.1:$BD_PORT/v1/tokens/redeem" POST 401 "$BD_PID" || die "bound401 did not start: $(tail -5 "$WORK/bound401.log")"
	echo "bound401    on 127.0.0.1:$BD_PORT (pid $BD_PID): Replayguard's forged-token answer from a bare Gin handler, no store"
	STORE_WATCH[bound401]=""
	PLAN+=("bound401 forged $BD_PORT $BD_PID -kid ${SIGNING_KEYS%%:*}")
fi
if bound boundpairs; then
	# Replayguard's issue and redeem answers with the least done between:
	# unsigned tokens in an in-process map, no store process. Its ready
	# check, a redeem without a token (400), issues none. Not profiled.
	free_port || die "no free port"
	BP_PORT=$FREE_PORT
	nice -n "$NICE" "$WORK/boundpairs" -addr "127.0.0.1:$BP_PORT" >"$WORK/boundpairs.log" 2>&1 &
	BP_PID=$!
	PIDS+=("$BP_PID")
	wait_http "http://127.0.0.1:$BP_PORT/v1/tokens/redeem" POST 400 "$BP_PID" || die "boundpairs did not start: $(tail -5 "$WORK/boundpairs.log")"
	echo "boundpairs  on 127.0.0.1:$BP_PORT (pid $BP_PID): Replayguard's issue and redeem answers from a bare Gin handler, unsigned tokens in an in-process map"
	STORE_WATCH[boundpairs]=""
	PLAN+=("boundpairs pairs $BP_PORT $BP_PID")
fi
if [[ "$ONECONN" == 1 ]]; then
	# Pairs at one worker: latency with nothing to share a round trip
	# with. Not profiled.
	PLAN+=(
		"replayguard pairs-1conn $RG_PORT $RG_PID -workers 1"
		"baseline pairs-1conn $BL_PORT $BL_PID -workers 1"
	)
fi
# wanted MODE: MODES is unset or lists MODE.
wanted() { [[ -z "$MODES" || " $MODES " == *" $1 "* ]]; }

section load
RUNS="$WORK/runs.jsonl"
UNCLEAN=0
# watch_spec LABEL PID: load's -watch for a run of LABEL's server PID.
watch_spec() {
	local store=${STORE_WATCH[$1]-redis:$REDIS_PID}
	echo "server:$2${store:+,$store}"
}
# load_args MODE ARGS...: sets ARGS to load's flags for a plan entry of
# MODE with ARGS: a MODE with a suffix (pairs-1conn) runs the mode before
# the - under MODE's name (-name), and WORKERS workers unless ARGS say.
load_args() {
	local mode=$1
	shift
	ARGS=(-mode "${mode%%-*}")
	[[ "$mode" == *-* ]] && ARGS+=(-name "$mode")
	[[ " $* " == *" -workers "* ]] || ARGS+=(-workers "$WORKERS")
	ARGS+=("$@")
}
load() {
	local label=$1 mode=$2 port=$3 pid=$4
	shift 4
	load_args "$mode" "$@"
	echo "\$ load -url http://127.0.0.1:$port -label $label ${ARGS[*]} -duration $DURATION"
	N "$WORK/load" -url "http://127.0.0.1:$port" -label "$label" "${ARGS[@]}" -duration "$DURATION" \
		-watch "$(watch_spec "$label" "$pid")" -json "$RUNS" || UNCLEAN=$((UNCLEAN + 1))
	echo
}
# The plan's entries whose mode MODES selects.
SELECTED=()
for ((i = 0; i < ${#PLAN[@]}; i++)); do
	# shellcheck disable=SC2086 # the plan's fields are words
	set -- ${PLAN[$i]}
	if wanted "$2"; then
		SELECTED+=("$i")
	fi
done
((${#SELECTED[@]} > 0)) || die "MODES=$MODES selects none of the load runs"
# A server's first load (connections, goroutine stacks, the heap, the
# CPU caches) ran about a quarter slower than its later rounds: warm each
# one up once, unmeasured, so that the first round is not the odd one out.
if [[ "$WARMUP" != 0 ]]; then
	echo "-- warm-up: $WARMUP of each load run, not measured"
	for i in "${SELECTED[@]}"; do
		# shellcheck disable=SC2086 # the plan's fields are words
		RUNS="$WORK/warmup.jsonl" DURATION=$WARMUP load ${PLAN[$i]} >/dev/null
	done
fi
for ((round = 1; round <= ROUNDS; round++)); do
	echo "-- round $round of $ROUNDS"
	order=()
	for ((j = 0; j < ${#SELECTED[@]}; j++)); do
		if ((round % 2 == 1)); then
			order+=("${SELECTED[j]}")
		else
			order+=("${SELECTED[${#SELECTED[@]} - 1 - j]}")
		fi
	done
	for i in "${order[@]}"; do
		# shellcheck disable=SC2086 # the plan's fields are words
		load ${PLAN[$i]}
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "replayguard log: $(wc -l <"$WORK/server-replayguard.log") lines, $(grep -c '"level":"ERROR"' "$WORK/server-replayguard.log" || true) at level ERROR"
for name in postgres memory cluster; do
	f="$WORK/server-$name.log"
	[[ -e "$f" ]] || continue
	echo "replayguard-$name log: $(wc -l <"$f") lines, $(grep -c '"level":"ERROR"' "$f" || true) at level ERROR"
done

section report
"$WORK/load" report -runs "$RUNS" -gobench "$GOBENCH" -redisbench "$RB" | tee "$WORK/report.md"

if [[ "$PROFILE" == 1 ]]; then
	section "profile (perf; separate runs, not part of the figures above)"
	command -v perf >/dev/null 2>&1 || die "perf not found (apt-get install linux-perf)"
	PRUNS="$WORK/profile-runs.jsonl"
	SPLIT=()
	for i in "${PROFILED[@]}"; do
		# shellcheck disable=SC2086 # the plan's fields are words
		set -- ${PLAN[$i]}
		label=$1 mode=$2 port=$3 pid=$4
		shift 4
		wanted "$mode" || continue
		# The report's name of the mode: verify/hmac for -mode verify -alg hmac.
		name=$mode
		if [[ " $* " =~ " -alg "([a-z0-9]+)" " ]]; then
			name="$mode/${BASH_REMATCH[1]}"
		fi
		# A 5s run: twice the prepared requests of a measured run.
		extra=()
		if [[ " $* " =~ " -pool "([0-9]+)" " ]]; then
			extra=(-pool "$((2 * BASH_REMATCH[1]))")
		fi
		file="$WORK/perf-$label-${name//\//-}"
		# The ready file comes once the requests are prepared, so that
		# neither signing nor issuing is profiled.
		load_args "$mode" "$@" ${extra[@]+"${extra[@]}"}
		profile_run "$pid" "$file" "$label $name: top symbols by inclusive share of server CPU" \
			-url "http://127.0.0.1:$port" -label "$label" "${ARGS[@]}" \
			-watch "$(watch_spec "$label" "$pid")" -json "$PRUNS"
		SPLIT+=("$label:$name=$file.txt")
	done
	# Shares come from the profiles; µs from the measured (unprofiled) runs'
	# server CPU per success, since perf itself slows the servers down.
	echo "--- server CPU by category (load perfsplit: shares from perf, µs from the measured runs)"
	"$WORK/load" perfsplit -runs "$RUNS" "${SPLIT[@]}"
fi

if ((UNCLEAN > 0)); then
	die "$UNCLEAN load run(s) saw 5xx, transport errors or unexpected answers"
fi
