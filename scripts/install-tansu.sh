#!/usr/bin/env bash
# Installs tansu 0.6.0, an independent Apache-2.0 Kafka-compatible broker in Rust, once per
# machine into ~/.cache/prefixlog/tools (~18 min on 2 cores) and prints the binary's path: the
# one install that scripts/with-tansu.sh and scripts/build-images.sh share.
# Features: libsql for sqlite:// storage (the tests, the stack, the benchmarks), dynostore for
# memory:// (tried for bench-audit, see the README's Audit benchmark).
set -euo pipefail
source "$(dirname "$0")/env.sh"
TOOLS="$HOME/.cache/prefixlog/tools"
TANSU="$TOOLS/bin/tansu"
if [ ! -x "$TANSU" ]; then
  echo "==> installing tansu 0.6.0 into $TOOLS (once per machine, ~18 min)" >&2
  cargo install tansu --version 0.6.0 --locked --features dynostore,libsql --root "$TOOLS" \
    --target-dir "$HOME/.cache/prefixlog/tansu-target" >&2
fi
echo "$TANSU"
