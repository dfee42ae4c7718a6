#!/usr/bin/env bash
# make dist's archive (make image-test): named synkronus-<version>-<arch>-linux.tar.gz, its
# .sha256 checks, it holds the binary (which runs), LICENSE, README.md, CHANGELOG.md, the sample
# settings and the unit the Debian package installs.
#
#   tests/packaging/dist-test.sh [BINARY]
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/packaging/lib.sh

BIN=${1:-${CARGO_TARGET_DIR:-target}/release/synkronus}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
name=synkronus-$VERSION-$(uname -m)-linux
DIST_DIR=$WORK/dist scripts/package/dist.sh "$BIN" >/dev/null
(cd "$WORK/dist" && sha256sum --quiet -c "$name.tar.gz.sha256") || fail "the .sha256 does not check"
ok "dist/$name.tar.gz and its .sha256"

listing=$(tar -tzf "$WORK/dist/$name.tar.gz" | sort | tr '\n' ' ')
want="$name/ $name/CHANGELOG.md $name/LICENSE $name/README.md $name/synkronus $name/synkronus.env.sample $name/synkronus.service "
[ "$listing" = "$want" ] || fail "archive holds: $listing"
tar -xzf "$WORK/dist/$name.tar.gz" -C "$WORK"
"$WORK/$name/synkronus" --version | grep -q "$VERSION" || fail "the archived binary does not run"
cmp -s "$WORK/$name/synkronus.service" packaging/synkronus.service || fail "the unit differs from packaging/"
ok "it holds the binary (synkronus $VERSION runs), LICENSE, README, CHANGELOG, the sample settings, the unit"
