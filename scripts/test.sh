#!/usr/bin/env bash
# The full test suite: what `make test` and .ci/run run.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
bash scripts/ensure-deps.sh
start=$(date +%s)
echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy (workspace, all targets, -D warnings)"
cargo clippy --workspace --all-targets -- -D warnings
echo "==> cargo test (workspace)"
cargo test --workspace
echo "==> test suite finished in $(( $(date +%s) - start ))s"
