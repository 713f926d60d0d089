#!/usr/bin/env bash
# Python for the engine-bridge tests: pyzmq + msgpack in the shared venv (created only if
# missing; python/run_tests.sh adds its own packages to the same venv).
#   scripts/bridge-fixtures.sh          install (idempotent; quick when already installed)
#   scripts/bridge-fixtures.sh --regen  also rewrite ingest/tests/fixtures/*.msgpack
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
VENV="${PREFIXLOG_VENV:-$HOME/.cache/prefixlog/venv}"
[ -x "$VENV/bin/python" ] || { echo "==> python venv: $VENV"; python3 -m venv "$VENV"; }
if ! "$VENV/bin/python" -c 'import zmq, msgpack' 2>/dev/null; then
  echo "==> installing pyzmq msgpack into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check pyzmq msgpack
fi
if [ "${1:-}" = "--regen" ]; then
  "$VENV/bin/python" python/bridge_fixtures/publisher.py fixtures ingest/tests/fixtures
fi
