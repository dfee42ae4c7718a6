#!/usr/bin/env bash
# "Beyond one machine" in docs/benchmarks-history.md: one node against three behind nginx, and attachments on
# the S3 backend (moto), the local-file backend and moto alone, all on this machine.
#
#   load-tests/cluster-bench.sh SERVER_BIN LOAD_BIN WORK_DIR BASE_PORT [PHASE...]
#
# PHASE is any of push (push storm, single node / 3 nodes behind nginx / 1 node behind nginx,
# alternated, two rounds), sync (initial sync and bundle manifests, direct and through nginx,
# alternated), s3 (attachments: S3 backend, moto alone, local files, alternated, two rounds,
# server RSS sampled), profile (PostgreSQL wait events and group-commit sizes of a push storm,
# single node and 3 nodes); default push sync s3. Ports: BASE_PORT nginx, +1..+3 the nodes, +10 moto.
# The database is a private PostgreSQL cluster (Debian's binaries, default settings but
# max_connections=200) under WORK_DIR/pg, a fresh database per run; every node of a run shares one
# data root. Reports go to WORK_DIR/results, `uptime` before each run to WORK_DIR/results/load.txt.
# The balancer runs twice: docs/deploy.md's configuration on BASE_PORT, and the same with
# `keepalive 64;` in the upstream block (connections to the nodes reused) on BASE_PORT+4.
# Only the processes this script starts are stopped, by pid.
set -uo pipefail
# shellcheck source=../scripts/nginx-conf.sh
source "$(dirname "$0")/../scripts/nginx-conf.sh"

BIN=$1 LOAD=$2 W=$3 PORT=$4
shift 4
PHASES=${*:-push sync s3}
PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
R=$W/results
export JWT_SECRET=bench-secret-bench-secret-bench-secret-0123 LOG_LEVEL=warn
mkdir -p "$W/pg" "$W/sock" "$R"
exec {trace}>"$R/trace.log"
BASH_XTRACEFD=$trace
set -x
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "$(id -u)" = 0 ]; then chown postgres "$W/pg" "$W/sock"; fi

pids=()
pg_started=""
stop_all() { # the nodes, nginx and moto of the current run
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do
		for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$p" 2>/dev/null
	done
	pids=()
}
finish() {
	stop_all
	[ -n "$pg_started" ] && as_pg "$PG_BIN/pg_ctl" -D "$W/pg" -m fast -w stop >/dev/null
}
trap finish EXIT

if [ ! -f "$W/pg/PG_VERSION" ]; then as_pg "$PG_BIN/initdb" -D "$W/pg" -U synkronus -A trust >/dev/null; fi
as_pg "$PG_BIN/pg_ctl" -D "$W/pg" -w -l "$W/pg/server.log" \
	-o "-c listen_addresses='' -k $W/sock -c max_connections=200" start >/dev/null && pg_started=1

ready() { # port
	for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$1/ready" >/dev/null 2>&1 && return 0; sleep 0.2; done
	echo "cluster-bench: nothing answers on port $1" >&2
	return 1
}

fresh_db() { # name: a new empty database, its connection string on stdout
	as_pg "$PG_BIN/dropdb" -h "$W/sock" -U synkronus --if-exists "$1"
	as_pg "$PG_BIN/createdb" -h "$W/sock" -U synkronus "$1"
	echo "host=$W/sock user=synkronus dbname=$1"
}

node() { # name port db data_root [env...]: starts one node, its pid appended to pids
	local name=$1 port=$2 db=$3 root=$4
	shift 4
	env DB_CONNECTION="$db" DATA_ROOT="$root" NODE_ID="$name" PORT="$port" BIND_ADDRESS=127.0.0.1 \
		TRUSTED_PROXIES=127.0.0.1/32 "$@" "$BIN" serve >"$root/$name.log" 2>&1 &
	pids+=($!)
	ready "$port"
}

balancer() { # listen_port keepalive upstream_ports...: nginx, round robin, docs/deploy.md's configuration
	local listen=$1 d=$W/nginx-$1
	rm -rf "$d"
	write_nginx_conf "$d" "$@"
	"$NGINX" -c "$d/nginx.conf" -p "$d" -e "$d/error.log" &
	pids+=($!)
	ready "$listen"
}

