#!/usr/bin/env bash
# make dist: the release archive dist/synkronus-<version>-<arch>-linux.tar.gz (the binary, LICENSE,
# README.md, CHANGELOG.md, a sample environment file and the systemd unit, in one folder of the
# same name) and its .sha256 (`sha256sum -c` checks it).
#
#   scripts/package/dist.sh [BINARY]     (default: the release binary of CARGO_TARGET_DIR)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-${CARGO_TARGET_DIR:-target}/release/synkronus}
OUT=${DIST_DIR:-dist}
[ -x "$BIN" ] || { echo "dist: no binary at $BIN (make release)" >&2; exit 1; }
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
name=synkronus-$VERSION-$(uname -m)-linux

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name" "$OUT"
install -m 0755 "$BIN" "$stage/$name/synkronus"
install -m 0644 LICENSE README.md CHANGELOG.md "$stage/$name/"
install -m 0644 packaging/synkronus.env "$stage/$name/synkronus.env.sample"
install -m 0644 packaging/synkronus.service "$stage/$name/synkronus.service"
tar --owner=0 --group=0 --numeric-owner --sort=name -C "$stage" -czf "$OUT/$name.tar.gz" "$name"
(cd "$OUT" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "dist: $OUT/$name.tar.gz ($(du -h "$OUT/$name.tar.gz" | cut -f1)) and $OUT/$name.tar.gz.sha256"
