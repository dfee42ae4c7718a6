#!/usr/bin/env bash
# Builds the container image from the root Dockerfile (`make image`), tagged IMAGE (default
# synkronus:<version>) and synkronus:latest, with the OCI labels filled in: the version of
# Cargo.toml, the commit, and the source (the git remote's URL when there is one). Makes the base
# images first where no registry serves them (base-images.sh). REVISION overrides the commit.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=engine.sh
source scripts/images/engine.sh

VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
IMAGE=${IMAGE:-synkronus:$VERSION}
REVISION=${REVISION:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
SOURCE=$(git remote get-url origin 2>/dev/null | grep -E '^(https://|git@)' || true)

scripts/images/base-images.sh
# The builder stage needs about 6 GB (the Rust image, the release dependencies and their layer).
# Layers of earlier builds are its cache; when space is short they go first (the build is then
# cold), and a machine still short of space is named as the cause instead of a compiler error.
need_kb=$((6 * 1024 * 1024))
store=$(engine info --format '{{.Store.GraphRoot}}' 2>/dev/null || echo /var/lib)
[ -d "$store" ] || store=/
free_kb() { df -Pk "$store" | awk 'NR == 2 { print $4 }'; }
if [ "$(free_kb)" -lt "$need_kb" ]; then
	echo "image: $(($(free_kb) / 1024)) MB free under $store; removing unused image layers"
	engine image prune -f >/dev/null || true
	engine builder prune -f >/dev/null 2>&1 || true
fi
if [ "$(free_kb)" -lt "$need_kb" ]; then
	echo "image: only $(($(free_kb) / 1024)) MB free under $store, the build needs about 6 GB" >&2
	exit 1
fi
echo "image: building $IMAGE (commit $REVISION)"
engine_build -t "$IMAGE" -t synkronus:latest \
	--build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" --build-arg SOURCE="$SOURCE" .
engine image inspect --format '{{.Size}}' "$IMAGE" | awk -v i="$IMAGE" '{printf "image: %s is %.0f MB\n", i, $1/1e6}'