# setup label: single (one node, direct), cluster (3 nodes behind nginx), cluster_ka (the same,
# nginx keeping connections to the nodes), nginx1 (1 node behind nginx). Starts it on a fresh
# database and data root; the URL to load goes to $url (nginx_ka: the keepalive balancer's).
setup() {
	local label=$1 db root=$W/data-$1
	db=$(fresh_db "bench_$1")
	rm -rf "$root"
	mkdir -p "$root"
	case $label in
	single) node node-a $((PORT + 1)) "$db" "$root" && url=http://127.0.0.1:$((PORT + 1)) ;;
	nginx1) node node-a $((PORT + 1)) "$db" "$root" && balancer "$PORT" 0 $((PORT + 1)) && url=http://127.0.0.1:$PORT ;;
	cluster | cluster_ka)
		node node-a $((PORT + 1)) "$db" "$root" && node node-b $((PORT + 2)) "$db" "$root" &&
			node node-c $((PORT + 3)) "$db" "$root" &&
			balancer "$PORT" 0 $((PORT + 1)) $((PORT + 2)) $((PORT + 3)) &&
			balancer $((PORT + 4)) 64 $((PORT + 1)) $((PORT + 2)) $((PORT + 3)) || return 1
		if [ "$label" = cluster_ka ]; then url=http://127.0.0.1:$((PORT + 4)); else url=http://127.0.0.1:$PORT; fi
		;;
	esac
}

