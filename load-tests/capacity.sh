#!/usr/bin/env bash
# Capacity in devices: starts a server on a fresh data root the way `make run` does (embedded
# PostgreSQL, release binary), runs `synkronus-load capacity` against it with the server's and
# the postmaster's process ids (for CPU and memory per step), then stops the server.
#
#   load-tests/capacity.sh SERVER_BIN LOAD_BIN DATA_ROOT PORT [capacity flags...]
#
# Example (the BENCHMARKS.md run):
#   load-tests/capacity.sh /var/tmp/base-bin/synkronus target/release/synkronus-load \
#       /var/tmp/capacity-bench/data 18240 --start-devices 5000 --step-devices 5000
set -euo pipefail
SERVER=$1 LOAD=$2 ROOT=$3 PORT=$4
shift 4
OUT=${OUT:-load-results}

# Each device is a task, not a socket, but the pool opens a connection per request in flight:
# when the server slows down, that can be thousands. Raise the soft limit as far as allowed.
ulimit -n "$(ulimit -Hn)"

rm -rf "$ROOT"
mkdir -p "$ROOT"
DATA_ROOT=$ROOT PORT=$PORT LOG_LEVEL=${LOG_LEVEL:-warn} \
    JWT_SECRET=capacity-bench-secret-capacity-bench-0123456789 \
    "$SERVER" serve > "$ROOT.server.log" 2>&1 &
SERVER_PID=$!
trap 'kill $SERVER_PID 2>/dev/null; wait $SERVER_PID 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    sleep 0.5
done
PG_PID=$(head -1 "$ROOT/postgres/postmaster.pid")
echo "server pid $SERVER_PID, postmaster pid $PG_PID; uptime: $(uptime)"
"$LOAD" --base-url "http://127.0.0.1:$PORT" --out "$OUT" --no-progress capacity \
    --server-pid "$SERVER_PID" --pg-pid "$PG_PID" "$@"
