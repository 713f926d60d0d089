#!/usr/bin/env bash
# Installs the system packages the build needs, if missing (Debian/Ubuntu; root or sudo).
#   libclang-dev     bindgen for RocksDB's bindings
#   build-essential  C/C++ toolchain and make for the bundled RocksDB and librdkafka
#   pkg-config       librdkafka's configure (finds OpenSSL)
#   libssl-dev       librdkafka's TLS and SASL SCRAM / OAUTHBEARER (rdkafka's `ssl` feature)
#   openssl          the CLI: the secured-broker tests make their certificates with it
#   python3-venv     the Python client's tests
# protoc is not needed: proto/build.rs compiles .proto files with the pure-Rust protox.
set -euo pipefail
need=()
for p in libclang-dev build-essential pkg-config libssl-dev openssl python3-venv; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  echo "==> installing system packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "error: cargo not found. Install a Rust toolchain (>= 1.85, e.g. with rustup) and re-run." >&2
  exit 1
fi
