# lib.sh: the setup run.sh and gateway.sh share. Source it from the
# repository root after setting SCRIPT (the script's path from there, such
# as test/load/run.sh), NICE, KEEP and TOOLS (the commands it needs):
#
#	load_session "$@"   # re-runs the script in a session of its own at NICE
#	load_setup          # tools, niceness, WORK, PIDS, cleanup on exit
#
# Then section, die, N, free_port, wait_http and load_redis (with
# internal/testenv/redis.sh's start_redis) are defined, WORK is a
# fresh temp dir (kept with KEEP=1) and every pid added to PIDS is stopped
# on exit, pass or fail: those also in PG_PIDS (PostgreSQL servers) get
# SIGINT first, PostgreSQL's fast shutdown. Directories added to TMPDIRS
# (such as a PostgreSQL cluster's, which cannot live in WORK when the
# server runs as another user) are removed with WORK.

section() { printf '\n== %s\n' "$*"; }
die() { printf '%s: FAIL: %s\n' "${SCRIPT##*/}" "$*" >&2; exit 1; }

# load_session re-runs SCRIPT in a session of its own (setsid) whose
# autogroup niceness is NICE, and exits with its status; inside that
# session it sets the niceness and returns. NICE=0 turns it off.
load_session() {
	if [[ "$NICE" != 0 && -z "${REPLAYGUARD_TEST_LOAD_SESSION:-}" ]] && command -v setsid >/dev/null 2>&1; then
		REPLAYGUARD_TEST_LOAD_SESSION=1 setsid -w bash "$SCRIPT" "$@" &
		local inner=$! rc=0
		trap 'kill -TERM "$inner" 2>/dev/null' INT TERM
		wait "$inner" || rc=$?
		# A signal interrupts the first wait: wait again for the cleanup.
		while kill -0 "$inner" 2>/dev/null; do wait "$inner" || rc=$?; done
		exit "$rc"
	fi
	if [[ -n "${REPLAYGUARD_TEST_LOAD_SESSION:-}" ]]; then
		if ! echo "$NICE" 2>/dev/null >/proc/self/autogroup; then
			echo "${SCRIPT##*/}: cannot set this session's autogroup niceness to $NICE" >&2
		fi
	fi
}

# N runs a command at the run's niceness. Background processes are started
# as "nice -n "$NICE" cmd &" instead, so that $! is the process itself.
N() { nice -n "$NICE" "$@"; }

PIDS=()
PG_PIDS=()
TMPDIRS=()
cleanup() {
	local rc=$? pid i
	set +e
	for pid in ${PG_PIDS[@]+"${PG_PIDS[@]}"}; do
		kill -INT "$pid" 2>/dev/null
	done
	for pid in ${PIDS[@]+"${PIDS[@]}"}; do
		kill "$pid" 2>/dev/null
	done
	for pid in ${PIDS[@]+"${PIDS[@]}"}; do
		for ((i = 0; i < 100; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	if [[ -n "${WORK:-}" ]]; then
		if [[ "$KEEP" == 1 ]]; then
			echo "kept $WORK ${TMPDIRS[*]+${TMPDIRS[*]}}"
		else
			rm -rf "$WORK" ${TMPDIRS[@]+"${TMPDIRS[@]}"}
		fi
	fi
	exit "$rc"
}

# load_setup checks TOOLS, falls back to niceness 0 where NICE cannot be
# had, makes WORK and installs the cleanup.
load_setup() {
	local tool
	if ! command -v go >/dev/null 2>&1; then
		export PATH="/usr/local/go/bin:$PATH"
	fi
	for tool in $TOOLS; do
		command -v "$tool" >/dev/null 2>&1 || die "$tool not found (redis tools: apt-get install redis-server redis-tools)"
	done
	if [[ "$(nice -n "$NICE" nice 2>/dev/null)" != "$(($(nice) + NICE))" ]]; then
		echo "${SCRIPT##*/}: cannot run at niceness $NICE here; running at the default" >&2
		NICE=0
	fi
	local name=${SCRIPT##*/}
	WORK=$(mktemp -d "/tmp/replayguard-${name%.sh}-XXXXXX")
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
}

# free_port sets FREE_PORT to a loopback port that is free now, whose
# Redis Cluster bus port (port+10000) is free too, and that it has not
# handed out before.
USED_PORTS=" "
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((20000 + RANDOM % 25000))
		[[ "$USED_PORTS" == *" $p "* ]] && continue
		if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || (exec 3<>"/dev/tcp/127.0.0.1/$((p + 10000))") 2>/dev/null; then
			continue
		fi
		USED_PORTS+="$p "
		FREE_PORT=$p
		return 0
	done
	return 1
}

# wait_http URL METHOD WANT PID: wait up to 10s for URL to answer WANT.
wait_http() {
	local url=$1 method=$2 want=$3 pid=$4 got
	for _ in $(seq 1 100); do
		kill -0 "$pid" 2>/dev/null || return 1
		got=$(curl -s -o /dev/null -w '%{http_code}' -X "$method" "$url" || true)
		[[ "$got" == "$want" ]] && return 0
		sleep 0.1
	done
	return 1
}

# profile_run PID FILE TITLE ARGS...: one 5s run of the load program with
# ARGS, and perf recording PID for 4.5s from the start of its timed phase
# (which the load program signals with -ready-file); FILE.txt gets perf's
# samples for load perfsplit, and the top symbols are printed under TITLE.
profile_run() {
	local pid=$1 file=$2 title=$3 load_pid perf_pid
	shift 3
	rm -f "$WORK/ready"
	nice -n "$NICE" "$WORK/load" "$@" -duration 5s -ready-file "$WORK/ready" >/dev/null &
	load_pid=$!
	PIDS+=("$load_pid")
	while [[ ! -e "$WORK/ready" ]] && kill -0 "$load_pid" 2>/dev/null; do sleep 0.05; done
	perf record -F 999 -g -p "$pid" -o "$file.data" -- sleep 4.5 >"$file.log" 2>&1 &
	perf_pid=$!
	PIDS+=("$perf_pid")
	wait "$load_pid" || true
	wait "$perf_pid" || true
	perf script -i "$file.data" >"$file.txt" 2>/dev/null
	echo "--- $title"
	perf report -i "$file.data" --children --sort symbol --stdio -g none 2>/dev/null |
		grep '%' | grep -v '\[k\]' | sed -E 's/ +- +- *$//; s/ +$//' | head -40 || true
}

# shellcheck source=internal/testenv/redis.sh
. internal/testenv/redis.sh

# load_redis starts the run's private redis-server (no persistence, its
# dir under WORK, at the run's niceness) with start_redis, waits until it
# answers PING, and sets REDIS_PORT and REDIS_PID.
load_redis() {
	REDIS_TMP_PREFIX="$WORK/redis"
	REDIS_NICE=$NICE
	start_redis standalone
	REDIS_PORT=$STARTED_PORT
	REDIS_PID=$STARTED_PID
	echo "redis-server on 127.0.0.1:$REDIS_PORT (pid $REDIS_PID): --save '' --appendonly no"
}
