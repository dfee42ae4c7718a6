#!/usr/bin/env bash
# make image-test: every package, end to end, each step timed (CONTRIBUTING.md has the figures).
#
#   0. base-images.sh, service-images.sh (in the background) where no registry serves the images
#   1. image-test.sh    the Dockerfile built (its builder stage compiles the release binary) and run
#   2. compose-test.sh  deploy/compose.cluster.yaml and compose.yaml
#   3. deb-test.sh      the Debian package, with the image's binary
#   4. dist-test.sh     make dist's archive, with the image's binary
#   5. k8s-test.sh      deploy/kubernetes/ against the Kubernetes schemas
#
# The image's /usr/bin/synkronus is the release binary the Debian package and the archive are
# made from here, so the suite compiles the release build once, in the Dockerfile.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/images/engine.sh

status=0
summary=()
# A failure's summary line names its first cause (the first "FAILED:" line the step printed), so
# that the last lines of a CI log say what went wrong.
log=$(mktemp /var/tmp/synkronus-packages.XXXXXX)
trap 'rm -f "$log"' EXIT
run() {
	local name=$1 start cause
	shift
	start=$(date +%s)
	echo "== $name"
	# A group, in this shell: not a pipeline's subshell, since the service-images step waits for
	# this shell's child; and its redirection made here, so that `$!` is the tee.
	if { "$@"; } > >(tee "$log") 2>&1; then
		wait $! # tee, to the end of the step's output
		summary+=("$name: passed in $(($(date +%s) - start)) s")
	else
		wait $!
		status=1
		cause=$(grep -a -m 1 'FAILED: ' "$log" | cut -c 1-240 || true)
		summary+=("$name: FAILED after $(($(date +%s) - start)) s${cause:+ - $cause}")
		return 1
	fi
}

run base-images scripts/images/base-images.sh || true
# The compose file's images download while the image compiles (network against CPU).
scripts/images/service-images.sh >/var/tmp/synkronus-service-images.log 2>&1 &
service_images=$!
built=no
if run image-build scripts/images/build.sh; then
	built=yes
	run image-test env IMAGE=synkronus:latest tests/packaging/image-test.sh || true
fi
run service-images wait "$service_images" || cat /var/tmp/synkronus-service-images.log
if [ $built = yes ]; then
	bin_dir=$(mktemp -d /var/tmp/synkronus-image-binary.XXXXXX)
	trap 'rm -rf "$bin_dir" "$log"' EXIT
	id=$(engine create synkronus:latest)
	engine cp "$id:/usr/bin/synkronus" "$bin_dir/synkronus"
	engine rm -v "$id" >/dev/null
	run compose-test env IMAGE=synkronus:latest tests/packaging/compose-test.sh || true
	run deb-test tests/packaging/deb-test.sh "$bin_dir/synkronus" || true
	run dist-test tests/packaging/dist-test.sh "$bin_dir/synkronus" || true
else
	status=1
	summary+=("image-test, compose-test, deb-test, dist-test: not run (the image did not build)")
fi
run k8s-test tests/packaging/k8s-test.sh || true

echo "== packages"
printf '%s\n' "${summary[@]}"
failed=$(printf '%s\n' "${summary[@]}" | grep -c -v ': passed' || true)
echo "packages: $(printf '%s\n' "${summary[@]}" | grep -c ': passed') passed, $failed failed"
exit $status
