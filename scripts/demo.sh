#!/usr/bin/env bash
# The main job. Until the demo lands this runs the engine benchmark on the bundled trace.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
bash scripts/ensure-deps.sh
cargo run --release -p prefixlog-engine --example engine-bench -- --trace "$PREFIXLOG_TRACE" "$@"
