# Sourced by the image scripts: which container engine to drive, and the flags this machine needs.
#
#   CONTAINER_ENGINE        docker or podman. Default: docker when its daemon answers, else podman.
#   CONTAINER_GLOBAL_FLAGS  flags before the subcommand (podman: `--runtime runc
#                           --cgroup-manager=cgroupfs` where crun refuses the host's cgroups).
#   CONTAINER_RUN_FLAGS     extra flags of every `run`/`create` (`--ulimit nofile=…:…`, …).
#   CONTAINER_BUILD_FLAGS   extra flags of every `build` (`--network host` where no bridge works).
#
# With podman and none of these set, the defaults below are the ones that work on a machine whose
# podman has no bridge network plugins and whose cgroups are hybrid (the project's CI machines);
# set the variables (even to "") to override them. Docker gets no extra flags by default.

if [ -z "${CONTAINER_ENGINE:-}" ]; then
	if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
		CONTAINER_ENGINE=docker
	elif command -v podman >/dev/null 2>&1; then
		CONTAINER_ENGINE=podman
	else
		echo "images: neither a docker daemon nor podman (make image-deps installs podman)" >&2
		exit 1
	fi
fi
if [ "$CONTAINER_ENGINE" = podman ]; then
	# netavark: container networks with DNS between containers (compose), no CNI plugins needed.
	: "${CONTAINER_GLOBAL_FLAGS=--runtime runc --cgroup-manager=cgroupfs --network-backend netavark}"
	# runc sets the limits explicitly, and may not raise them past the engine's own: this shell's
	# hard limits, processes capped at 32768 (a higher one was refused here though allowed).
	nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
	[ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
	[ "$nofile" = unlimited ] && nofile=1048576
	ulimits="--ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc"
	: "${CONTAINER_RUN_FLAGS=$ulimits}"
	# --format docker: the OCI format has no HEALTHCHECK, and podman would drop the Dockerfile's.
	: "${CONTAINER_BUILD_FLAGS=--format docker --network host $ulimits}"
fi
export CONTAINER_ENGINE CONTAINER_GLOBAL_FLAGS CONTAINER_RUN_FLAGS CONTAINER_BUILD_FLAGS

# The engine with its global flags: `engine images`, `engine rm -f x`, …
engine() {
	# shellcheck disable=SC2086
	"$CONTAINER_ENGINE" ${CONTAINER_GLOBAL_FLAGS:-} "$@"
}

engine_run() {
	# shellcheck disable=SC2086
	engine run ${CONTAINER_RUN_FLAGS:-} "$@"
}

engine_build() {
	# shellcheck disable=SC2086
	engine build ${CONTAINER_BUILD_FLAGS:-} "$@"
}

image_exists() {
	engine image inspect "$1" >/dev/null 2>&1
}
