#!/usr/bin/env bash
# Side-by-side comparison with the published peers (smg-radix-tree, dynamo-kv-router) on the
# trace workload. Own workspace and target dir: the main build never compiles the peers.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT/bench/peers"
bash "$PREFIXLOG_ROOT/scripts/ensure-deps.sh"
CARGO_TARGET_DIR="$HOME/.cache/prefixlog/peers-target" cargo run --release -- --trace "$PREFIXLOG_TRACE" "$@"
