# The prefixlog binary. Build: docker build -t prefixlog .   (see docs/deploy.md)
# Without a registry, Dockerfile.local builds the same runtime image from a host-built binary on
# a local Debian base (scripts/build-images.sh).
#
# Stages: `chef` (the Rust toolchain, what RocksDB's bindgen and librdkafka's build need — the
# packages of scripts/ensure-deps.sh; protobuf is compiled by the pure-Rust protox — and
# cargo-chef), `planner` (the recipe: every manifest and Cargo.lock, no source), `build` (the
# dependencies cooked from the recipe alone, then the workspace), and the runtime.
#
# The dependency layer (`cargo chef cook`) is an ordinary image layer keyed by the recipe: a
# change to the source reuses it and recompiles the workspace crates only, not RocksDB and
# librdkafka (~15 min of a clean build on 2 cores). Ephemeral CI builders get it from their
# build cache, e.g. `docker buildx build --cache-from type=registry,ref=REPO:buildcache
# --cache-to type=registry,ref=REPO:buildcache,mode=max .` (mode=max also exports the build
# stages' layers) or `type=gha` on GitHub Actions; no BuildKit cache mount is needed.
FROM rust:1-bookworm AS chef
RUN apt-get update \
    && apt-get install -y --no-install-recommends libclang-dev pkg-config libssl-dev \
    && rm -rf /var/lib/apt/lists/* \
    && cargo install cargo-chef --locked --version 0.1.78
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --locked -p prefixlog --recipe-path recipe.json
COPY . .
RUN cargo build --release --locked -p prefixlog \
    && install -m 0755 target/release/prefixlog /usr/local/bin/prefixlog

# Runtime: RocksDB, librdkafka and zstd are linked statically; the binary needs libc, libstdc++,
# zlib and OpenSSL 3 (libssl3: Kafka TLS and SASL SCRAM). prefixlog/tests/image_libraries.rs
# checks this list against the binary's own dependencies. ca-certificates: public CAs for
# brokers such as MSK and Confluent Cloud. tini runs as PID 1: it forwards signals to
# prefixlog and reaps zombies.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libstdc++6 zlib1g libssl3 tini \
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
