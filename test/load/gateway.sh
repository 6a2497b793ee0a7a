#!/usr/bin/env bash
# Benchmark of the gateway (issue 5): what an idempotency record costs on
# the first execution of a request and on its replay, against the bare
# app, on the memory store and on Redis. Run from anywhere as:
#   bash test/load/gateway.sh
#
# It starts its own redis-server on a free loopback port (no persistence),
# builds cmd/server, test/load/app and test/load, then:
#   1. the Go benchmarks of the records: BenchmarkIdempotency (handlers:
#      the middleware around an in-process handler) and
#      BenchmarkAcquire* (store/memory, store/redis), on the run's Redis;
#   2. starts the app (test/load/app: 201, a Location and a ~200-byte JSON
#      body for every POST) and two gateways in front of it
#      (REPLAYGUARD_UPSTREAM, REPLAYGUARD_ROUTES=test/load/gateway-routes.yaml:
#      POST /orders idempotency_key, required; POST /submit fingerprint,
#      window 1h), one on the memory store and one on the Redis;
#   3. the load program's gateway modes, POSTing small JSON orders: bare
#      (the app itself, /orders), and through each gateway passthrough
#      (/plain, no route), first (/orders, a fresh Idempotency-Key each),
#      replay (/orders, each worker repeating one completed key), fp-first
#      (/submit, keyless, each body new) and fp-replay (/submit, each
#      worker repeating one completed body); in ROUNDS rounds, each in the
#      reverse order of the one before, so that a drift in what else the
#      machine is doing falls on both sides of every comparison alike.
#      Any answer but the app's 201 with a Location, a replay where a new
#      execution was due or a new execution (or a differing replay) where
#      a replay was due counts as an error, and fails the script;
#   4. the report (load gateway-report): throughput, p50/p99 and CPU per
#      request, each against the bare app, and a check of the app's own
#      count of executions: one per new request and one per worker's
#      repeated request, none for a replay.
# Every process it starts is stopped by pid at exit, pass or fail. Traffic
# goes to 127.0.0.1 only. The gateways log every request (level info, the
# default) to files in the work directory, as a deployment would.
#
# Environment:
#   DURATION=3s   length of each load run
#   ROUNDS=4      rounds of the load runs (4 x 3s = 12s per mode)
#   WORKERS=64    concurrent workers of each load run
#   PROFILE=1     afterwards, perf-record the gateway during one more 5s
#                 run of passthrough, first, replay and fp-first on
#                 memory and of first and replay on Redis, print the top
#                 symbols and the split of the gateway's CPU by category
#                 (load perfsplit); the measured runs are never profiled
#   KEEP=1        keep the work directory (logs, JSON lines, report)
#   GOBENCH=0     skip the Go benchmarks (step 1)
#   NICE=-10      priority of the run on a shared machine, as in run.sh:
#                 the script re-runs itself in a session of its own
#                 (setsid) whose autogroup niceness, and each process's,
#                 is NICE; NICE=0 turns it off. Each load run reports the
#                 CPU other processes still took.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec </dev/null

NICE=${NICE:--10}
SCRIPT=test/load/gateway.sh
TOOLS="go redis-server redis-cli curl"
# shellcheck source=test/load/lib.sh
. test/load/lib.sh
load_session "$@"

DURATION=${DURATION:-3s}
ROUNDS=${ROUNDS:-4}
WORKERS=${WORKERS:-64}
PROFILE=${PROFILE:-0}
KEEP=${KEEP:-0}
GOBENCH=${GOBENCH:-1}

load_setup

section machine
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "nproc: $(nproc)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "go: $(go version)"
echo "redis: $(redis-server --version)"
echo "source: work tree at $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo ', with uncommitted changes')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "load: $ROUNDS rounds of $DURATION per mode, $WORKERS workers"
echo "priority: niceness $NICE; autogroup: $(cat /proc/self/autogroup 2>/dev/null || echo none)"

section build
go build -o "$WORK/server" ./cmd/server
go build -o "$WORK/app" ./test/load/app
go build -o "$WORK/load" ./test/load
echo ok

section redis
load_redis

