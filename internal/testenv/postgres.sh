# postgres.sh: a private PostgreSQL cluster for a bash script, as
# StartPostgres (postgres.go) makes one for a Go test. Sourced by .ci/run
# and test/load/run.sh; it defines functions only:
#
#	pg_bin                 prints the directory of initdb, pg_ctl and postgres
#	pg_start BIN DIR [-c name=value ...]
#	                       makes a cluster in DIR and runs postgres on it
#
# pg_start needs the caller's die (prints and exits), free_port (sets
# FREE_PORT to a loopback port that is free) and the arrays PIDS and
# PG_PIDS, whose processes the caller's exit trap stops: PG_PIDS with
# SIGINT first (PostgreSQL's fast shutdown; SIGTERM waits for clients).
# PG_NICE, when set, is the niceness postgres runs at.

# pg_bin prints PostgreSQL's server programs' directory: that of an initdb
# on PATH, with its symlinks resolved (/usr/local/bin/initdb ->
# /usr/lib/postgresql/15/bin/initdb gives the real bin dir), else the
# newest Debian one (/usr/lib/postgresql/<major>/bin, off PATH). It fails
# when there is none.
is_pg_bin() { [[ -x "$1/initdb" && -x "$1/pg_ctl" && -x "$1/postgres" ]]; }
pg_bin() {
	local p d dirs
	if p=$(command -v initdb 2>/dev/null); then
		for d in "$(dirname "$(readlink -f "$p")")" "$(dirname "$p")"; do
			is_pg_bin "$d" && { echo "$d"; return 0; }
		done
	fi
	dirs=(/usr/lib/postgresql/*/bin)
	while read -r d; do
		is_pg_bin "$d" && { echo "$d"; return 0; }
	done < <(printf '%s\n' "${dirs[@]}" | sort -V -r)
	return 1
}

# pg_start BIN DIR [ARGS...] makes a cluster with BIN's initdb in DIR/data
# (superuser postgres, trust authentication, UTF8, C locale) and runs
# BIN's postgres on it in the background, on 127.0.0.1 on a free port,
# its socket in DIR, with ARGS (such as -c fsync=off) after its own; the
# log is DIR/postgres.log. DIR must exist and be empty; it becomes mode
# 0700. PostgreSQL refuses to run as root, so as root initdb and postgres
# run as the postgres user (Debian's package makes it), else as a system
# user replayguard-ci made here; setpriv execs, so the pid is postgres's
# own. It tries three ports and returns once the server accepts
# connections, having set PG_PORT, PG_PID (also added to PIDS and
# PG_PIDS), PG_ISREADY (the pg_isready it used) and PG_USER (who runs it;
# empty when not root).
pg_start() {
	local bin=$1 dir=$2 attempt port pid as=()
	shift 2
	PG_ISREADY="$bin/pg_isready"
	[[ -x "$PG_ISREADY" ]] || PG_ISREADY=$(command -v pg_isready) || die "pg_isready not found (looked in $bin and on PATH)"
	PG_USER=
	if ((EUID == 0)); then
		PG_USER=postgres
		if ! id -u "$PG_USER" >/dev/null 2>&1; then
			PG_USER=replayguard-ci
			if ! id -u "$PG_USER" >/dev/null 2>&1; then
				echo "creating system user $PG_USER to run PostgreSQL as"
				useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin "$PG_USER"
			fi
		fi
		if command -v setpriv >/dev/null 2>&1; then
			as=(setpriv --reuid="$PG_USER" --regid="$(id -g "$PG_USER")" --init-groups --)
		else
			as=(runuser -u "$PG_USER" --)
		fi
		echo "running PostgreSQL as $PG_USER"
	fi
	chmod 700 "$dir"
	if ((EUID == 0)); then
		chown "$PG_USER:$(id -g "$PG_USER")" "$dir"
	fi
	if ! (cd "$dir" && LC_ALL=C exec "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres \
		--auth=trust --encoding=UTF8 --locale=C --no-sync) >"$dir/initdb.log" 2>&1; then
		tail -n 20 "$dir/initdb.log" >&2
		die "initdb failed"
	fi
	PG_PORT=
	for attempt in 1 2 3; do
		free_port || die "no free loopback port found"
		port=$FREE_PORT
		(cd "$dir" && LC_ALL=C exec nice -n "${PG_NICE:-0}" "${as[@]}" "$bin/postgres" -D "$dir/data" -p "$port" -k "$dir" \
			-c listen_addresses=127.0.0.1 "$@") \
			>>"$dir/postgres.log" 2>&1 &
		pid=$!
		PIDS+=("$pid")
		PG_PIDS+=("$pid")
		for _ in $(seq 1 300); do
			kill -0 "$pid" 2>/dev/null || break
			if pg_ready "$dir" "$port"; then
				PG_PORT=$port
				PG_PID=$pid
				return 0
			fi
			sleep 0.1
		done
		kill -INT "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
		echo "postgres on port $port did not start (attempt $attempt); log:" >&2
		tail -n 20 "$dir/postgres.log" >&2 || true
		grep -q 'Address already in use' "$dir/postgres.log" || die "could not start postgres"
	done
	die "could not start postgres"
}

# pg_ready DIR PORT: the postgres of the cluster in DIR accepts connections
# on PORT. postmaster.pid in its data dir names the port and says ready,
# so an answer from another server that holds the port does not count.
pg_ready() {
	"$PG_ISREADY" -q -h 127.0.0.1 -p "$2" -U postgres -d postgres -t 1 || return 1
	[[ "$(sed -n '4p;8p' "$1/data/postmaster.pid" 2>/dev/null | tr -d ' ' | paste -sd:)" == "$2:ready" ]]
}
