#!/usr/bin/env bash
# deploy/compose.cluster.yaml, end to end (make image-test): the unchanged file brought up
# (PostgreSQL, moto's S3 server and its bucket, three nodes, nginx; images made locally where no
# registry serves them, service-images.sh), every node seen answering through nginx, the scenario
# through nginx, one node killed (SIGKILL) in the middle of a push storm, then everything checked
# through nginx with that node still down; and compose.yaml's single node brought up and checked.
# Uses `docker compose` where a docker daemon answers, else podman-compose. IMAGE (default
# synkronus:latest, made by image-test.sh or make image) is the server's image.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/packaging/lib.sh

export SYNKRONUS_IMAGE=${IMAGE:-synkronus:latest}
image_exists "$SYNKRONUS_IMAGE" || scripts/images/build.sh
scripts/images/service-images.sh

if [ "$CONTAINER_ENGINE" = docker ] && docker compose version >/dev/null 2>&1; then
	compose() { docker compose "$@"; }
	up=(up -d --no-build --wait)
else
	compose() {
		podman-compose --podman-args "${CONTAINER_GLOBAL_FLAGS:-}" --podman-run-args "${CONTAINER_RUN_FLAGS:-}" "$@"
	}
	up=(up -d --no-build)
fi
# The containers of one service of a project, whichever tool labelled them.
service_container() {
	engine ps -a -q --filter "label=com.docker.compose.project=$1" --filter "label=com.docker.compose.service=$2" | head -n 1
}

# podman-compose's down leaves the project's networks.
remove_networks() {
	engine network ls -q --filter "label=com.docker.compose.project=$1" | xargs -r "$CONTAINER_ENGINE" ${CONTAINER_GLOBAL_FLAGS:-} network rm
}

project=synkronus-cluster-test-$$
export SYNKRONUS_PORT JWT_SECRET
SYNKRONUS_PORT=$(free_port)
JWT_SECRET=$(head -c 48 /dev/urandom | base64 | tr -d '\n/+=')
url=http://127.0.0.1:$SYNKRONUS_PORT
state=$WORK/state.json

# The nodes seen answering /health through nginx, sampled until exactly `want` have answered, or
# 40 s. nginx takes a node out of the rotation for 10 s when it refuses a connection (one still
# starting) or answers 502/503 (max_fails=1 in deploy/nginx.conf), so a quick sample can miss a
# node that is up; a node that should not answer makes the set differ until the deadline.
nodes_seen() {
	local want=$1 seen="" deadline=$(($(date +%s) + 40))
	: >"$WORK/nodes"
	while [ "$seen" != "$want" ] && [ "$(date +%s)" -lt "$deadline" ]; do
		for _ in $(seq 1 6); do
			curl -s "$url/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["node"])' 2>/dev/null || true
		done >>"$WORK/nodes"
		seen=$(sort -u "$WORK/nodes" | tr '\n' ' ')
		[ "$seen" = "$want" ] || sleep 1
	done
	echo "$seen"
}
cluster_logs() { compose -p "$project" -f deploy/compose.cluster.yaml logs 2>&1 | grep -v '" 200 \|" 204 ' | tail -40; }

pin_bridge_addresses
cleanup "remove_networks $project"
cleanup "compose -p $project -f deploy/compose.cluster.yaml down -v"
compose -p "$project" -f deploy/compose.cluster.yaml "${up[@]}" >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "compose up"; }
$SCENARIO basic "$url" "$state" || { cluster_logs; fail "basic scenario through nginx"; }
ok "compose.cluster.yaml up (PostgreSQL, moto, three nodes, nginx): the scenario through nginx"

nodes=$(nodes_seen "node-a node-b node-c ")
[ "$nodes" = "node-a node-b node-c " ] || { cluster_logs; fail "nodes answering through nginx: $nodes"; }
ok "every node answers through nginx, each with its NODE_ID: $nodes"

victim=$(service_container "$project" node-b)
[ -n "$victim" ] || fail "no container for node-b"
# Killed, then the storm goes on through the other two until 1,500 more records are acknowledged.
storm_and_stop "$url" "$state" 1500 "engine kill $victim >/dev/null && wait_for \"[ \\\$(cat '$state.acked') -ge 3000 ]\" 120; touch '$state.stop'"
engine stop -t 0 "$victim" >/dev/null 2>&1 || true
$SCENARIO check "$url" "$state" || fail "check through nginx with node-b down"
nodes=$(nodes_seen "node-a node-c ")
[ "$nodes" = "node-a node-c " ] || { cluster_logs; fail "with node-b down, nginx reached: $nodes"; }
ok "node-b killed in the middle of a push storm: still served by node-a and node-c, every acknowledged record there, 0 duplicated"

compose -p "$project" -f deploy/compose.cluster.yaml down -v >/dev/null 2>&1

single=synkronus-single-test-$$
SYNKRONUS_PORT=$(free_port)
url=http://127.0.0.1:$SYNKRONUS_PORT
cleanup "remove_networks $single"
cleanup "compose -p $single -f compose.yaml down -v"
compose -p "$single" -f compose.yaml "${up[@]}" >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "compose up (compose.yaml)"; }
$SCENARIO basic "$url" "$WORK/single.json" || { compose -p "$single" -f compose.yaml logs 2>&1 | tail -40; fail "basic scenario on compose.yaml"; }
compose -p "$single" -f compose.yaml restart >/dev/null 2>&1
$SCENARIO check "$url" "$WORK/single.json" || fail "check after compose restart"
ok "compose.yaml: one node on its embedded database and a named volume; the scenario, then a restart"
