# The prefixlog binary. Build: docker build -t prefixlog .   (see docs/deploy.md)
# Needs BuildKit (the default builder since Docker 23; `docker compose` always uses it) for the
# cache mounts below. Without a registry, Dockerfile.local builds the same runtime image from a
# host-built binary on a local Debian base (scripts/build-images.sh).
# Builder: the Rust toolchain plus what RocksDB's bindgen and librdkafka's build need
# (the same packages as scripts/ensure-deps.sh; protobuf is compiled by the pure-Rust protox).
FROM rust:1-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends libclang-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Dependency cache: the cargo registry and the target directory persist across builds in
# BuildKit cache mounts, so a source change recompiles the workspace crates only, not RocksDB and
# librdkafka (~15 min of a clean build on 2 cores). The binary is copied out of the cache mount.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p prefixlog \
    && install -m 0755 target/release/prefixlog /usr/local/bin/prefixlog

# Runtime: RocksDB and librdkafka are linked statically; only libc, libstdc++ and zlib are needed.
# tini runs as PID 1: it forwards signals to prefixlog and reaps zombies.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates zlib1g tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --home-dir /var/lib/prefixlog --create-home prefixlog \
    && install -d -o 10001 -g 10001 /var/lib/prefixlog/data
COPY --from=build /usr/local/bin/prefixlog /usr/local/bin/prefixlog
USER 10001:10001
WORKDIR /var/lib/prefixlog
# Owned by the runtime user, so a fresh named volume mounted here is writable.
VOLUME /var/lib/prefixlog/data
# gRPC queries, replica-to-replica (anti-entropy, checkpoint transfer), admin HTTP (/metrics, /readyz).
EXPOSE 50151 50152 9151
# `serve` stops cleanly on SIGTERM or SIGINT: in-flight queries finish, a final checkpoint is
# written (prefixlog/tests/sigterm.rs). tini forwards the signal.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "prefixlog"]
CMD ["--help"]
