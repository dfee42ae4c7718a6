#!/usr/bin/env bash
# Starts the built server on a private embedded database and a free port, runs the browser tests
# against it, then stops it. Usage: portal-tests/run.sh <path to the synkronus binary> [node --test options]
# (for example --test-name-pattern='fast navigation' to run one test).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:?usage: run.sh <synkronus binary>}"
# Under /tmp: when running as root the embedded cluster runs as the postgres user, which must reach it.
data="$(mktemp -d /tmp/synkronus-portal-XXXXXX)"
chmod 755 "$data"
port="$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")"
export PORTAL_ADMIN_PASSWORD="portal-admin-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
server_pid=""
stop() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$data"
}
trap stop EXIT
DATA_ROOT="$data" PORT="$port" BIND_ADDRESS=127.0.0.1 ADMIN_USERNAME=admin ADMIN_PASSWORD="$PORTAL_ADMIN_PASSWORD" \
  JWT_SECRET="portal-tests-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" LOG_LEVEL=warn \
  JWT_TTL_SECONDS=20 RATE_LIMIT_LOGIN_PER_MIN=0 "$bin" serve >"$data/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 120); do
  if node -e 'fetch(process.argv[1]).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))' \
    "http://127.0.0.1:$port/ready"; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then cat "$data/server.log"; echo "the server did not start" >&2; exit 1; fi
  sleep 0.5
done
export PORTAL_BASE_URL="http://127.0.0.1:$port"
# Short-lived access tokens, so that the tests see the portal refresh them.
export PORTAL_JWT_TTL=20
status=0
(cd "$here" && node --test --test-reporter=spec "${@:2}") || status=$?
if [ "$status" != 0 ]; then echo "--- server log ---"; tail -n 50 "$data/server.log"; fi
exit "$status"
