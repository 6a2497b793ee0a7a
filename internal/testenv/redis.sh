# redis.sh: private Redis servers and a Redis Cluster for a bash script,
# as redis.go starts them for a Go test. Sourced by .ci/run and
# test/load/run.sh; it defines functions only:
#
#	wait_ping PORT PID LOG   waits up to 10s for redis on PORT to answer PING
#	start_redis KIND [ARGS...]
#	                         starts a redis-server (KIND cluster: a cluster node)
#	redis_cluster_create ADDR...
#	                         joins cluster nodes into a cluster with no replicas
#
# start_redis needs the caller's die (prints and exits), free_port (sets
# FREE_PORT to a loopback port that is free, whose cluster bus port,
# port+10000, is free too) and the arrays PIDS and TMPDIRS, whose
# processes and directories the caller's exit trap stops and removes.
# REDIS_SERVER is the redis-server to run (default: the one on PATH),
# REDIS_TMP_PREFIX the prefix of each server's temp dir (default
# /tmp/replayguard-redis; KIND and a random tail follow) and REDIS_NICE,
# when set, the niceness it runs at.

# wait_ping PORT PID LOG: wait up to 10s for redis on PORT to answer PING.
wait_ping() {
	local port=$1 pid=$2 log=$3
	for _ in $(seq 1 100); do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "redis-server on port $port exited early; log:" >&2
			tail -n 20 "$log" >&2 || true
			return 1
		fi
		[[ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" == PONG ]] && return 0
		sleep 0.1
	done
	echo "redis-server on port $port did not answer PING within 10s; log:" >&2
	tail -n 20 "$log" >&2 || true
	return 1
}

# start_redis KIND EXTRA-ARGS...: start a redis-server on a fresh free port in
# its own temp dir, without persistence; KIND cluster makes it a cluster
# node. Retries on another port if it loses a race for the port. Sets
# STARTED_PORT and STARTED_PID (also added to PIDS).
start_redis() {
	local kind=$1 port dir pid attempt
	shift
	for attempt in 1 2 3; do
		free_port || die "no free loopback port found"
		port=$FREE_PORT
		dir=$(mktemp -d "${REDIS_TMP_PREFIX:-/tmp/replayguard-redis}-$kind-XXXXXX")
		TMPDIRS+=("$dir")
		local args=(--port "$port" --bind 127.0.0.1 --daemonize no
			--save '' --appendonly no --dir "$dir")
		if [[ "$kind" == cluster ]]; then
			args+=(--cluster-enabled yes --cluster-config-file "nodes-$port.conf"
				--cluster-node-timeout 5000)
		fi
		nice -n "${REDIS_NICE:-0}" "${REDIS_SERVER:-redis-server}" "${args[@]}" "$@" >"$dir/redis.log" 2>&1 &
		pid=$!
		PIDS+=("$pid")
		if wait_ping "$port" "$pid" "$dir/redis.log"; then
			echo "started $kind redis on 127.0.0.1:$port (pid $pid, dir $dir)"
			STARTED_PORT=$port
			STARTED_PID=$pid
			return 0
		fi
		kill "$pid" 2>/dev/null || true
		echo "retrying $kind redis on another port (attempt $attempt failed)" >&2
	done
	die "could not start $kind redis"
}

# redis_cluster_create ADDR...: make the cluster nodes at ADDR (host:port,
# started with start_redis cluster) one cluster with no replicas, and wait
# up to 30s for every node to report cluster_state:ok.
redis_cluster_create() {
	local a ok
	redis-cli --cluster create "$@" --cluster-replicas 0 --cluster-yes
	for _ in $(seq 1 300); do
		ok=1
		for a in "$@"; do
			if ! redis-cli -h "${a%:*}" -p "${a##*:}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; then
				ok=
				break
			fi
		done
		[[ -n "$ok" ]] && return 0
		sleep 0.1
	done
	for a in "$@"; do
		echo "--- cluster info $a" >&2
		redis-cli -h "${a%:*}" -p "${a##*:}" cluster info >&2 || true
	done
	die "redis cluster did not reach cluster_state:ok within 30s"
}
