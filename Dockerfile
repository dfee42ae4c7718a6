# syntax=docker/dockerfile:1
# The server in a container (docs/deploy.md, "Packages"):
#
#   docker build -t synkronus .
#   docker run -p 8080:8080 -v synkronus:/var/lib/synkronus synkronus
#
# serves on its embedded PostgreSQL with no setting: the database, the files and a JWT secret
# generated on first start all live in the volume. Every variable of the README's table works as an
# environment variable (-e DB_CONNECTION=…, -e STORAGE_URL=…). Operator commands run the same
# binary: `docker exec CONTAINER synkronus user create …`, or `docker run --rm -v
# synkronus:/var/lib/synkronus synkronus migrate` with the server stopped.
# `make image` builds it with the version, commit and source labels filled in.

ARG RUST_VERSION=1.95
ARG PG_MAJOR=15

# What the dependency build depends on and nothing else: the manifests without their
# [package.metadata.*] tables and with the server's own version set aside, so that neither a
# packaging change nor a version bump invalidates the dependency layer (cargo-chef's idea).
FROM rust:${RUST_VERSION}-slim-bookworm AS recipe
WORKDIR /build
COPY Cargo.toml Cargo.lock ./
COPY load-tests/Cargo.toml load-tests/Cargo.toml
RUN awk '/^\[/ { skip = ($0 ~ /^\[package\.metadata/) } !skip' Cargo.toml > Cargo.toml.new \
    && mv Cargo.toml.new Cargo.toml \
    && sed -i '0,/^version = /s/^version = .*/version = "0.0.0"/' Cargo.toml \
    && sed -i '/^name = "synkronus"$/{n;s/^version = .*/version = "0.0.0"/}' Cargo.lock

FROM rust:${RUST_VERSION}-slim-bookworm AS builder
WORKDIR /build
# The dependencies first, in a layer of their own: the recipe with empty sources, so that a change
# to the server's code reuses this layer and recompiles only the server itself.
COPY --from=recipe /build/ ./
RUN mkdir -p src load-tests/src \
    && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && echo 'fn main() {}' > load-tests/src/main.rs && echo 'fn main() {}' > build.rs \
    && cargo build --release --locked --bin synkronus \
    && rm -rf src build.rs target/release/.fingerprint/synkronus-* target/release/build/synkronus-* \
        target/release/deps/synkronus-* target/release/deps/libsynkronus-*
COPY Cargo.toml Cargo.lock build.rs ./
COPY migrations migrations
COPY portal portal
COPY src src
# The commit `GET /version` and `synkronus --version` report (the build has no .git to ask).
# Installed without its symbol table (-s: 10 MB of the 46), as Debian's packages are.
ARG REVISION=unknown
RUN SYNKRONUS_GIT_COMMIT=${REVISION} cargo build --release --locked --bin synkronus \
    && install -s -m 0755 target/release/synkronus /usr/local/bin/synkronus

FROM debian:bookworm-slim
ARG PG_MAJOR
# Debian's PostgreSQL server, without its JIT: postgresql-15 depends on LLVM (libllvm14, ~100 MB)
# only for JIT compilation, which the server turns off on every connection (jit=off: its queries
# are short and index-driven, and exports run without it). So the package's files are unpacked
# here without the JIT provider (llvmjit.so) and its bitcode, with the shared libraries the
# remaining binaries link against installed from Debian as usual; PostgreSQL runs without JIT when
# its provider is absent. `ldd` proves nothing is missing. Also: tini as PID 1 (forwards SIGTERM
# to the server and reaps what PostgreSQL leaves; not its static twin) and tzdata (PostgreSQL's
# time zones). Left out: PostgreSQL's benchmark and test tools.
RUN set -eux; \
    apt-get update; \
    cd /tmp; \
    apt-get download "postgresql-${PG_MAJOR}"; \
    libs=$(dpkg-deb -f postgresql-"${PG_MAJOR}"_*.deb Depends | tr ',' '\n' \
        | sed -e 's/([^)]*)//g' -e 's/|.*//' -e 's/ //g' | grep '^lib' | grep -v '^libllvm'); \
    echo 'path-exclude=/usr/bin/tini-static' > /etc/dpkg/dpkg.cfg.d/synkronus; \
    apt-get install -y --no-install-recommends tini tzdata $libs; \
    dpkg-deb --fsys-tarfile postgresql-"${PG_MAJOR}"_*.deb | tar -x -C / \
        --exclude='*/lib/bitcode' --exclude='*/lib/llvmjit*' --exclude='*/bin/pgbench' \
        --exclude='*/bin/pg_test_*' --exclude='*/bin/oid2name' --exclude='*/bin/vacuumlo' \
        ./usr/lib/postgresql ./usr/share/postgresql; \
    rm -f /tmp/*.deb; \
    rm -rf /var/lib/apt/lists/*; \
    if ldd /usr/lib/postgresql/"${PG_MAJOR}"/bin/* /usr/lib/postgresql/"${PG_MAJOR}"/lib/*.so | grep 'not found'; then exit 1; fi; \
    /usr/lib/postgresql/"${PG_MAJOR}"/bin/postgres --version
# A fixed non-root uid (Kubernetes' runAsNonRoot checks a numeric USER); the embedded cluster runs
# as this user too, so PG_RUN_AS is not needed. The volume's folder belongs to it, and a new named
# volume takes that ownership.
RUN groupadd --gid 10001 synkronus \
    && useradd --uid 10001 --gid synkronus --no-create-home --home-dir /var/lib/synkronus --shell /usr/sbin/nologin synkronus \
    && install -d -m 0700 -o synkronus -g synkronus /var/lib/synkronus
# The CA certificates of S3 and PostgreSQL TLS connections: the bundle alone (Debian's
# ca-certificates package would bring the openssl program, 2.3 MB, along).
COPY --from=builder /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=builder /usr/local/bin/synkronus /usr/bin/synkronus
ENV DATA_ROOT=/var/lib/synkronus \
    PG_BIN_DIR=/usr/lib/postgresql/${PG_MAJOR}/bin
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="Synkronus" \
      org.opencontainers.image.description="Offline-first sync server for mobile data collection (Synkronus-compatible)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="MIT"
USER 10001:10001
WORKDIR /var/lib/synkronus
VOLUME /var/lib/synkronus
EXPOSE 8080
# GET /health on the configured port: 200 while the database answers. The first start runs initdb.
HEALTHCHECK --interval=30s --timeout=10s --start-period=2m --retries=3 CMD ["synkronus", "healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--", "synkronus"]
CMD ["serve"]
