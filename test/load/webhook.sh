#!/usr/bin/env bash
# Benchmark of the gateway's webhook route (issue 12): verified Standard
# Webhooks deliveries per second through the gateway on Redis, against the
# same app behind the same gateway on a path no route matches, in one run.
# Run from anywhere as:
#   bash test/load/webhook.sh
#
# It starts its own redis-server on a free loopback port (no persistence),
# builds cmd/server, test/load/app and test/load, then:
#   1. the Go benchmark of verification alone (BenchmarkVerify, package
#      webhook: each scheme over a 1 KiB body, no store);
#   2. starts the app (test/load/app: 201, a Location and a ~200-byte JSON
#      body for every POST) and one gateway in front of it on the Redis
#      (REPLAYGUARD_ROUTES=test/load/webhook-routes.yaml: POST /hooks/orders
#      is a webhook route, scheme standard, its secret in
#      LOAD_WEBHOOK_SECRET, the one "load webhook-secret" prints);
#   3. the load program's modes, POSTing small JSON orders: bare (the app
#      itself), passthrough (the gateway, /plain: no route), wh-first
#      (/hooks/orders, each a new delivery with its own webhook-id, signed
#      by the load program as it sends it: verified, recorded in Redis, run
#      by the app, the answer stored) and wh-replay (/hooks/orders, each
#      worker redelivering one completed delivery, signed anew each time:
#      verified and answered from Redis, the app never runs); in ROUNDS
#      rounds, each in the reverse order of the one before, so that a
#      drift in what else the machine is doing falls on both sides of
#      every comparison alike. Any answer but the app's 201, a replay where
#      a new execution was due or a new execution where a replay was due
#      counts as an error, and fails the script;
#   4. the report (load gateway-report): throughput, p50/p99 and CPU per
#      request against the bare app and against pass-through, and the
#      app's own count of executions checked: one per new delivery and one
#      per worker's redelivered one, none for a redelivery.
# Every process it starts is stopped by pid at exit, pass or fail. Traffic
# goes to 127.0.0.1 only. The gateway logs every request (level info, the
# default) to a file in the work directory, as a deployment would.
#
# Environment: DURATION=3s, ROUNDS=4, WORKERS=64, KEEP=1, GOBENCH=0 and
# NICE=-10, as for gateway.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec </dev/null

NICE=${NICE:--10}
SCRIPT=test/load/webhook.sh
TOOLS="go redis-server redis-cli curl"
# shellcheck source=test/load/lib.sh
. test/load/lib.sh
load_session "$@"

DURATION=${DURATION:-3s}
ROUNDS=${ROUNDS:-4}
WORKERS=${WORKERS:-64}
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

GOBENCH_FILES=""
if [[ "$GOBENCH" != 0 ]]; then
	section "go benchmarks"
	echo '$ go test -run XXX -bench Verify -benchmem ./webhook/'
	N go test -run XXX -bench Verify -benchmem ./webhook/ | tee "$WORK/gobench-webhook.txt"
	GOBENCH_FILES="$WORK/gobench-webhook.txt"
fi

section redis
load_redis

section servers
free_port || die "no free port"
APP_PORT=$FREE_PORT
free_port || die "no free port"
GW_PORT=$FREE_PORT
ROUTES="$PWD/test/load/webhook-routes.yaml"
nice -n "$NICE" "$WORK/app" -addr "127.0.0.1:$APP_PORT" >"$WORK/app.log" 2>&1 &
APP_PID=$!
PIDS+=("$APP_PID")
nice -n "$NICE" env -i PATH="$PATH" HOME="${HOME:-/root}" \
	REPLAYGUARD_ADDR="127.0.0.1:$GW_PORT" \
	REPLAYGUARD_UPSTREAM="http://127.0.0.1:$APP_PORT" \
	REPLAYGUARD_ROUTES="$ROUTES" \
	REPLAYGUARD_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0" \
	LOAD_WEBHOOK_SECRET="$("$WORK/load" webhook-secret)" \
	"$WORK/server" >"$WORK/gateway-redis.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
wait_http "http://127.0.0.1:$APP_PORT/_count" GET 200 "$APP_PID" || die "the app did not start: $(tail -5 "$WORK/app.log")"
wait_http "http://127.0.0.1:$GW_PORT/readyz" GET 200 "$GW_PID" || die "the gateway did not get ready: $(tail -5 "$WORK/gateway-redis.log")"
echo "app           on 127.0.0.1:$APP_PORT (pid $APP_PID)"
echo "gateway redis on 127.0.0.1:$GW_PORT (pid $GW_PID): Redis db 0"
echo "routes ($ROUTES):"
sed 's/^/  /' "$ROUTES"

APPW="app:$APP_PID"
GRW="server:$GW_PID,app:$APP_PID,redis:$REDIS_PID"
PLAN=(
	"app bare $APP_PORT /orders $APPW"
	"redis passthrough $GW_PORT /plain $GRW"
	"redis wh-first $GW_PORT /hooks/orders $GRW"
	"redis wh-replay $GW_PORT /hooks/orders $GRW"
)

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
log="$WORK/gateway-redis.log"
echo "gateway log: $(wc -l <"$log") lines, $(grep -c '"level":"ERROR"' "$log" || true) at level ERROR"
echo "Redis: $(redis-cli -p "$REDIS_PORT" dbsize) keys, $(redis-cli -p "$REDIS_PORT" info memory | grep '^used_memory_human:' | tr -d '\r')"

section report
"$WORK/load" gateway-report -runs "$RUNS" -gobench "$GOBENCH_FILES" -app-executions "$APP_EXECUTIONS" | tee "$WORK/report.md"

if ((UNCLEAN > 0)); then
	die "$UNCLEAN load run(s) saw 5xx, transport errors or unexpected answers"
fi