cpu_ticks() { # label pid...: utime+stime clock ticks of the pids and of all PostgreSQL processes
	local label=$1 total=0 pg=0 p
	shift
	for p in "$@"; do total=$((total + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
	local pm
	pm=$(head -n 1 "$W/pg/postmaster.pid")
	for p in "$pm" $(pgrep -P "$pm"); do
		pg=$((pg + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
	done
	echo "$label $total $pg"
}

load() { # tag, then synkronus-load arguments
	local tag=$1 rc before after
	shift
	echo "$(date -u +%FT%TZ) $tag: $(uptime)" >>"$R/load.txt"
	before=$(cpu_ticks x "${pids[@]}")
	"$LOAD" --out "$R" --no-progress "$@" >"$R/$tag.txt" 2>&1
	rc=$?
	after=$(cpu_ticks x "${pids[@]}")
	# CPU seconds the run cost the servers (nodes, nginx, moto) and this PostgreSQL cluster: on a shared,
	# saturated machine the cost per record compares better than the rate.
	echo "$tag $before $after" | awk '{printf "%s servers_cpu_s %.1f postgres_cpu_s %.1f\n", $1, ($6-$3)/100, ($7-$4)/100}' >>"$R/cpu.txt"
	echo "$tag: exit $rc $(grep -E 'records_per_sec|upload_p99_ms|large_download_mb_per_sec|etag_hit_requests_per_sec|rss_mib|violations' "$R/$tag.txt" | tr -s ' ' | tr '\n' ' ')"
}

phase_push() {
	for round in 1 2; do
		for label in single cluster cluster_ka nginx1; do
			setup $label || { stop_all; continue; }
			load "push-$label-$round" --base-url "$url" push-storm --devices 64 --batch 50 --duration 20
			stop_all
		done
	done
}

phase_sync() {
	setup cluster || return 1
	load sync-seed --base-url "$url" seed --records 300000 --form-type load_seed
	sleep 5
	local via u
	declare -A via_url=([direct]=http://127.0.0.1:$((PORT + 1)) [nginx]=http://127.0.0.1:$PORT
		[nginx_ka]=http://127.0.0.1:$((PORT + 4)))
	for round in 1 2; do
		for via in direct nginx nginx_ka; do
			u=${via_url[$via]}
			load "sync-$via-$round" --base-url "$u" initial-sync --records 300000 --form-type load_seed
		done
	done
	for round in 1 2; do
		for via in direct nginx nginx_ka; do
			u=${via_url[$via]}
			load "bundle-$via-$round" --base-url "$u" bundle-switch --devices 50 --switches 5 --etag-secs 10
		done
	done
	stop_all
}

# Where the time of a push storm goes, single node against three: PostgreSQL's wait events of
# the run's sessions sampled every 0.1 s, and each node's group-commit sizes from /metrics.
phase_profile() {
	local label db ports port t
	for label in single cluster_ka; do
		setup $label || return 1
		db=bench_$label
		sample_waits "$db" >"$R/waits-$label.txt" &
		local sampler=$!
		load "profile-$label" --base-url "$url" push-storm --devices 64 --batch 50 --duration 20
		kill "$sampler"
		ports=$((PORT + 1))
		[ $label = cluster_ka ] && ports="$((PORT + 1)) $((PORT + 2)) $((PORT + 3))"
		for port in $ports; do
			t=$(curl -s "http://127.0.0.1:$port/auth/login" -d '{"username":"admin","password":"admin"}' |
				sed -E 's/.*"token":"([^"]*)".*/\1/')
			curl -s "http://127.0.0.1:$port/metrics" -H "Authorization: Bearer $t" |
				grep -E '^synkronus_changelog_group_commit_size_(sum|count)' | sed "s/^/$port /"
		done >"$R/groups-$label.txt"
		stop_all
	done
}

sample_waits() { # database: one line per active session and sample, "wait_event_type:wait_event"
	while true; do
		as_pg "$PG_BIN/psql" -h "$W/sock" -U synkronus -d "$1" -tAc "SELECT coalesce(wait_event_type, 'CPU') || ':' ||
			coalesce(wait_event, 'running') || ' ' || left(regexp_replace(query, '\s+', ' ', 'g'), 40)
			FROM pg_stat_activity WHERE datname = current_database() AND state = 'active'
			AND pid <> pg_backend_pid()"
		sleep 0.1
	done
}

moto() { # starts moto on PORT+10 with bucket `bench`
	moto_server -H 127.0.0.1 -p $((PORT + 10)) >"$W/moto.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 100); do curl -s "http://127.0.0.1:$((PORT + 10))" >/dev/null && break; sleep 0.1; done
	curl -fs -X PUT "http://127.0.0.1:$((PORT + 10))/bench" >/dev/null
}

phase_s3() {
	local s3=(STORAGE_URL=s3://bench AWS_ENDPOINT_URL=http://127.0.0.1:$((PORT + 10)) AWS_ALLOW_HTTP=true
		AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1)
	local att=(attachments --uploads 100 --upload-bytes 1048576 --large-bytes 10485760 --downloads 100
		--download-concurrency 8)
	for round in 1 2; do
		for backend in s3 moto local; do
			local db root=$W/data-att
			db=$(fresh_db bench_att)
			rm -rf "$root"
			mkdir -p "$root"
			case $backend in
			s3)
				moto
				node node-a $((PORT + 1)) "$db" "$root" "${s3[@]}" || return 1
				load "att-s3-$round" --base-url http://127.0.0.1:$((PORT + 1)) "${att[@]}" --rss-pid "${pids[-1]}"
				;;
			moto)
				moto
				load "att-moto-$round" --base-url http://127.0.0.1:$((PORT + 10))/bench "${att[@]}" --direct \
					--rss-pid "${pids[-1]}"
				;;
			local)
				node node-a $((PORT + 1)) "$db" "$root" || return 1
				load "att-local-$round" --base-url http://127.0.0.1:$((PORT + 1)) "${att[@]}" --rss-pid "${pids[-1]}"
				;;
			esac
			stop_all
		done
	done
	# Files near the largest the server takes (64 MiB), to show that memory does not follow file size.
	for backend in s3 local; do
		local db root=$W/data-att
		db=$(fresh_db bench_att)
		rm -rf "$root"
		mkdir -p "$root"
		if [ $backend = s3 ]; then
			moto
			node node-a $((PORT + 1)) "$db" "$root" "${s3[@]}" || return 1
		else
			node node-a $((PORT + 1)) "$db" "$root" || return 1
		fi
		load "att-64mib-$backend" --base-url http://127.0.0.1:$((PORT + 1)) attachments --uploads 8 \
			--upload-bytes 62914560 --large-bytes 62914560 --downloads 32 --download-concurrency 8 --rss-pid "${pids[-1]}"
		stop_all
	done
}

for p in $PHASES; do "phase_$p"; done
echo "cluster-bench: finished, reports in $R"
