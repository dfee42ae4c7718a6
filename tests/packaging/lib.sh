# Sourced by the package tests (image-test.sh, compose-test.sh, deb-test.sh, k8s-test.sh): the
# engine, the scenario driver, checks counted into a closing "N passed, N failed" line.
# shellcheck source=../../scripts/images/engine.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/images/engine.sh"

SCENARIO="python3 $(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/scenario.py"
TEST_NAME=${TEST_NAME:-$(basename "$0" .sh)}
passed=0
started=$(date +%s)
WORK=$(mktemp -d "/var/tmp/synkronus-$TEST_NAME.XXXXXX")
cleanups=()

# Runs at exit in reverse order of registration, then prints the closing line.
on_exit() {
	local status=$?
	for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do eval "${cleanups[$i]}" >/dev/null 2>&1 || true; done
	rm -rf "$WORK"
	local failed=0
	[ "$status" = 0 ] || failed=1
	echo "$TEST_NAME: $passed passed, $failed failed ($(($(date +%s) - started)) s)"
	exit "$status"
}
trap on_exit EXIT
cleanup() { cleanups+=("$1"); }

ok() {
	passed=$((passed + 1))
	echo "ok $passed - $*"
}

fail() {
	echo "$TEST_NAME: FAILED: $*" >&2
	exit 1
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits (up to $2 seconds) until the command in $1 succeeds.
wait_for() {
	local deadline=$(($(date +%s) + $2))
	until eval "$1" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || return 1
		sleep 0.5
	done
}

# Runs the storm against $1 in the background, waits until $3 records are acknowledged, runs $4
# (the stop), then waits for the storm to end. STATE is $2.
storm_and_stop() {
	local url=$1 state=$2 want=$3 stop=$4
	rm -f "$state.acked"
	$SCENARIO storm "$url" "$state" --devices 64 --seconds 300 >"$WORK/storm.log" 2>&1 &
	local storm=$!
	if ! wait_for "[ -f '$state.acked' ] && [ \$(cat '$state.acked') -ge $want ]" 180; then
		kill "$storm" 2>/dev/null
		cat "$WORK/storm.log"
		fail "the storm did not reach $want acknowledged records"
	fi
	eval "$stop"
	wait "$storm" || { cat "$WORK/storm.log"; fail "the storm failed"; }
	cat "$WORK/storm.log"
}

# The container's health as its engine sees it: healthy, unhealthy or starting. Podman runs
# health checks from systemd timers, which a cgroupfs setup has not: run one now instead.
health() {
	if [ "$CONTAINER_ENGINE" = podman ]; then
		engine healthcheck run "$1" >/dev/null 2>&1 || true
	fi
	engine inspect --format '{{.State.Health.Status}}' "$1" 2>/dev/null || engine inspect --format '{{.State.Healthcheck.Status}}' "$1"
}

# True when the container's log has a line matching $2 (the whole log read first: grep -q would
# stop reading early, and pipefail would take the writer's SIGPIPE for a failure).
log_has() {
	engine logs "$1" >"$WORK/container.log" 2>&1 || true
	grep -q "$2" "$WORK/container.log"
}

# Netavark before 1.9 (Debian 12 ships 1.4) leaves a network bridge's MAC address to the kernel,
# which gives a bridge the lowest address among its ports: when a container joins with a lower one
# or the owner of the lowest leaves (compose's one-shot `bucket`, a killed node), the bridge's
# address changes, and the containers' cached address of their gateway, where aardvark-dns
# answers, is stale until ARP revalidates it (tens of seconds). Their lookups of `postgres` and
# `moto` time out meanwhile: a node answered 503 for half a minute in CI
# (containers/netavark#833). An address set explicitly is one the kernel keeps, so this pins each
# podman bridge's address the moment it appears, until the calling script exits.
pin_bridge_addresses() {
	[ "$CONTAINER_ENGINE" = podman ] && [ "$(id -u)" = 0 ] || return 0
	(
		while kill -0 "$$" 2>/dev/null; do
			for bridge in /sys/class/net/podman*/bridge /sys/class/net/cni-podman*/bridge; do
				[ -e "$bridge" ] || continue
				dev=${bridge%/bridge}
				# addr_assign_type 3: set by hand (NET_ADDR_SET), which the kernel no longer recalculates.
				[ "$(cat "$dev/addr_assign_type" 2>/dev/null)" = 3 ] ||
					ip link set dev "${dev##*/}" address "$(cat "$dev/address")" 2>/dev/null || true
			done
			sleep 0.1
		done
	) >/dev/null 2>&1 &
	cleanup "kill $! 2>/dev/null"
}
