# Two entry points: `make run` and `make test`. Both work on a fresh Debian machine as root.
SHELL := /bin/bash
CARGO ?= cargo
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
export CARGO_TARGET_DIR := $(TARGET_DIR)
TEST_PG_DIR ?= /tmp/synkronus-test-pg

.PHONY: run cluster nginx-dep test deps test-deps build release stop-test-cluster portal-test api-fuzz deny scope-soak \
	image-deps image image-test deb dist

## Installs PostgreSQL when it is missing: the server runs a private cluster with its binaries.
deps:
	@if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		echo "installing PostgreSQL (apt-get)"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql; \
	fi

## nginx, the load balancer of the cluster test and of `make cluster`.
nginx-dep:
	@if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then \
		echo "installing nginx (apt-get)"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx; \
	fi

## What the tests need besides: Chromium, its driver, Node.js and the browser tests' npm packages,
## nginx (the cluster test's load balancer), and moto's S3-compatible server (the storage and
## cluster tests start it on loopback).
test-deps: deps nginx-dep
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1 \
		|| ! command -v npm >/dev/null 2>&1; then \
		echo "installing Chromium and Node.js (apt-get)"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
			chromium chromium-driver $$(command -v npm >/dev/null 2>&1 || echo nodejs npm); \
	fi
	@if [ ! -d portal-tests/node_modules/playwright-core ]; then \
		cd portal-tests && npm ci --no-audit --no-fund; \
	fi
	@if ! command -v moto_server >/dev/null 2>&1; then \
		echo "installing moto's S3 server (pip) for the storage tests"; \
		python3 -m pip install --quiet 'moto[server]>=5.0.15'; \
	fi

## The nodes of `make cluster` share one JWT secret; generate it once, kept in .env (never
## committed). A single server on its embedded database generates its own (DATA_ROOT/jwt-secret).
.env:
	@if [ -z "$$JWT_SECRET" ]; then \
		echo "JWT_SECRET=$$(head -c 48 /dev/urandom | base64 | tr -d '\n/+=')" > .env; \
		echo "generated a JWT_SECRET in .env"; \
	else touch .env; fi

release:
	$(CARGO) build --release --bin synkronus

## Builds and starts the server on its embedded database (DATA_ROOT=./data, port 8080).
run: deps release
	$(TARGET_DIR)/release/synkronus serve

## Three nodes on one PostgreSQL behind nginx on :8080 (scripts/cluster.sh, docs/deploy.md), files
## under ./data/cluster (CLUSTER_STORAGE=moto: in a bucket of moto's server); Ctrl-C stops them all.
cluster: deps nginx-dep .env release
	scripts/cluster.sh $(TARGET_DIR)/release/synkronus

## Everything the tests need, then all tests (unit + black-box against a real PostgreSQL), then the
## portal in a headless browser and the schemathesis run. Both use the server binary `cargo test`
## has just built for the black-box tests (a separate `cargo build` would resolve other features
## and rebuild half the dependency tree). Then the packages (make image-test).
test: test-deps image-deps
	$(CARGO) test --workspace -- --test-threads=4; status=$$?; $(MAKE) --no-print-directory stop-test-cluster; \
	portal-tests/run.sh $(TARGET_DIR)/debug/synkronus || status=1; \
	scripts/schemathesis.sh $(TARGET_DIR)/debug/synkronus || status=1; \
	tests/packaging/run-all.sh || status=1; exit $$status

## What the package tests need (docs/deploy.md, "Packages"): a container engine (podman and its
## networking from Debian where no docker daemon answers), mmdebstrap (base images made locally),
## podman-compose, dpkg-dev and cargo-deb (the .deb), kubernetes-validate (the Kubernetes schemas).
IMAGE_APT_PACKAGES := mmdebstrap dpkg-dev
PODMAN_APT_PACKAGES := podman runc netavark aardvark-dns iptables podman-compose
image-deps:
	@pkgs="$(IMAGE_APT_PACKAGES)"; \
	if ! (command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1); then pkgs="$$pkgs $(PODMAN_APT_PACKAGES)"; fi; \
	missing=$$(for p in $$pkgs; do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing (apt-get)"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi
	@command -v cargo-deb >/dev/null 2>&1 || $(CARGO) install cargo-deb --version 3.6.4 --locked
	@command -v kubernetes-validate >/dev/null 2>&1 || python3 -m pip install --quiet 'kubernetes-validate==1.37.0'

## The container image from the Dockerfile, tagged synkronus:<version> and synkronus:latest (base
## images made locally where no registry serves them: scripts/images/base-images.sh).
image: image-deps
	scripts/images/build.sh

## Every package end to end: the image, the compose files, the .deb, the archive, Kubernetes.
image-test: image-deps
	tests/packaging/run-all.sh

## dist/synkronus_<version>-1_<arch>.deb (cargo-deb). BINARY=path packages that binary instead.
deb: image-deps $(if $(BINARY),,release)
	scripts/package/deb.sh $(or $(BINARY),$(TARGET_DIR)/release/synkronus)

## dist/synkronus-<version>-<arch>-linux.tar.gz and its .sha256. BINARY=path as for deb.
dist: $(if $(BINARY),,release)
	scripts/package/dist.sh $(or $(BINARY),$(TARGET_DIR)/release/synkronus)

## Browser tests of the portal: builds the server, runs it on a temporary embedded database and a
## free port, drives it with headless Chromium (portal-tests/), then stops it. Screenshots land in
## docs/screenshots/.
portal-test: test-deps
	$(CARGO) build --bin synkronus
	portal-tests/run.sh $(TARGET_DIR)/debug/synkronus

## Property-based API test (schemathesis from PyPI) against the real server and its OpenAPI document.
api-fuzz: test-deps
	$(CARGO) build --bin synkronus
	scripts/schemathesis.sh $(TARGET_DIR)/debug/synkronus

## The scoped-sync soak (docs/api.md §20.5; not part of `make test`): the model of
## tests/api/scope_model.rs for SCOPE_SOAK_MINUTES (default 30) against two server processes on one
## PostgreSQL and its hot-standby read replica; prints a summary each minute and at the end, and
## fails on any violation. SCOPE_MODEL_SEED picks another seed.
SCOPE_SOAK_MINUTES ?= 30
scope-soak: deps
	SCOPE_SOAK_MINUTES=$(SCOPE_SOAK_MINUTES) $(CARGO) test --test api -- \
		scope_model::soak_two_nodes_and_a_read_replica --exact --ignored --nocapture

stop-test-cluster:
	@pg_ctl=$$(command -v pg_ctl || ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -n 1); \
	if [ -n "$$pg_ctl" ] && [ -f "$(TEST_PG_DIR)/postmaster.pid" ]; then \
		if [ "$$(id -u)" = 0 ]; then runuser -u postgres -- "$$pg_ctl" -D "$(TEST_PG_DIR)" -m fast -w stop >/dev/null; \
		else "$$pg_ctl" -D "$(TEST_PG_DIR)" -m fast -w stop >/dev/null; fi; \
	fi; true

## Dependency policy (deny.toml): licences, bans and sources always; known vulnerabilities when
## the RustSec advisory database can be fetched (it lives on GitHub, which not every machine reaches).
deny:
	@command -v cargo-deny >/dev/null 2>&1 || $(CARGO) install cargo-deny --locked
	$(CARGO) deny check licenses bans sources
	@if timeout 180 $(CARGO) deny fetch db >/dev/null 2>&1; then $(CARGO) deny check --disable-fetch advisories; \
	else echo "cargo deny: WARNING: the advisory database could not be fetched; advisories were NOT checked"; fi
