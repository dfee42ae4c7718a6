#!/usr/bin/env bash
# Makes the Dockerfile's base images where no registry can be reached, so that the unchanged
# Dockerfile builds (docs/deploy.md, "Packages"):
#
#   debian:bookworm-slim         a Debian root filesystem made by mmdebstrap from Debian's packages,
#                                slimmed the way the registry's image is (no manuals, no docs, no
#                                translations; apt cleans its caches)
#   rust:<version>-slim-bookworm that image plus gcc, libc6-dev, ca-certificates and the Rust
#                                toolchain installed on this machine (rustup's, under ~/.rustup),
#                                laid out as the registry's image lays it out (RUSTUP_HOME=
#                                /usr/local/rustup, CARGO_HOME=/usr/local/cargo)
#
# An image that already exists is kept; one the registry serves is pulled instead (unless
# BASE_IMAGES_PULL=no). <version> is the Dockerfile's `ARG RUST_VERSION`, and the toolchain here
# must be that release. The machine's own certificate authorities (/usr/local/share/ca-certificates,
# e.g. an HTTPS proxy's) are added to the local images so that a build reaches crates.io from inside
# a container as it does from the host. Needs root and mmdebstrap (make image-deps installs it).
#
#   scripts/images/base-images.sh          both images
#   scripts/images/base-images.sh --force  make them again
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=engine.sh
source scripts/images/engine.sh

FORCE=${1:-}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
RUST_VERSION=$(sed -n 's/^ARG RUST_VERSION=//p' Dockerfile)
DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
RUST_IMAGE=docker.io/library/rust:${RUST_VERSION}-slim-bookworm

work=$(mktemp -d /var/tmp/synkronus-base-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

# True when the image is there (made before, or pulled now).
have() {
	if [ "$FORCE" != --force ] && image_exists "$1"; then
		echo "base-images: $1 is there"
		return 0
	fi
	if [ "$FORCE" != --force ] && [ "${BASE_IMAGES_PULL:-yes}" != no ] \
		&& timeout 120 engine pull -q "$1" >/dev/null 2>&1; then
		echo "base-images: pulled $1"
		return 0
	fi
	return 1
}

make_debian() {
	command -v mmdebstrap >/dev/null || { echo "base-images: mmdebstrap is missing (make image-deps)" >&2; exit 1; }
	echo "base-images: making $DEBIAN_IMAGE with mmdebstrap"
	# The registry image's slimming (dpkg leaves these paths out of every package it installs).
	local excludes=(
		'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright'
		'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/groff/*'
		'path-exclude=/usr/share/info/*' 'path-exclude=/usr/share/lintian/*'
		'path-exclude=/usr/share/linda/*' 'path-exclude=/usr/share/locale/*'
	)
	local dpkgopts=()
	for e in "${excludes[@]}"; do dpkgopts+=(--dpkgopt="$e"); done
	mmdebstrap --quiet --variant=minbase --format=tar "${dpkgopts[@]}" \
		--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
		--customize-hook='rm -f "$1"/etc/apt/sources.list' \
		--customize-hook="printf 'Types: deb\nURIs: $MIRROR\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: $SECURITY_MIRROR\nSuites: bookworm-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > \"\$1\"/etc/apt/sources.list.d/debian.sources" \
		--customize-hook='printf "%s\n" "DPkg::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };" "APT::Update::Post-Invoke { \"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true\"; };" "Dir::Cache::pkgcache \"\";" "Dir::Cache::srcpkgcache \"\";" > "$1"/etc/apt/apt.conf.d/docker-clean' \
		--customize-hook='echo "Acquire::Languages \"none\";" > "$1"/etc/apt/apt.conf.d/docker-no-languages' \
		--customize-hook='echo "Acquire::GzipIndexes \"true\";" > "$1"/etc/apt/apt.conf.d/docker-gzip-indexes' \
		--customize-hook='echo "Apt::AutoRemove::SuggestsImportant \"false\";" > "$1"/etc/apt/apt.conf.d/docker-autoremove-suggests' \
		--customize-hook='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then mkdir -p "$1"/usr/local/share/ca-certificates && cp /usr/local/share/ca-certificates/*.crt "$1"/usr/local/share/ca-certificates/; fi' \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log "$1"/var/log/apt/*' \
		bookworm "$work/rootfs.tar" "deb $MIRROR bookworm main"
	engine import --change 'CMD ["bash"]' "$work/rootfs.tar" "$DEBIAN_IMAGE" >/dev/null
	rm -f "$work/rootfs.tar"
}

make_rust() {
	local rustc version toolchain
	rustc=$(command -v rustc) || { echo "base-images: no Rust toolchain here" >&2; exit 1; }
	version=$("$rustc" --version | awk '{print $2}')
	case "$version" in
	"$RUST_VERSION" | "$RUST_VERSION".*) ;;
	*) echo "base-images: the Dockerfile wants Rust $RUST_VERSION, this machine has $version (rustup install $RUST_VERSION)" >&2; exit 1 ;;
	esac
	toolchain=$("$rustc" --print sysroot)
	echo "base-images: making $RUST_IMAGE from $toolchain"
	local name=${version}-x86_64-unknown-linux-gnu
	mkdir -p "$work/rust/rustup/toolchains/$name" "$work/rust/cargo/bin"
	# The toolchain without its HTML documentation (most of its size).
	tar -C "$toolchain" --exclude=./share/doc -cf - . | tar -C "$work/rust/rustup/toolchains/$name" -xf -
	printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$name" >"$work/rust/rustup/settings.toml"
	cp "$(command -v rustup)" "$work/rust/cargo/bin/rustup"
	for tool in cargo rustc rustdoc rust-gdb rust-lldb cargo-clippy clippy-driver rustfmt cargo-fmt; do
		ln -s rustup "$work/rust/cargo/bin/$tool"
	done
	cat >"$work/rust/Containerfile" <<CONTAINERFILE
FROM $DEBIAN_IMAGE
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev \\
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:\$PATH RUST_VERSION=$version
COPY rustup /usr/local/rustup
COPY cargo /usr/local/cargo
CONTAINERFILE
	engine_build -q -t "$RUST_IMAGE" "$work/rust" >/dev/null
}

have "$DEBIAN_IMAGE" || make_debian
have "$RUST_IMAGE" || make_rust
