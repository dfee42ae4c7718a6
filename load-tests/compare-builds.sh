#!/usr/bin/env bash
# Two server builds in one interleaved run: each round measures build A, then build B, on fresh
# data roots, so that whatever else the machine does lands on both alike. Per build and round: a
# push storm of 64 devices and one of 500 (each on a fresh database, after a warm-up storm), the
# initial sync of RECORDS records (server-side rate, warm: the second of two pulls), and a
# Parquet export of them.
#
#   load-tests/compare-builds.sh A_BIN B_BIN LOAD_BIN WORK_DIR PORT [ROUNDS]
#
# Prints one tab-separated line per build and round, and writes them to WORK_DIR/results.tsv:
#   round build push64_records_s push64_p99_ms push500_records_s push500_p99_ms sync_records_s export_s
set -euo pipefail
A=$1 B=$2 LOAD=$3 WORK=$4 PORT=$5 ROUNDS=${6:-3}
RECORDS=${RECORDS:-300000}
STORM_SECS=${STORM_SECS:-20}
ulimit -n "$(ulimit -Hn)"
mkdir -p "$WORK/out"
URL=http://127.0.0.1:$PORT
SERVER_PID=

start_server() { # BIN ROOT
	rm -rf "$2"
	mkdir -p "$2"
	DATA_ROOT=$2 PORT=$PORT LOG_LEVEL=warn JWT_SECRET=compare-builds-secret-0123456789abcdef0123 \
		"$1" serve >"$2.log" 2>&1 &
	SERVER_PID=$!
	for _ in $(seq 1 240); do
		curl -sf "$URL/ready" >/dev/null && return 0
		sleep 0.5
	done
	echo "compare-builds: the server did not become ready ($2.log)" >&2
	return 1
}
stop_server() {
	kill "$SERVER_PID" 2>/dev/null || true
	wait "$SERVER_PID" 2>/dev/null || true
	SERVER_PID=
}
trap stop_server EXIT

load() { "$LOAD" --base-url "$URL" --out "$WORK/out" --no-progress "$@" >/dev/null; }
# A figure of the newest report of a scenario.
figure() {
	python3 - "$WORK/out" "$1" "$2" <<'EOF'
import glob, json, os, sys
out, scenario, key = sys.argv[1:]
newest = max(glob.glob(os.path.join(out, scenario + "-*.json")), key=os.path.getmtime)
value = json.load(open(newest))["results"].get(key)
print("" if value is None else f"{value:.0f}")
EOF
}

storm() { # BUILD_BIN ROOT DEVICES
	start_server "$1" "$2"
	load push-storm --devices "$3" --batch 50 --duration 10 --no-verify
	load push-storm --devices "$3" --batch 50 --duration "$STORM_SECS"
	stop_server
	echo "$(figure push-storm records_per_sec)	$(figure push-storm push_p99_ms)"
}

sync_and_export() { # BUILD_BIN ROOT
	start_server "$1" "$2"
	load initial-sync --seed --records "$RECORDS" --raw
	load initial-sync --records "$RECORDS" --raw
	local rate token start
	rate=$(figure initial-sync records_per_sec)
	token=$(curl -sf -H 'content-type: application/json' -d '{"username":"admin","password":"admin"}' \
		"$URL/auth/login" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
	start=$(date +%s.%N)
	curl -sf -o "$WORK/export.zip" -H "authorization: Bearer $token" "$URL/dataexport/parquet"
	stop_server
	echo "$rate	$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$start" "$(date +%s.%N)")"
}

echo "round	build	push64_records_s	push64_p99_ms	push500_records_s	push500_p99_ms	sync_records_s	export_s" |
	tee "$WORK/results.tsv"
for round in $(seq 1 "$ROUNDS"); do
	for build in A B; do
		bin=$A
		[ $build = B ] && bin=$B
		p64=$(storm "$bin" "$WORK/$build" 64)
		p500=$(storm "$bin" "$WORK/$build" 500)
		se=$(sync_and_export "$bin" "$WORK/$build")
		echo "$round	$build	$p64	$p500	$se" | tee -a "$WORK/results.tsv"
	done
done
rm -rf "$WORK/A" "$WORK/B" "$WORK/export.zip"
