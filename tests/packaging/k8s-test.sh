#!/usr/bin/env bash
# deploy/kubernetes/, offline: rendered as kustomize does (k8s_render.py, which also checks probes,
# selectors, secret references and requests), then every resource validated strictly (unknown
# fields refused) against the Kubernetes API's JSON schemas of each version in K8S_VERSIONS, with
# kubernetes-validate (PyPI; the schemas ship inside the package).
set -euo pipefail
cd "$(dirname "$0")/../.."
TEST_NAME=k8s-test
passed=0
WORK=$(mktemp -d /var/tmp/synkronus-k8s-test.XXXXXX)
trap 'status=$?; rm -rf "$WORK"; echo "k8s-test: $passed passed, $((status != 0)) failed"; exit $status' EXIT

command -v kubernetes-validate >/dev/null || { echo "k8s-test: kubernetes-validate is missing (make image-deps)" >&2; exit 1; }
python3 tests/packaging/k8s_render.py deploy/kubernetes "$WORK/rendered.yaml"
passed=$((passed + 1))
echo "ok $passed - deploy/kubernetes renders; probes, selectors, secret and config references, requests"
for version in ${K8S_VERSIONS:-1.29.0 1.33.0 1.37.0}; do
	kubernetes-validate --strict --quiet -k "$version" "$WORK/rendered.yaml"
	passed=$((passed + 1))
	echo "ok $passed - every resource valid against the Kubernetes $version schemas (strict)"
done
