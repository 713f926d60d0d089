# tansu 0.6.0 (an Apache-2.0 Kafka-compatible broker in Rust) on the local Debian base, from the
# binary scripts/with-tansu.sh installs on the host. Built by scripts/build-images.sh; used by
# the testcontainers backend (tests/src/lib.rs) and deploy/compose.local.yml.
FROM local/debian:bookworm
COPY tansu /usr/local/bin/tansu
# Relative sqlite:// storage paths resolve here.
WORKDIR /var/lib/tansu
# tini as PID 1: signals reach tansu, zombies are reaped.
ENTRYPOINT ["/usr/bin/tini", "--", "tansu"]
CMD ["broker", "--help"]
