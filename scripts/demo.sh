#!/usr/bin/env bash
# The main job: `prefixlog-lab demo` (embedded broker, two replicas, gateways routing a simulated
# fleet over gRPC) on the bundled Mooncake trace. Extra arguments go to the demo, e.g.
# `bash scripts/demo.sh --requests 12031 --gateways 8`. The engine benchmark: `make bench-engine`.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
bash scripts/ensure-deps.sh
cargo build --release -p prefixlog-lab
"$CARGO_TARGET_DIR/release/prefixlog-lab" demo --trace "$PREFIXLOG_TRACE" "$@"
