#!/usr/bin/env bash
# The container image, end to end (make image-test; docs/deploy.md, "Packages"): builds it from the
# unchanged Dockerfile (base images made locally where no registry serves them), runs it with no
# setting but a port and a volume, and drives tests/packaging/scenario.py against it: the basic
# scenario; a 64-device push storm stopped with SIGTERM in the middle (every acknowledged record
# there after the restart, none stored twice); a new container on the same volume (data, secret
# and tokens kept); the health check going unhealthy while the database is frozen; non-root
# processes only. IMAGE names an image to test instead of building one.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/packaging/lib.sh

if [ -z "${IMAGE:-}" ]; then
	scripts/images/build.sh
	IMAGE=synkronus:latest
fi
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)

size=$(engine image inspect --format '{{.Size}}' "$IMAGE")
[ "$size" -lt 200000000 ] || fail "the image is $((size / 1000000)) MB, over 200 MB"
ok "image $IMAGE is $((size / 1000000)) MB (under 200 MB)"

labels=$(engine image inspect --format '{{json .Config.Labels}}' "$IMAGE")
for key in version revision source licenses; do
	echo "$labels" | grep -q "\"org.opencontainers.image.$key\"" || fail "no OCI label $key: $labels"
done
echo "$labels" | grep -q "\"org.opencontainers.image.version\":\"$VERSION\"" || fail "version label: $labels"
echo "$labels" | grep -q '"org.opencontainers.image.licenses":"MIT"' || fail "licence label: $labels"
user=$(engine image inspect --format '{{.Config.User}}' "$IMAGE")
case "$user" in "" | 0 | 0:* | root | root:*) fail "the image runs as root ($user)" ;; esac
ok "OCI labels (version $VERSION, revision, source, licence), user $user"

volume=synkronus-image-test-$$
name=synkronus-image-test-$$
cleanup "engine volume rm -f $volume"
cleanup "engine rm -f -v $name"
cleanup "engine rm -f -v $name-2"
port=$(free_port)
url=http://127.0.0.1:$port
state=$WORK/state.json
# The image's own check, run every 2 s instead of 30 s so that the test sees a change quickly
# (podman applies the timing flags only together with the command).
check=$(engine image inspect --format '{{json .Config.Healthcheck.Test}}' "$IMAGE")
[ "$check" = '["CMD","synkronus","healthcheck"]' ] || fail "the image's HEALTHCHECK is $check"
health_flags=(--health-cmd 'synkronus healthcheck' --health-interval 2s --health-retries 2 --health-timeout 5s
	--health-start-period 5s)

engine_run -d --name "$name" -p "127.0.0.1:$port:8080" -v "$volume:/var/lib/synkronus" "$IMAGE" >/dev/null
$SCENARIO basic "$url" "$state" || { engine logs "$name" | tail -30; fail "basic scenario"; }
ok "docker run with no setting: sign in, user, push and pull, bundle switch, attachment, Parquet export"

log_has "$name" 'JWT_SECRET is unset: generated a secret into the data root' \
	|| fail "the log does not say the JWT secret was generated"
ok "the JWT secret was generated into the volume, and logged as such"

uids=$(engine exec "$name" bash -c 'for s in /proc/[0-9]*/status; do sed -n "s/^Uid:[[:space:]]*\([0-9]*\).*/\1/p" "$s"; done' | sort -u | tr '\n' ' ')
[ "$uids" = "10001 " ] || fail "processes run as uids $uids (want only 10001)"
count=$(engine exec "$name" bash -c 'grep -l "^Name:[[:space:]]*postgres" /proc/[0-9]*/status | wc -l')
[ "$count" -gt 0 ] || fail "no PostgreSQL process in the container"
ok "every process (the server and $count of PostgreSQL) runs as uid 10001, none as root"

wait_for "[ \"\$(health $name)\" = healthy ]" 60 || fail "health: $(health "$name")"
ok "the health check (synkronus healthcheck) reports healthy"

storm_and_stop "$url" "$state" 1500 "engine stop -t 60 $name >/dev/null"
code=$(engine inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { engine logs "$name" 2>&1 | tail -20; fail "the server exited with $code after SIGTERM"; }
ok "SIGTERM in the middle of a 64-device push storm: graceful stop, exit status 0"

engine start "$name" >/dev/null
$SCENARIO check "$url" "$state" || { engine logs "$name" | tail -30; fail "check after the restart"; }
ok "restarted: every acknowledged record there, unanswered pushes sent again applied once, 0 duplicated"

engine stop -t 60 "$name" >/dev/null
engine rm -v "$name" >/dev/null
engine_run -d --name "$name-2" -p "127.0.0.1:$port:8080" -v "$volume:/var/lib/synkronus" "${health_flags[@]}" "$IMAGE" >/dev/null
$SCENARIO check "$url" "$state" || { engine logs "$name-2" | tail -30; fail "check in a new container"; }
log_has "$name-2" 'JWT_SECRET is unset: read the secret from the data root' \
	|| fail "the new container did not read the volume's JWT secret"
ok "a new container on the same volume: data there, the volume's secret read back, old tokens valid"

# Every PostgreSQL process stopped (SIGSTOP): connections hang as on a database that went away.
pg_signal() {
	engine exec "$name-2" bash -c "for s in /proc/[0-9]*/status; do
		grep -q '^Name:[[:space:]]*postgres' \"\$s\" && p=\${s#/proc/} && kill -$1 \${p%/status}; done; true"
}
wait_for "[ \"\$(health $name-2)\" = healthy ]" 60 || fail "health before: $(health "$name-2")"
pg_signal STOP
wait_for "[ \"\$(health $name-2)\" = unhealthy ]" 60 || { pg_signal CONT; fail "health with the database frozen: $(health "$name-2")"; }
pg_signal CONT
wait_for "[ \"\$(health $name-2)\" = healthy ]" 60 || fail "health after the database is back: $(health "$name-2")"
ok "the health check goes unhealthy while the database does not answer, healthy again after"

engine stop -t 60 "$name-2" >/dev/null
