#!/usr/bin/env bash
# Runs a command against tansu, an independent Kafka-compatible broker (issue 10):
#   scripts/with-tansu.sh [command...]     (default: the cross-crate integration tests)
# Installs tansu once per machine into ~/.cache/prefixlog/tools (~18 min on 2 cores), starts it
# on a free loopback port with SQLite storage in a temporary directory, exports
# PREFIXLOG_TEST_KAFKA (the test fixture's external backend) and PREFIXLOG_TANSU_BIN, runs the
# command, and stops tansu and removes its data — also when the command fails.
# `make test` runs the whole cross-crate suite through it (scripts/test.sh).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
TOOLS="$HOME/.cache/prefixlog/tools"
TANSU="$TOOLS/bin/tansu"
if [ ! -x "$TANSU" ]; then
  echo "==> installing tansu 0.6.0 into $TOOLS (once per machine, ~18 min)"
  cargo install tansu --version 0.6.0 --locked --features dynostore,libsql --root "$TOOLS" \
    --target-dir "$HOME/.cache/prefixlog/tansu-target"
fi
DATA="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# tansu resolves sqlite:// paths against its working directory.
(cd "$DATA" && exec "$TANSU" broker --listener-url "tcp://127.0.0.1:$PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$PORT" --storage-engine "sqlite://tansu.db" \
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
echo "==> tansu on 127.0.0.1:$PORT (data in $DATA)"
export PREFIXLOG_TEST_KAFKA="127.0.0.1:$PORT" PREFIXLOG_TANSU_BIN="$TANSU" PREFIXLOG_TANSU_PORT="$PORT"
if [ "$#" -eq 0 ]; then
  set -- cargo test -p prefixlog-tests -- --nocapture
fi
"$@"
