#!/usr/bin/env bash
# The README's dashboard screenshot (issue 14), rendered from a real
# Prometheus scrape of a short load run, on a machine without Grafana.
# Run from anywhere as: bash test/load/dashboard.sh
# Not part of CI.
#
# It builds cmd/server, test/load, test/load/app and test/load/dashboard,
# then starts, each on a free loopback port:
#   - a private redis-server (no persistence);
#   - a Replayguard on it (REPLAYGUARD_REDIS_URL, the fixed test signing
#     key of run.sh, REPLAYGUARD_CLIENT_KEYS from load clientkeys), which
#     is also a gateway in front of test/load/app
#     (REPLAYGUARD_ROUTES=test/load/gateway-routes.yaml); its metrics are
#     at GET /metrics, always on;
#   - a private Prometheus scraping that /metrics every 1s, with a
#     generated config and its storage in the work directory;
# then drives DURATION seconds of mixed load, in five equal slices:
#   1. from the start: pairs (issue, then redeem) at 4 workers, and a
#      curl loop that every 0.2s redeems a token twice (200, then 409
#      token_used) and sends an Idempotency-Key again with another body
#      (201, then 422 idempotency_key_reused), both to the end;
#   2. from the second slice to the end of the fourth: forged tokens
#      (401 token_invalid) at 8 workers;
#   3. from the third to the end of the fourth: signed requests (POST
#      /v1/signatures/verify, hmac) at 8 workers;
#   4. from the fourth to the end: gateway traffic on POST /orders at 4
#      workers each, first executions (a new Idempotency-Key each) and
#      replays of completed keys;
#   5. at the start of the fifth: the Redis paused (SIGSTOP) for OUTAGE
#      seconds, so that store calls time out (503 store_unavailable),
#      then recovery;
# and renders DASHBOARD with test/load/dashboard (each panel's targets
# queried from the private Prometheus over the run) as an HTML page,
# which headless Chromium turns into OUT.
# Every process it starts is stopped by pid at exit, pass or fail.
# Traffic goes to 127.0.0.1 only. Load runs that see 5xx (the outage's,
# by design) do not fail the script; queries that fail do, after the
# screenshot is written (they show in their panels).
#
# It needs redis-server, curl, go, prometheus and chromium. Where
# prometheus or chromium is missing and apt-get is at hand as root, it
# installs them (apt-get install prometheus chromium) when run; note that
# Debian's prometheus package also enables a system-wide Prometheus
# service on :9090 where systemd runs, which this script does not use.
#
# Environment:
#   DURATION=50    seconds of load, 10 to 60
#   OUTAGE=3       seconds the Redis is paused in the last slice; 0: none
#   DASHBOARD=docs/grafana/replayguard.json  the Grafana dashboard JSON
#   OUT=docs/dashboard.png  the screenshot to write
#   WIDTH=1600     page and window width in pixels (the height is the
#                  page's)
#   KEEP=1         keep the work directory (logs, Prometheus's data, the
#                  HTML page)
#   NICE=0         niceness of the run (as run.sh: a session of its own
#                  at that autogroup niceness when not 0)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec </dev/null

NICE=${NICE:-0}
SCRIPT=test/load/dashboard.sh
TOOLS="go redis-server curl"
# shellcheck source=test/load/lib.sh
. test/load/lib.sh
load_session "$@"

DURATION=${DURATION:-50}
OUTAGE=${OUTAGE:-3}
DASHBOARD=${DASHBOARD:-docs/grafana/replayguard.json}
OUT=${OUT:-docs/dashboard.png}
WIDTH=${WIDTH:-1600}
KEEP=${KEEP:-0}

[[ "$DURATION" =~ ^[0-9]+$ ]] && ((DURATION >= 10 && DURATION <= 60)) || die "DURATION=$DURATION: want whole seconds from 10 to 60"
[[ "$OUTAGE" =~ ^[0-9]+$ ]] && ((OUTAGE * 5 < DURATION)) || die "OUTAGE=$OUTAGE: want whole seconds, under a fifth of DURATION"
[[ -f "$DASHBOARD" ]] || die "no dashboard at $DASHBOARD (DASHBOARD=path)"

