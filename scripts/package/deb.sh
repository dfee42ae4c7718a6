#!/usr/bin/env bash
# make deb: the Debian package dist/synkronus_<version>-1_<arch>.deb, built by cargo-deb from
# Cargo.toml's [package.metadata.deb] (make image-deps installs cargo-deb).
#
#   scripts/package/deb.sh [BINARY [cargo-deb options…]]
#
# BINARY (default: the release binary of CARGO_TARGET_DIR) is packaged as it is, without a build.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${1:-${CARGO_TARGET_DIR:-target}/release/synkronus}
shift || true
OUT=${DIST_DIR:-dist}
[ -x "$BIN" ] || { echo "deb: no binary at $BIN (make release)" >&2; exit 1; }
command -v cargo-deb >/dev/null || { echo "deb: cargo-deb is missing (make image-deps)" >&2; exit 1; }
mkdir -p "$OUT"
# cargo-deb reads the binary from <target dir>/release/: give it one holding BIN.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/release"
cp "$BIN" "$stage/release/synkronus"
CARGO_TARGET_DIR=$stage cargo deb --no-build --no-strip --output "$OUT" "$@"