GOBENCH_FILES=""
if [[ "$GOBENCH" != 0 ]]; then
	section "go benchmarks"
	# On the run's Redis, database 2.
	export REPLAYGUARD_TEST_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/2"
	echo "REPLAYGUARD_TEST_REDIS_URL=$REPLAYGUARD_TEST_REDIS_URL"
	echo '$ go test -run XXX -bench Idempotency -benchmem ./handlers/'
	N go test -run XXX -bench Idempotency -benchmem ./handlers/ | tee "$WORK/gobench-handlers.txt"
	echo '$ go test -run XXX -bench Acquire -benchmem ./store/memory/ ./store/redis/'
	N go test -run XXX -bench Acquire -benchmem ./store/memory/ ./store/redis/ | tee "$WORK/gobench-stores.txt"
	GOBENCH_FILES="$WORK/gobench-handlers.txt,$WORK/gobench-stores.txt"
	unset REPLAYGUARD_TEST_REDIS_URL
	redis-cli -p "$REDIS_PORT" flushall >/dev/null
fi

section servers
free_port || die "no free port"
APP_PORT=$FREE_PORT
free_port || die "no free port"
GM_PORT=$FREE_PORT
free_port || die "no free port"
GR_PORT=$FREE_PORT
ROUTES="$PWD/test/load/gateway-routes.yaml"
nice -n "$NICE" "$WORK/app" -addr "127.0.0.1:$APP_PORT" >"$WORK/app.log" 2>&1 &
APP_PID=$!
PIDS+=("$APP_PID")
# gateway NAME PORT [VAR=value...]: start a gateway in front of the app;
# sets GW_PID.
gateway() {
	local name=$1 port=$2
	shift 2
	nice -n "$NICE" env -i PATH="$PATH" HOME="${HOME:-/root}" \
		REPLAYGUARD_ADDR="127.0.0.1:$port" \
		REPLAYGUARD_UPSTREAM="http://127.0.0.1:$APP_PORT" \
		REPLAYGUARD_ROUTES="$ROUTES" \
		"$@" \
		"$WORK/server" >"$WORK/gateway-$name.log" 2>&1 &
	GW_PID=$!
	PIDS+=("$GW_PID")
}
# The load program is one client at one address, which the memory
# store's per-caller and per-address bounds on records would refuse with
# 429 after some thousands of first executions: they are off here.
gateway memory "$GM_PORT" REPLAYGUARD_IDEMPOTENCY_MAX_PER_CALLER=0 REPLAYGUARD_IDEMPOTENCY_MAX_PER_ADDRESS=0 REPLAYGUARD_IDEMPOTENCY_MAX_BYTES_PER_ADDRESS=0
GM_PID=$GW_PID
gateway redis "$GR_PORT" REPLAYGUARD_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
GR_PID=$GW_PID
wait_http "http://127.0.0.1:$APP_PORT/_count" GET 200 "$APP_PID" || die "the app did not start: $(tail -5 "$WORK/app.log")"
wait_http "http://127.0.0.1:$GM_PORT/readyz" GET 200 "$GM_PID" || die "the memory gateway did not get ready: $(tail -5 "$WORK/gateway-memory.log")"
wait_http "http://127.0.0.1:$GR_PORT/readyz" GET 200 "$GR_PID" || die "the Redis gateway did not get ready: $(tail -5 "$WORK/gateway-redis.log")"
echo "app            on 127.0.0.1:$APP_PORT (pid $APP_PID)"
echo "gateway memory on 127.0.0.1:$GM_PORT (pid $GM_PID): the embedded memory store"
echo "gateway redis  on 127.0.0.1:$GR_PORT (pid $GR_PID): Redis db 0"
echo "routes ($ROUTES):"
sed 's/^/  /' "$ROUTES"

