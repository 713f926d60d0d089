# The prefixlog binary. Build: docker build -t prefixlog .   (see README "docker compose")
# Builder: the Rust toolchain plus what RocksDB's bindgen and librdkafka's build need
# (the same packages as scripts/ensure-deps.sh; protobuf is compiled by the pure-Rust protox).
FROM rust:1-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends libclang-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p prefixlog \
    && install -m 0755 target/release/prefixlog /usr/local/bin/prefixlog

# Runtime: RocksDB and librdkafka are linked statically; only libc, libstdc++ and zlib are needed.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates zlib1g \
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
ENTRYPOINT ["prefixlog"]
CMD ["--help"]
