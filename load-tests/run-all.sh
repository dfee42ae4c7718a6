#!/usr/bin/env bash
# Runs every scenario at the sizes BENCHMARKS.md reports, one after the other, against a server
# that is already running (for example `make run`). Reports land in $OUT (JSON + markdown).
#
#   load-tests/run-all.sh [BASE_URL] [DB_CONNECTION]
#
# BASE_URL defaults to http://127.0.0.1:8080. DB_CONNECTION is the libpq string `db-ceiling`
# inserts through; it defaults to the embedded cluster of `make run` (./data/postgres).
set -euo pipefail

BASE_URL=${1:-http://127.0.0.1:8080}
DB=${2:-"host=$(pwd)/data/postgres user=synkronus dbname=synkronus"}
OUT=${OUT:-load-results}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BIN="$TARGET_DIR/release/synkronus-load"

cargo build --release -p synkronus-load
L=("$BIN" --base-url "$BASE_URL" --out "$OUT" --password "${ADMIN_PASSWORD:-admin}")

"${L[@]}" push-storm --devices 500 --batch 50 --duration 30
"${L[@]}" db-ceiling --db "$DB" --records 200000 --batch 50 --concurrency 16
"${L[@]}" fleet --devices 200 --duration 60 --think-ms 100
"${L[@]}" initial-sync --seed --records 1000000
"${L[@]}" bundle-switch --devices 200 --asset-bytes 3000000 --switches 10
"${L[@]}" attachments --uploads 100 --upload-bytes 1048576 --large-bytes 10485760
"${L[@]}" export-under-load --seed-records 1000000 --devices 50 --batch 50
