#!/usr/bin/env bash
# Python for the engine-bridge tests: pyzmq + msgpack (+ msgspec for a self-check that the
# stand-in publisher's bytes equal vLLM's encoder's) in the shared venv (created only if
# missing; python/run_tests.sh adds its own packages to the same venv).
#   scripts/bridge-fixtures.sh          install (idempotent; quick when already installed)
#   scripts/bridge-fixtures.sh --regen  also rewrite bridge/tests/fixtures/*.msgpack
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
VENV="${PREFIXLOG_VENV:-$HOME/.cache/prefixlog/venv}"
[ -x "$VENV/bin/python" ] || { echo "==> python venv: $VENV"; python3 -m venv "$VENV"; }
# msgspec (vLLM's own encoder) only for the self-check that our bytes equal vLLM's.
if ! "$VENV/bin/python" -c 'import zmq, msgpack, msgspec' 2>/dev/null; then
  echo "==> installing pyzmq msgpack msgspec into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "pyzmq>=26,<28" "msgpack>=1,<2" "msgspec>=0.18,<0.24"
fi
"$VENV/bin/python" python/bridge_fixtures/publisher.py selfcheck
if [ "${1:-}" = "--regen" ]; then
  "$VENV/bin/python" python/bridge_fixtures/publisher.py fixtures bridge/tests/fixtures
fi
