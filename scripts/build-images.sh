#!/usr/bin/env bash
# Builds the local container images (issue 18). No image registry is needed or used:
#
#   local/debian:bookworm  Debian 12 minbase from `debootstrap` + `docker import`, with tini,
#                          ca-certificates and the libraries prefixlog links (libstdc++6, zlib1g,
#                          libssl3; prefixlog/tests/image_libraries.rs keeps INCLUDE complete)
#                          (the base of the two images below)
#   local/tansu:0.6.0      the base + the tansu broker binary scripts/install-tansu.sh installs
#   prefixlog:local        Dockerfile.local: the base + a host-built prefixlog binary
#
#   scripts/build-images.sh [base|tansu|prefixlog|all]   (default: all; needs a running engine,
#                                                        see scripts/docker-engine.sh)
#
# Each image carries a label with the hash of its inputs (recipe, Dockerfile, base image id,
# binary) and is rebuilt only when that hash changes, so reruns take seconds. Binaries are
# copied from the host, so they link against the host's glibc: the base is the same Debian
# release as the host (checked with ldd inside the image).
# PREFIXLOG_BIN selects the prefixlog binary (default: $CARGO_TARGET_DIR/debug/prefixlog, built
# here with `cargo build -p prefixlog` when missing or stale).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
export DOCKER_BUILDKIT=0   # the classic builder: no buildx plugin, no frontend image to pull
CACHE="$HOME/.cache/prefixlog"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
BASE=local/debian:bookworm
SUITE=bookworm
INCLUDE=tini,ca-certificates,libstdc++6,zlib1g,libssl3
LABEL=org.prefixlog.inputs
TMPS=()
cleanup() { local d; for d in "${TMPS[@]}"; do $SUDO rm -rf "$d"; done; }
trap cleanup EXIT

# docker build, quiet unless it fails (newer clients also warn that the classic builder is
# deprecated on every run).
build() { local out; out=$(docker build -q "$@" 2>&1) || { echo "$out" >&2; echo "error: docker build $* failed" >&2; exit 1; }; }
inputs_of() { docker image inspect -f "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null || true; }
hash_of() { sha256sum | cut -c1-16; }

# The mirror apt uses on this machine (deb822 sources first, then sources.list).
mirror() {
  local m=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
    m=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ {print $2; exit}' /etc/apt/sources.list)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

build_base() {
  local want
  want=$(printf 'debootstrap --variant=minbase --include=%s %s\n' "$INCLUDE" "$SUITE" | hash_of)
  if [ "$(inputs_of "$BASE")" = "$want" ]; then echo "==> $BASE up to date"; return; fi
  if ! command -v debootstrap >/dev/null; then
    echo "==> installing debootstrap"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  local root m t0
  t0=$(date +%s)
  m=$(mirror)
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  TMPS+=("$root")
  echo "==> $BASE: debootstrap $SUITE from $m (once per machine, ~1 min; log: $CACHE/debootstrap.log)"
  if ! $SUDO debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$root" "$m" \
      >"$CACHE/debootstrap.log" 2>&1; then
    tail -20 "$CACHE/debootstrap.log" >&2
    echo "error: debootstrap failed (log: $CACHE/debootstrap.log)" >&2
    exit 1
  fi
  $SUDO rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/debootstrap
  # An intermediate tag, then a one-line build adds the label (`docker import` cannot).
  $SUDO tar -C "$root" -c . | docker import - "$BASE-import" >/dev/null
  printf 'FROM %s\nCMD ["bash"]\n' "$BASE-import" \
    | build --label "$LABEL=$want" -t "$BASE" -
  docker rmi "$BASE-import" >/dev/null
  echo "==> $BASE built in $(( $(date +%s) - t0 ))s ($(docker image inspect -f '{{.Size}}' "$BASE" | awk '{printf "%.0f MB", $1/1e6}'))"
}

# build_on_base IMAGE DOCKERFILE BINARY NAME_IN_CONTEXT
build_on_base() {
  local image=$1 dockerfile=$2 bin=$3 name=$4 want ctx
  [ -x "$bin" ] || { echo "error: $bin not found (needed for $image)" >&2; exit 1; }
  want=$( { docker image inspect -f '{{.Id}}' "$BASE"; sha256sum < "$dockerfile"; sha256sum < "$bin"; } | hash_of)
  if [ "$(inputs_of "$image")" = "$want" ]; then echo "==> $image up to date"; return; fi
  ctx=$(mktemp -d "$CACHE/image-ctx.XXXXXX")
  TMPS+=("$ctx")
  # Symbols are not needed in the image (the debug binary is mostly symbols).
  objcopy --strip-debug "$bin" "$ctx/$name" 2>/dev/null || cp "$bin" "$ctx/$name"
  build --label "$LABEL=$want" -f "$dockerfile" -t "$image" "$ctx"
  # The binary must run on the base: every shared library resolves (same glibc as the host).
  local missing
  missing=$(docker run --rm --network none --entrypoint ldd "$image" "/usr/local/bin/$name" | grep 'not found' || true)
  if [ -n "$missing" ]; then
    docker rmi "$image" >/dev/null
    echo "error: $name in $image misses shared libraries:" >&2
    echo "$missing" >&2
    exit 1
  fi
  echo "==> $image built ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}'))"
}

build_tansu() {
  local tansu
  tansu="$(bash scripts/install-tansu.sh)"
  build_on_base local/tansu:0.6.0 deploy/local/tansu.Dockerfile "$tansu" tansu
}

build_prefixlog() {
  local bin="${PREFIXLOG_BIN:-}"
  if [ -z "$bin" ]; then
    cargo build -q -p prefixlog
    bin="$CARGO_TARGET_DIR/debug/prefixlog"
  fi
  build_on_base prefixlog:local Dockerfile.local "$bin" prefixlog
}

docker info >/dev/null 2>&1 || { echo "error: no Docker engine answers (scripts/docker-engine.sh start)" >&2; exit 1; }
case "${1:-all}" in
  base) build_base ;;
  tansu) build_base; build_tansu ;;
  prefixlog) build_base; build_prefixlog ;;
  all) build_base; build_tansu; build_prefixlog ;;
  *) echo "usage: $0 [base|tansu|prefixlog|all]" >&2; exit 2 ;;
esac
