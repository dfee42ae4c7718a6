#!/usr/bin/env bash
# The Debian package, end to end (make image-test): built with cargo-deb twice (an earlier version,
# then this one), installed into a container of the same debian:bookworm-slim as the image's (with
# its PostgreSQL dependency from Debian), the systemd unit verified (systemd-analyze verify), the
# server started as the unit starts it (run-unit.sh), the scenario, an upgrade to the newer
# package (data, settings and tokens kept), removal (data and settings kept), purge (the settings
# go; the data stays unless the debconf question is answered yes).
#
#   tests/packaging/deb-test.sh [BINARY]     (default: the release binary of CARGO_TARGET_DIR)
#
# The container shares the host's network (apt reaches Debian's mirror as the host does; the
# server listens on a free loopback port). Services are not started by package scripts inside it
# (policy-rc.d), as in any container.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/packaging/lib.sh

BIN=${1:-${CARGO_TARGET_DIR:-target}/release/synkronus}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
scripts/images/base-images.sh >/dev/null

DIST_DIR=$WORK/debs scripts/package/deb.sh "$BIN" --fast --deb-version "$VERSION-0" >/dev/null
DIST_DIR=$WORK/debs scripts/package/deb.sh "$BIN" --fast >/dev/null
old=$(basename "$(ls "$WORK"/debs/synkronus_"$VERSION"-0_*.deb)")
new=$(basename "$(ls "$WORK"/debs/synkronus_"$VERSION"-1_*.deb)")
contents=$(dpkg-deb -c "$WORK/debs/$new")
for path in ./usr/bin/synkronus ./etc/synkronus/synkronus.env ./usr/lib/systemd/system/synkronus.service; do
	echo "$contents" | grep -q " $path\$" || fail "$new has no $path"
done
depends=$(dpkg-deb -f "$WORK/debs/$new" Depends)
echo "$depends" | grep -q 'postgresql-15' || fail "Depends: $depends"
ok "built $old and $new: /usr/bin/synkronus, the unit, the settings file; Depends: $depends"

name=synkronus-deb-test-$$
cleanup "engine rm -f -v $name"
engine_run -d --name "$name" --network host -v "$WORK/debs:/debs:ro" -v "$PWD/tests/packaging:/t:ro" \
	debian:bookworm-slim sleep infinity >/dev/null
inside() { engine exec "$name" bash -c "$*"; }
inside 'printf "#!/bin/sh\nexit 101\n" >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d'
inside "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /debs/$old systemd >/dev/null 2>&1" \
	|| fail "apt-get install $old"
inside 'test -x /usr/bin/synkronus && id -u synkronus && test -d /var/lib/synkronus' >/dev/null || fail "installed files or user"
[ "$(inside 'stat -c "%U:%G %a" /etc/synkronus/synkronus.env')" = "root:synkronus 640" ] || fail "settings file owner or mode"
[ "$(inside 'stat -c "%U %a" /var/lib/synkronus')" = "synkronus 700" ] || fail "/var/lib/synkronus owner or mode"
[ "$(inside 'getent passwd synkronus | cut -d: -f3')" -lt 1000 ] || fail "synkronus is not a system user"
ok "installed with apt-get (PostgreSQL from Debian): the synkronus system user, /etc/synkronus/synkronus.env root:synkronus 640"

verify=$(inside 'systemd-analyze verify /usr/lib/systemd/system/synkronus.service 2>&1' || true)
[ -z "$verify" ] || fail "systemd-analyze verify: $verify"
exposure=$(inside 'systemd-analyze security --offline=true /usr/lib/systemd/system/synkronus.service 2>/dev/null | tail -n 1' || true)
ok "systemd-analyze verify: clean ($exposure)"

port=$(free_port)
url=http://127.0.0.1:$port
state=$WORK/state.json
inside "echo PORT=$port >>/etc/synkronus/synkronus.env && echo BIND_ADDRESS=127.0.0.1 >>/etc/synkronus/synkronus.env"
start() { engine exec -d "$name" bash -c '/t/run-unit.sh /usr/lib/systemd/system/synkronus.service >/var/log/synkronus.log 2>&1' >/dev/null; }
stop() {
	inside 'pid=$(cat /run/synkronus.pid); kill -TERM $pid; while kill -0 $pid 2>/dev/null; do sleep 0.2; done'
}
start
$SCENARIO basic "$url" "$state" || { inside 'tail -30 /var/log/synkronus.log'; fail "basic scenario"; }
[ "$(inside 'ps -o user= -C synkronus 2>/dev/null || stat -c %U /proc/$(cat /run/synkronus.pid)')" != root ] || fail "the server runs as root"
inside 'test -f /var/lib/synkronus/postgres/PG_VERSION' || fail "no embedded cluster in /var/lib/synkronus"
ok "started as the unit starts it (user synkronus, the settings file): the scenario passes, the cluster in /var/lib/synkronus"

stop
inside "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /debs/$new >/dev/null 2>&1" || fail "upgrade to $new"
inside "dpkg-query -W -f='\${Version}' synkronus" | grep -q "^$VERSION-1\$" || fail "upgraded version"
inside "grep -q '^PORT=$port\$' /etc/synkronus/synkronus.env" || fail "the upgrade lost the settings"
start
$SCENARIO check "$url" "$state" || { inside 'tail -30 /var/log/synkronus.log'; fail "check after the upgrade"; }
ok "upgraded $old -> $new: settings kept, data and tokens valid"

stop
inside 'DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq synkronus >/dev/null 2>&1' || fail "remove"
inside 'test ! -e /usr/bin/synkronus && test -f /var/lib/synkronus/postgres/PG_VERSION && test -f /etc/synkronus/synkronus.env' \
	|| fail "remove: binary still there, or data or settings gone"
ok "removed: binary gone, /var/lib/synkronus and /etc/synkronus kept"

inside 'DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq synkronus >/dev/null 2>&1' || fail "purge"
inside 'test ! -e /etc/synkronus && test -f /var/lib/synkronus/postgres/PG_VERSION' || fail "purge (default answer): settings left or data gone"
inside "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /debs/$new >/dev/null 2>&1" || fail "install again"
inside 'echo "synkronus synkronus/purge_data boolean true" | debconf-set-selections'
inside 'DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq synkronus >/dev/null 2>&1' || fail "purge (yes)"
inside 'test ! -e /var/lib/synkronus' || fail "purge answered yes: /var/lib/synkronus is still there"
ok "purged: settings gone; the data kept by default, deleted when the debconf question is answered yes"
