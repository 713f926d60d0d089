#!/usr/bin/env bash
# The upstream leg: other projects' released code, installed from the package registry
# (tests/upstream/pins.txt), driving prefixlog's bridge and facades. Part of `make test`.
#   bash tests/upstream/run.sh [pytest args]
# PREFIXLOG_BIN=/path/to/prefixlog skips the cargo build.
set -euo pipefail
source "$(dirname "$0")/../../scripts/env.sh"
cd "$PREFIXLOG_ROOT"
PY="$(bash tests/upstream/venv.sh)"
if [ -z "${PREFIXLOG_BIN:-}" ]; then
  cargo build -q -p prefixlog
  export PREFIXLOG_BIN="$CARGO_TARGET_DIR/debug/prefixlog"
fi
echo "==> upstream leg: $(grep -E '^[a-z].*==' tests/upstream/pins.txt | grep -E 'vllm|sglang|lmcache|dynamo|xds|smg' | sed 's/ *#.*//' | tr '\n' ' ')"
cd tests/upstream
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
