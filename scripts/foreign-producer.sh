#!/usr/bin/env bash
# Python for the foreign-producer test (tests/tests/foreign_producer.rs): kafka-python, a Kafka
# client independent of librdkafka, with its lz4 and zstd codecs, in the shared venv (created
# only if missing; bridge-fixtures.sh and python/run_tests.sh add their packages to the same one).
#   scripts/foreign-producer.sh     install (idempotent; quick when already installed)
set -euo pipefail
source "$(dirname "$0")/env.sh"
VENV="${PREFIXLOG_VENV:-$HOME/.cache/prefixlog/venv}"
[ -x "$VENV/bin/python" ] || { echo "==> python venv: $VENV"; python3 -m venv "$VENV"; }
if ! "$VENV/bin/python" -c 'import kafka.codec as c; assert c.has_lz4() and c.has_zstd()' 2>/dev/null; then
  echo "==> installing kafka-python lz4 zstandard into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "kafka-python>=2.2,<3" "lz4>=4,<5" "zstandard>=0.22,<1"
fi
