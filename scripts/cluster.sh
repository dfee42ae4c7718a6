#!/usr/bin/env bash
# Three nodes on one PostgreSQL behind nginx, on this machine, to try a cluster by hand
# (docs/deploy.md). `make cluster` builds the release binary and runs this; Ctrl-C stops it all.
#
#   scripts/cluster.sh [BINARY]        (default: target/release/synkronus)
#
# nginx listens on CLUSTER_PORT (default 8080) and sends requests round robin to the nodes on the
# three ports after it (node-a, node-b, node-c). The database is DB_CONNECTION when set, else a
# PostgreSQL cluster of its own in CLUSTER_PG_DIR (default /tmp/synkronus-cluster-pg, kept between
# runs, stopped at the end). The nodes share their files under CLUSTER_DIR (default
# ./data/cluster), where their logs and nginx's configuration go too. JWT_SECRET comes from the
# environment or .env, as for `make run`. Kill a node (its pid is printed) to watch the others
# carry on.
#
# Files in a bucket instead (docs/storage.md): CLUSTER_STORAGE=moto starts moto's S3-compatible
# server (`make test-deps` installs it) on CLUSTER_PORT+10 with the bucket `synkronus-cluster`;
# moto keeps objects in memory, so they go when the cluster stops. A STORAGE_URL=s3://… in the
# environment (with its AWS_* variables) points the nodes at a real bucket. Either way each node
# gets a data root of its own (CLUSTER_DIR/node-x: bundle cache, uploads in flight): the database
# and the bucket are all they share.
set -euo pipefail
# shellcheck source=nginx-conf.sh
source "$(dirname "$0")/nginx-conf.sh"

BIN=${1:-${CARGO_TARGET_DIR:-target}/release/synkronus}
PORT=${CLUSTER_PORT:-8080}
mkdir -p "${CLUSTER_DIR:-./data/cluster}"
DIR=$(cd "${CLUSTER_DIR:-./data/cluster}" && pwd)
PG_DIR=${CLUSTER_PG_DIR:-/tmp/synkronus-cluster-pg}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

[ -x "$NGINX" ] || { echo "cluster: nginx is missing (make test-deps installs it)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "cluster: no server binary at $BIN (make release)" >&2; exit 1; }
if [ -z "${JWT_SECRET:-}" ] && [ -f .env ]; then set -a; . ./.env; set +a; fi
: "${JWT_SECRET:?cluster: set JWT_SECRET (make .env generates one)}"
export JWT_SECRET

as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

pids=()
started_pg=""
stop() {
	trap - EXIT INT TERM
	for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "$started_pg" ]; then as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR" -m fast -w stop >/dev/null || true; fi
	echo "cluster: stopped"
}
trap stop EXIT
trap 'stop; exit 0' INT TERM

if [ -z "${DB_CONNECTION:-}" ]; then
	# Debian's own folder first: it holds psql and createdb beside initdb and pg_ctl.
	PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
	PG_BIN=${PG_BIN:-$(dirname "$(command -v initdb)")}
	if [ ! -f "$PG_DIR/PG_VERSION" ]; then
		mkdir -p "$PG_DIR"
		if [ "$(id -u)" = 0 ]; then chown postgres "$PG_DIR"; fi
		as_pg "$PG_BIN/initdb" -D "$PG_DIR" -U synkronus -A trust >/dev/null
	fi
	if ! as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR" status >/dev/null 2>&1; then
		as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR" -w -l "$PG_DIR/server.log" \
			-o "-c listen_addresses='' -k $PG_DIR -c max_connections=200" start >/dev/null
		started_pg=1
	fi
	if ! as_pg "$PG_BIN/psql" -h "$PG_DIR" -U synkronus -d postgres -tAc \
		"SELECT 1 FROM pg_database WHERE datname = 'synkronus'" | grep -q 1; then
		as_pg "$PG_BIN/createdb" -h "$PG_DIR" -U synkronus synkronus
	fi
	DB_CONNECTION="host=$PG_DIR user=synkronus dbname=synkronus"
fi

ready() {
	for _ in $(seq 1 300); do
		if curl -fs "http://127.0.0.1:$1${2:-/ready}" >/dev/null 2>&1; then return 0; fi
		sleep 0.2
	done
	echo "cluster: nothing answers on port $1; see $DIR/*.log" >&2
	return 1
}

if [ "${CLUSTER_STORAGE:-}" = moto ]; then
	command -v moto_server >/dev/null || { echo "cluster: moto_server is missing (make test-deps installs it)" >&2; exit 1; }
	s3_port=$((PORT + 10))
	moto_server -H 127.0.0.1 -p "$s3_port" >"$DIR/moto.log" 2>&1 &
	pids+=($!)
	ready "$s3_port" /
	curl -fs -X PUT "http://127.0.0.1:$s3_port/synkronus-cluster" >/dev/null
	export STORAGE_URL=s3://synkronus-cluster AWS_ENDPOINT_URL="http://127.0.0.1:$s3_port" AWS_ALLOW_HTTP=true \
		AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
	echo "cluster: moto on port $s3_port, pid $!, bucket synkronus-cluster (in memory)"
fi

node_ports=()
port=$PORT
for name in node-a node-b node-c; do
	port=$((port + 1))
	data_root="$DIR/files"
	if [ -n "${STORAGE_URL:-}" ]; then data_root="$DIR/$name"; fi
	env DB_CONNECTION="$DB_CONNECTION" DATA_ROOT="$data_root" NODE_ID="$name" PORT="$port" \
		BIND_ADDRESS=127.0.0.1 TRUSTED_PROXIES=127.0.0.1/32 PUBLIC_URL="http://127.0.0.1:$PORT" \
		"$BIN" serve >"$DIR/$name.log" 2>&1 &
	pids+=($!)
	ready "$port"
	echo "cluster: $name on port $port, pid $!, log $DIR/$name.log"
	node_ports+=("$port")
done

write_nginx_conf "$DIR/nginx" "$PORT" 64 "${node_ports[@]}"
"$NGINX" -c "$DIR/nginx/nginx.conf" -p "$DIR/nginx" -e "$DIR/nginx/error.log" &
pids+=($!)
ready "$PORT"
echo "cluster: nginx on http://127.0.0.1:$PORT (round robin over the three nodes); Ctrl-C stops everything"
wait -n "${pids[@]}" || true
echo "cluster: a process ended; the others keep running until Ctrl-C"
wait