# Each entry: label mode port path watch. PROFILED lists the entries
# PROFILE=1 profiles.
APPW="app:$APP_PID"
GMW="server:$GM_PID,app:$APP_PID"
GRW="server:$GR_PID,app:$APP_PID,redis:$REDIS_PID"
PLAN=(
	"app bare $APP_PORT /orders $APPW"
	"memory passthrough $GM_PORT /plain $GMW"
	"memory first $GM_PORT /orders $GMW"
	"memory replay $GM_PORT /orders $GMW"
	"memory fp-first $GM_PORT /submit $GMW"
	"memory fp-replay $GM_PORT /submit $GMW"
	"redis passthrough $GR_PORT /plain $GRW"
	"redis first $GR_PORT /orders $GRW"
	"redis replay $GR_PORT /orders $GRW"
	"redis fp-first $GR_PORT /submit $GRW"
	"redis fp-replay $GR_PORT /submit $GRW"
)
PROFILED=(1 2 3 4 7 8)

section load
RUNS="$WORK/runs.jsonl"
UNCLEAN=0
load() {
	local label=$1 mode=$2 port=$3 path=$4 watch=$5
	echo "\$ load -url http://127.0.0.1:$port -label $label -mode $mode -path $path -workers $WORKERS -duration $DURATION"
	N "$WORK/load" -url "http://127.0.0.1:$port" -label "$label" -mode "$mode" -path "$path" \
		-workers "$WORKERS" -duration "$DURATION" -watch "$watch" -json "$RUNS" || UNCLEAN=$((UNCLEAN + 1))
	echo
}
for ((round = 1; round <= ROUNDS; round++)); do
	echo "-- round $round of $ROUNDS"
	order=()
	for ((i = 0; i < ${#PLAN[@]}; i++)); do
		if ((round % 2 == 1)); then
			order+=("$i")
		else
			order+=("$((${#PLAN[@]} - 1 - i))")
		fi
	done
	for i in "${order[@]}"; do
		# shellcheck disable=SC2086 # the plan's fields are words
		load ${PLAN[$i]}
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
APP_EXECUTIONS=$(curl -s "http://127.0.0.1:$APP_PORT/_count" | tr -dc 0-9)
[[ -n "$APP_EXECUTIONS" ]] || die "the app did not tell its executions"
for name in memory redis; do
	log="$WORK/gateway-$name.log"
	echo "gateway $name log: $(wc -l <"$log") lines, $(grep -c '"level":"ERROR"' "$log" || true) at level ERROR"
done
echo "Redis: $(redis-cli -p "$REDIS_PORT" dbsize) keys, $(redis-cli -p "$REDIS_PORT" info memory | grep '^used_memory_human:' | tr -d '\r')"

section report
# The report also checks the app's count of executions against the runs:
# a replay that reached the app fails the script here.
"$WORK/load" gateway-report -runs "$RUNS" -gobench "$GOBENCH_FILES" -app-executions "$APP_EXECUTIONS" | tee "$WORK/report.md"

if [[ "$PROFILE" == 1 ]]; then
	section "profile (perf; separate runs, not part of the figures above)"
	command -v perf >/dev/null 2>&1 || die "perf not found (apt-get install linux-perf)"
	SPLIT=()
	for i in "${PROFILED[@]}"; do
		# shellcheck disable=SC2086 # the plan's fields are words
		set -- ${PLAN[$i]}
		label=$1 mode=$2 port=$3 path=$4 watch=$5
		pid=${watch#server:}
		pid=${pid%%,*}
		file="$WORK/perf-$label-$mode"
		# The ready file comes once the repeated requests are completed.
		profile_run "$pid" "$file" "gateway $label $mode: top symbols by inclusive share of the gateway's CPU" \
			-url "http://127.0.0.1:$port" -label "$label" -mode "$mode" -path "$path" -workers "$WORKERS" \
			-watch "$watch" -json "$WORK/profile-runs.jsonl"
		SPLIT+=("$label:$mode=$file.txt")
	done
	# Shares come from the profiles; µs from the measured (unprofiled)
	# runs' gateway CPU per success, since perf itself slows it down.
	echo "--- gateway CPU by category (load perfsplit: shares from perf, µs from the measured runs)"
	"$WORK/load" perfsplit -runs "$RUNS" "${SPLIT[@]}"
fi

if ((UNCLEAN > 0)); then
	die "$UNCLEAN load run(s) saw 5xx, transport errors or unexpected answers"
fi
