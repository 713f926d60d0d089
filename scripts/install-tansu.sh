#!/usr/bin/env bash
# Installs tansu 0.6.0, an independent Apache-2.0 Kafka-compatible broker in Rust, once per
# machine into ~/.cache/prefixlog/tools (~18 min on 2 cores) and prints the binary's path.
# The one install that scripts/with-tansu.sh and scripts/build-images.sh share. Storage engines:
#   libsql    sqlite://PATH: the tests, the stack and most benchmarks (keeps the log on disk)
#   slatedb   slatedb://memory: a log-structured store whose fetch reads only the records it
#             returns (SQLite's fetch scans to the high watermark); bench-audit's second broker
# A marker file records the features installed, so an older install without slatedb is redone.
set -euo pipefail
source "$(dirname "$0")/env.sh"
TOOLS="$HOME/.cache/prefixlog/tools"
TANSU="$TOOLS/bin/tansu"
FEATURES="dynostore,libsql,tansu-storage/slatedb"
MARKER="$TOOLS/tansu.features"
if [ ! -x "$TANSU" ] || [ "$(cat "$MARKER" 2>/dev/null)" != "$FEATURES" ]; then
  echo "==> installing tansu 0.6.0 ($FEATURES) into $TOOLS (once per machine, ~18 min)" >&2
  cargo install tansu --version 0.6.0 --locked --force --features "$FEATURES" --root "$TOOLS" \
    --target-dir "$HOME/.cache/prefixlog/tansu-target" >&2
  echo "$FEATURES" > "$MARKER"
fi
echo "$TANSU"
