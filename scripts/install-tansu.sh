#!/usr/bin/env bash
# Installs tansu 0.6.0, an independent Apache-2.0 Kafka-compatible broker in Rust, once per
# machine into ~/.cache/prefixlog/tools (~18 min on 2 cores) and prints the binary's path: the
# one install that scripts/with-tansu.sh and scripts/build-images.sh share.
# Features: libsql for sqlite:// storage (the tests, the stack, the benchmarks), dynostore for
# memory:// (tried for bench-audit, see docs/testing.md, "Kafka backends").
# tansu-storage carries one patch, scripts/tansu/fetch-budget.patch: a SQLite fetch reads only the
# rows it returns (upstream scans to the high watermark on every fetch, which made a replay from
# the middle of a long log cost the rest of it). The crates come from crates.io, checked against
# the sha256 sums crates.io publishes; the build reuses the crate's own Cargo.lock.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
source "$HERE/env.sh"
TOOLS="$HOME/.cache/prefixlog/tools"
TANSU="$TOOLS/bin/tansu"
STAMP="$TOOLS/bin/tansu.build"
PATCH="$HERE/tansu/fetch-budget.patch"
FEATURES="dynostore,libsql"
WANT="tansu 0.6.0 features=$FEATURES patch=$(sha256sum < "$PATCH" | cut -c1-16)"

# name sha256: downloads one crate of version 0.6.0 into $SRC and unpacks it.
fetch_crate() {
  local file="$SRC/$1-0.6.0.crate"
  curl -fsSL --retry 3 "https://static.crates.io/crates/$1/$1-0.6.0.crate" -o "$file"
  echo "$2  $file" | sha256sum --check --quiet
  tar xzf "$file" -C "$SRC"
}

build_tansu() {
  SRC="$HOME/.cache/prefixlog/tansu-src"
  rm -rf "$SRC" && mkdir -p "$SRC"
  fetch_crate tansu 4fdd85473ec265140488cf8d55e82b844f5c051c8916fabdd4a71156ac053f6d
  fetch_crate tansu-storage 720d2ed8e6010c70f7f06e5af5a7274ebbf6e42fdcd9e46de542b10dc4d2f35d
  (cd "$SRC/tansu-storage-0.6.0" && git apply "$PATCH")
  printf '\n[workspace]\n\n[patch.crates-io]\ntansu-storage = { path = "../tansu-storage-0.6.0" }\n' \
    >> "$SRC/tansu-0.6.0/Cargo.toml"
  cargo build --release --bin tansu --features "$FEATURES" \
    --manifest-path "$SRC/tansu-0.6.0/Cargo.toml" \
    --target-dir "$HOME/.cache/prefixlog/tansu-target" >&2
  install -D "$HOME/.cache/prefixlog/tansu-target/release/tansu" "$TANSU"
  echo "$WANT" > "$STAMP"
}

if [ ! -x "$TANSU" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "==> installing $WANT into $TOOLS (once per machine, ~18 min)" >&2
  build_tansu
fi
echo "$TANSU"
