#!/usr/bin/env bash
# Runs a command against tansu, an independent Kafka-compatible broker (issue 10):
#   scripts/with-tansu.sh [command...]     (default: the cross-crate integration tests)
# Installs tansu once per machine (scripts/install-tansu.sh, ~18 min on 2 cores), starts it on a
# free loopback port with SQLite storage in a temporary directory, exports PREFIXLOG_TEST_KAFKA
# (the test fixture's external backend) and PREFIXLOG_TANSU_BIN, runs the command, and stops
# tansu and removes its data — also when the command fails.
# `make test` runs the whole cross-crate suite through it (scripts/test.sh).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
TANSU="$(bash scripts/install-tansu.sh)"
# PREFIXLOG_TANSU_STORAGE: sqlite (default: the log on disk) or memory (tansu's object-store
# engine in memory; bench-audit was measured on both, see docs/testing.md, "Kafka backends").
case "${PREFIXLOG_TANSU_STORAGE:-sqlite}" in
  sqlite) STORAGE="sqlite://tansu.db" ;;
  memory) STORAGE="memory://tansu/" ;;
  *) echo "PREFIXLOG_TANSU_STORAGE must be sqlite or memory, not ${PREFIXLOG_TANSU_STORAGE}" >&2; exit 2 ;;
esac
DATA="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# tansu resolves sqlite:// paths against its working directory.
(cd "$DATA" && exec "$TANSU" broker --listener-url "tcp://127.0.0.1:$PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$PORT" --storage-engine "$STORAGE" \
  > "$DATA/broker.log" 2>&1) &
PID=$!
cleanup() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
# Up to 60 s: CI is a loaded 2-core machine. Fail loudly if tansu dies or never listens.
ready=0
for _ in $(seq 1 600); do
  if ! kill -0 "$PID" 2>/dev/null; then
    echo "tansu exited before listening on 127.0.0.1:$PORT; its log:" >&2
    cat "$DATA/broker.log" >&2 || true
    exit 1
  fi
  if (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then ready=1; break; fi
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "tansu did not listen on 127.0.0.1:$PORT within 60 s; its log:" >&2
  cat "$DATA/broker.log" >&2 || true
  exit 1
fi
echo "==> tansu on 127.0.0.1:$PORT ($STORAGE, data in $DATA)"
export PREFIXLOG_TEST_KAFKA="127.0.0.1:$PORT" PREFIXLOG_TANSU_BIN="$TANSU" PREFIXLOG_TANSU_PORT="$PORT"
if [ "$#" -eq 0 ]; then
  set -- cargo test -p prefixlog-tests -- --nocapture
fi
"$@"
