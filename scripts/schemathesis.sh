#!/usr/bin/env bash
# Property-based API test: starts the built server on its embedded database in a temp DATA_ROOT,
# logs in as admin and runs schemathesis against /openapi/synkronus.json, checking that no
# response is a 5xx and that every response matches the document. Usage: scripts/schemathesis.sh BINARY
set -euo pipefail

BIN=${1:?usage: scripts/schemathesis.sh path/to/synkronus}
BIN=$(realpath "$BIN")
# Works around a CPython bug inside hypothesis before any case is generated (see the file).
export SCHEMATHESIS_HOOKS
SCHEMATHESIS_HOOKS="$(cd "$(dirname "$0")" && pwd)/schemathesis_hooks.py"
MAX_EXAMPLES=${FUZZ_MAX_EXAMPLES:-20}
MAX_TIME=${FUZZ_MAX_TIME:-150}

if ! command -v schemathesis >/dev/null 2>&1; then
    echo "installing schemathesis (pip)"
    python3 -m pip install --quiet schemathesis
    hash -r
fi

DATA_ROOT=$(mktemp -d /tmp/synkronus-fuzz.XXXXXX)
# The embedded cluster runs as the postgres user when we are root: it must reach the directory.
chmod 755 "$DATA_ROOT"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ADMIN_PASSWORD="fuzz-admin-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
LOG="$DATA_ROOT/server.log"

cleanup() {
    if [ -n "${SERVER_PID:-}" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$DATA_ROOT"
}
trap cleanup EXIT

(
    cd "$DATA_ROOT"
    exec env PORT="$PORT" BIND_ADDRESS=127.0.0.1 DATA_ROOT="$DATA_ROOT/data" \
        JWT_SECRET="$(head -c 48 /dev/urandom | base64 | tr -d '\n/+=')" \
        ADMIN_PASSWORD="$ADMIN_PASSWORD" RATE_LIMIT_LOGIN_PER_MIN=0 LOG_LEVEL=warn \
        "$BIN" serve
) >"$LOG" 2>&1 &
SERVER_PID=$!

BASE="http://127.0.0.1:$PORT"
for _ in $(seq 1 120); do
    if curl -fsS "$BASE/ready" >/dev/null 2>&1; then break; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "server exited:"; cat "$LOG"; exit 1; fi
    sleep 0.5
done
curl -fsS "$BASE/ready" >/dev/null

TOKEN=$(curl -fsS -X POST "$BASE/auth/login" -H 'content-type: application/json' \
    -d "{\"username\":\"admin\",\"password\":\"$ADMIN_PASSWORD\"}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')

# Logout and a password reset (schemathesis learns the name "admin") revoke the token every other
# operation uses, so they are left out; black-box tests in tests/api cover both.
status=0
# Run from the temp dir: schemathesis keeps a cache in its working directory.
cd "$DATA_ROOT"
fuzz() {
    schemathesis run "$BASE/openapi/synkronus.json" \
        --url "$BASE" \
        --header "Authorization: Bearer $TOKEN" \
        --checks not_a_server_error,response_schema_conformance \
        --exclude-path /auth/logout \
        --exclude-path /users/reset-password \
        --max-examples "$MAX_EXAMPLES" \
        --max-time "$MAX_TIME" \
        --workers 2 \
        --seed "${FUZZ_SEED:-20260}" \
        --generation-database none \
        ${FUZZ_REPORT_DIR:+--report har --report-dir "$FUZZ_REPORT_DIR"} \
        --no-color
}
fuzz 2>&1 | tee "$DATA_ROOT/fuzz.out" || status=$?
# A run that fails inside the tool itself ("Runtime Error", no failed check, no request judged)
# is made once more: scripts/schemathesis_hooks.py mends the one such failure seen here (CPython
# before 3.11.8, "AST constructor recursion depth mismatch" while hypothesis describes a strategy),
# and this keeps another of its kind from failing the build on its first occurrence.
if [ "$status" -ne 0 ] && ! grep -q '= FAILURES =' "$DATA_ROOT/fuzz.out" \
    && grep -q '^Runtime Error' "$DATA_ROOT/fuzz.out"; then
    echo "--- schemathesis failed inside the tool itself (not a finding): running it again"
    status=0
    fuzz || status=$?
fi

if grep -q '"level":"ERROR"\|ERROR' "$LOG"; then
    echo "--- server errors during the run:"
    grep 'ERROR' "$LOG" | head -50
fi
exit $status