# The tools only this script needs, installed when run.
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
[[ -n "$CHROMIUM" ]] || need+=(chromium)
if ((${#need[@]} > 0)); then
	if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
		echo "installing ${need[*]} (apt-get)"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
		CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
	else
		die "${need[*]} not found: apt-get install ${need[*]}"
	fi
fi

load_setup
# A paused Redis must not outlive the script: resume it before the
# cleanup stops it.
trap 'rc=$?; [[ -n "${REDIS_PID:-}" ]] && kill -CONT "$REDIS_PID" 2>/dev/null; (exit "$rc"); cleanup' EXIT

section build
go build -o "$WORK/server" ./cmd/server
go build -o "$WORK/load" ./test/load
go build -o "$WORK/app" ./test/load/app
go build -o "$WORK/dashboard" ./test/load/dashboard
(umask 077 && "$WORK/load" clientkeys >"$WORK/client-keys.json")
echo "prometheus: $(prometheus --version 2>&1 | head -1)"
echo "chromium: $("$CHROMIUM" --version 2>/dev/null || echo unknown)"

section servers
load_redis

free_port || die "no free port"
APP_PORT=$FREE_PORT
nice -n "$NICE" "$WORK/app" -addr "127.0.0.1:$APP_PORT" >"$WORK/app.log" 2>&1 &
APP_PID=$!
PIDS+=("$APP_PID")

free_port || die "no free port"
RG_PORT=$FREE_PORT
RG=http://127.0.0.1:$RG_PORT
# The fixed test key of run.sh; never use it anywhere else.
SIGNING_KEYS="load:$(printf 'replayguard-load-test-signing-key' | base64 -w0)"
nice -n "$NICE" env -i PATH="$PATH" HOME="${HOME:-/root}" \
	REPLAYGUARD_ADDR="127.0.0.1:$RG_PORT" \
	REPLAYGUARD_ISSUE_RATE=0 \
	REPLAYGUARD_REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0" \
	REPLAYGUARD_SIGNING_KEYS="$SIGNING_KEYS" \
	REPLAYGUARD_MACHINE_ID=1 \
	REPLAYGUARD_CLIENT_KEYS="$WORK/client-keys.json" \
	REPLAYGUARD_UPSTREAM="http://127.0.0.1:$APP_PORT" \
	REPLAYGUARD_ROUTES="$PWD/test/load/gateway-routes.yaml" \
	REPLAYGUARD_LOG_LEVEL=warn \
	"$WORK/server" >"$WORK/server.log" 2>&1 &
RG_PID=$!
PIDS+=("$RG_PID")
wait_http "$RG/readyz" GET 200 "$RG_PID" || die "replayguard did not get ready: $(tail -5 "$WORK/server.log")"
wait_http "http://127.0.0.1:$APP_PORT/_count" GET 200 "$APP_PID" || die "the app did not start: $(tail -5 "$WORK/app.log")"
echo "redis       on 127.0.0.1:$REDIS_PORT (pid $REDIS_PID)"
echo "app         on 127.0.0.1:$APP_PORT (pid $APP_PID)"
echo "replayguard on $RG (pid $RG_PID): Redis db 0, gateway to the app, metrics at /metrics"

free_port || die "no free port"
PROM_PORT=$FREE_PORT
PROM=http://127.0.0.1:$PROM_PORT
cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: replayguard
    static_configs:
      - targets: ["127.0.0.1:$RG_PORT"]
EOF
nice -n "$NICE" prometheus --config.file="$WORK/prometheus.yml" \
	--storage.tsdb.path="$WORK/prometheus" \
	--web.listen-address="127.0.0.1:$PROM_PORT" \
	--log.level=warn >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
PIDS+=("$PROM_PID")
wait_http "$PROM/-/ready" GET 200 "$PROM_PID" || die "prometheus did not get ready: $(tail -5 "$WORK/prometheus.log")"
echo "prometheus  on $PROM (pid $PROM_PID): scrapes $RG/metrics every 1s, data in $WORK/prometheus"

section load
# Two scrapes before the load, so that the first rates start at zero.
sleep 3
START=$(date +%s)
SLICE=$((DURATION / 5))
LOADS=()
# bg NAME ARGS...: one load run in the background, its output in
# WORK/load-NAME.log.
bg() {
	local name=$1
	shift
	echo "\$ load -url $RG $* ($name)"
	nice -n "$NICE" "$WORK/load" -url "$RG" -label "$name" "$@" >"$WORK/load-$name.log" 2>&1 &
	LOADS+=($!)
	PIDS+=($!)
}
# conflicts: every 0.2s, a token redeemed twice (200, then 409
# token_used) and an Idempotency-Key sent again with another body (201,
# then 422 idempotency_key_reused), until DURATION is over.
conflicts() {
	local end=$(($(date +%s) + DURATION)) tok n=0
	while (($(date +%s) < end)); do
		n=$((n + 1))
		tok=$(curl -s -X POST "$RG/v1/tokens" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
		if [[ -n "$tok" ]]; then
			curl -s -o /dev/null -X POST -H "Idempotency-Token: $tok" "$RG/v1/tokens/redeem"
			curl -s -o /dev/null -X POST -H "Idempotency-Token: $tok" "$RG/v1/tokens/redeem"
		fi
		curl -s -o /dev/null -X POST -H "Idempotency-Key: dash-$$-$n" -H 'Content-Type: application/json' -d '{"n":1}' "$RG/orders"
		curl -s -o /dev/null -X POST -H "Idempotency-Key: dash-$$-$n" -H 'Content-Type: application/json' -d '{"n":2}' "$RG/orders"
		sleep 0.2
	done
}
conflicts >"$WORK/conflicts.log" 2>&1 &
LOADS+=($!)
PIDS+=($!)
bg pairs -mode pairs -workers 4 -duration "${DURATION}s"
sleep "$SLICE"
bg forged -mode forged -workers 8 -duration "$((SLICE * 3))s"
sleep "$SLICE"
bg verify -mode verify -alg hmac -workers 8 -pool 40000 -duration "$((SLICE * 2))s"
sleep "$SLICE"
bg first -mode first -path /orders -workers 4 -duration "$((SLICE * 2))s"
bg replay -mode replay -path /orders -workers 4 -duration "$((SLICE * 2))s"
sleep "$SLICE"
if ((OUTAGE > 0)); then
	echo "pausing redis (pid $REDIS_PID) for ${OUTAGE}s"
	kill -STOP "$REDIS_PID"
	sleep "$OUTAGE"
	kill -CONT "$REDIS_PID"
fi
for pid in "${LOADS[@]}"; do
	wait "$pid" || true
done
END=$(date +%s)
# Two more scrapes after the load.
sleep 3
END=$((END + 2))
for f in "$WORK"/load-*.log; do
	name=${f##*/load-}
	echo "-- ${name%.log}:"
	grep -E '^  (requests|statuses) ' "$f" || tail -2 "$f"
done

section render
echo "\$ dashboard -dashboard $DASHBOARD -start $START -end $END"
QUERY_RC=0
SIZE=$("$WORK/dashboard" -dashboard "$DASHBOARD" -prometheus "$PROM" -out "$WORK/dashboard.html" \
	-start "$((START - 5))" -end "$END" -step 1s -rate-interval 4s -width "$WIDTH") || QUERY_RC=$?
((QUERY_RC <= 1)) || die "dashboard failed"
read -r W H <<<"$SIZE"
mkdir -p "$(dirname "$OUT")"
OUT_ABS=$(realpath -m "$OUT")
mkdir -p "$WORK/chromium"
# Chromium is bounded by timeout; its user data directory is the run's.
timeout 90 nice -n "$NICE" "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic \
	--no-first-run --disable-background-networking --disable-component-update --disable-sync \
	--hide-scrollbars --user-data-dir="$WORK/chromium" --screenshot="$OUT_ABS" \
	--window-size="$W,$H" "file://$WORK/dashboard.html" >"$WORK/chromium.log" 2>&1 ||
	die "chromium failed: $(tail -5 "$WORK/chromium.log")"
[[ -s "$OUT_ABS" ]] || die "chromium wrote no $OUT"
echo "wrote $OUT (${W}x$H) from $DASHBOARD"
((QUERY_RC == 0)) || die "some of the dashboard's queries failed (see above and the panels)"
