#!/usr/bin/env bash
# Makes the other images deploy/compose.cluster.yaml names, where no registry serves them, from
# Debian's packages on the local debian:bookworm-slim (base-images.sh), so that the unchanged
# compose file runs (make image-test):
#
#   postgres:15-bookworm     Debian's PostgreSQL 15, with the registry image's interface:
#                            POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, PGDATA
#                            (/var/lib/postgresql/data), pg_isready, port 5432
#   nginx:stable-bookworm    Debian's nginx; /etc/nginx/conf.d/*.conf, logs to the console
#   motoserver/moto:latest   moto's S3-compatible server from PyPI (moto[server] >= 5.0.15, which
#                            honours If-None-Match: * on PUT), on port 5000
#
# An image that is there is kept, one the registry serves is pulled (unless BASE_IMAGES_PULL=no);
# --force makes them again.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=engine.sh
source scripts/images/engine.sh

FORCE=${1:-}
scripts/images/base-images.sh
work=$(mktemp -d /var/tmp/synkronus-service-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

have() {
	if [ "$FORCE" != --force ] && image_exists "$1"; then return 0; fi
	if [ "$FORCE" != --force ] && [ "${BASE_IMAGES_PULL:-yes}" != no ] \
		&& timeout 120 engine pull -q "$1" >/dev/null 2>&1; then
		echo "service-images: pulled $1"
		return 0
	fi
	return 1
}

# build NAME: the Containerfile on standard input, files already in $work/NAME.
build() {
	mkdir -p "$work/$1"
	cat >"$work/$1/Containerfile"
	echo "service-images: making $2"
	engine_build -q -t "$2" "$work/$1" >/dev/null
}

if ! have docker.io/library/postgres:15-bookworm; then
	mkdir -p "$work/postgres"
	cat >"$work/postgres/entrypoint.sh" <<'SCRIPT'
#!/bin/bash
# The registry image's first start, in short: initdb with POSTGRES_USER and POSTGRES_PASSWORD
# (scram-sha-256 over TCP), POSTGRES_DB created, then postgres listening on every address.
set -euo pipefail
if [ "${1:-}" = postgres ]; then
	shift
	if [ ! -s "$PGDATA/PG_VERSION" ]; then
		: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
		user=${POSTGRES_USER:-postgres}
		printf '%s\n' "$POSTGRES_PASSWORD" >/tmp/pwfile
		initdb -D "$PGDATA" -U "$user" --pwfile=/tmp/pwfile --auth-local=trust --auth-host=scram-sha-256 >/dev/null
		rm -f /tmp/pwfile
		echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
		db=${POSTGRES_DB:-$user}
		if [ "$db" != postgres ]; then
			echo "CREATE DATABASE \"$db\" OWNER \"$user\";" | postgres --single -D "$PGDATA" postgres >/dev/null
		fi
	fi
	exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
SCRIPT
	chmod +x "$work/postgres/entrypoint.sh"
	build postgres docker.io/library/postgres:15-bookworm <<'CONTAINERFILE'
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-common \
    && sed -ri 's/#?(create_main_cluster) .*$/\1 = false/' /etc/postgresql-common/createcluster.conf \
    && apt-get install -y --no-install-recommends postgresql-15 && rm -rf /var/lib/apt/lists/* \
    && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data \
    && install -d -o postgres -g postgres /var/run/postgresql
COPY entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
VOLUME /var/lib/postgresql/data
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
CONTAINERFILE
fi

if ! have docker.io/library/nginx:stable-bookworm; then
	build nginx docker.io/library/nginx:stable-bookworm <<'CONTAINERFILE'
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends nginx-light && rm -rf /var/lib/apt/lists/* \
    && rm -f /etc/nginx/sites-enabled/default \
    && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
CONTAINERFILE
fi

if ! have docker.io/motoserver/moto:latest; then
	build moto docker.io/motoserver/moto:latest <<'CONTAINERFILE'
FROM debian:bookworm-slim
# PIP_CERT: pip's own certificate bundle lacks a local HTTPS proxy's authority; the system's has it.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/moto \
    && PIP_CERT=/etc/ssl/certs/ca-certificates.crt /opt/moto/bin/pip install --no-cache-dir 'moto[server]>=5.0.15'
ENV PATH=/opt/moto/bin:$PATH
EXPOSE 5000
ENTRYPOINT ["moto_server", "-H", "0.0.0.0"]
CONTAINERFILE
fi
