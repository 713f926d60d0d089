#!/usr/bin/env bash
# The Python client's tests against a live replica:
#   1. a virtualenv under ~/.cache/prefixlog/venv with the package's [dev] extra (grpcio-tools
#      pinned for the stub check, pytest, grpcio health/reflection), rebuilt when
#      python/pyproject.toml changes;
#   2. the committed gRPC stubs checked against proto/ (fails with "stubs are stale" when a proto
#      changed without `python -m prefixlog_client.codegen`), the package installed into the venv;
#   3. `prefixlog serve` (debug build, or PREFIXLOG_BIN=/path/to/prefixlog to skip the cargo
#      build) on free ports with its embedded broker, a second replica of the same log serving
#      gRPC over mutual TLS (tests/fixtures/tls), two more owning one shard each
#      (`--shard 0/2`, `--shard 1/2`: the sharded fan-out's live test), the trace replayed with
#      `prefixlog publish-trace`, then pytest (which also installs the package into a fresh venv and
#      queries with it) over python/tests and examples/gateway (whose test starts a replica,
#      fake workers and the example gateway of its own); every server is killed on exit.
#      The venv also gets examples/gateway/requirements.txt (confluent-kafka).
#      The first replica also hosts SGLang's kv_indexer.v1.KVIndexer (--sgl-model):
#      test_sglang_facade.py calls it through stubs it generates from the upstream schema.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
cd "$PREFIXLOG_ROOT"
VENV="${PREFIXLOG_VENV:-$HOME/.cache/prefixlog/venv}"
PY="$VENV/bin/python"
# Reinstall the dependencies only when pyproject.toml changes (pip is slow to start on 2 cores).
REQS_KEY="sha256=$(cat python/pyproject.toml examples/gateway/requirements.txt | sha256sum | cut -d' ' -f1)"
if [ ! -x "$PY" ] || [ "$(cat "$VENV/.prefixlog-reqs" 2>/dev/null)" != "$REQS_KEY" ]; then
  echo "==> python venv: $VENV (prefixlog_client[dev], examples/gateway/requirements.txt)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "./python[dev]" -r examples/gateway/requirements.txt
  echo "$REQS_KEY" > "$VENV/.prefixlog-reqs"
fi
echo "==> checking the committed stubs against proto/"
(cd python && "$PY" -m prefixlog_client.codegen --check)
echo "==> installing prefixlog_client"
# setuptools builds in python/build and copies all of build/lib into the wheel, stale files
# from an earlier build included: start clean.
rm -rf python/build python/*.egg-info
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall --no-build-isolation ./python >/dev/null 2>&1 \
  || "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall ./python

if [ -n "${PREFIXLOG_BIN:-}" ]; then
  BIN="$PREFIXLOG_BIN"
  echo "==> using PREFIXLOG_BIN=$BIN (no cargo build)"
else
  cargo build -q -p prefixlog
  BIN="$CARGO_TARGET_DIR/debug/prefixlog"
fi
[ -x "$BIN" ] || { echo "prefixlog binary not found or not executable: $BIN" >&2; exit 1; }
# Every listener on a free port below the kernel's ephemeral range, all picked at once (none
# twice): scripts/free_ports.py says why.
# shellcheck disable=SC2207
PORTS=($("$PY" "$PREFIXLOG_ROOT/scripts/free_ports.py" 12))
free_port() { NEXT_PORT=${PORTS[0]}; PORTS=("${PORTS[@]:1}"); }
free_port; GRPC_PORT=$NEXT_PORT; free_port; ADMIN_PORT=$NEXT_PORT; free_port; PEER_PORT=$NEXT_PORT
LOG=$(mktemp /tmp/prefixlog-pytest.XXXXXX.log)
"$BIN" serve --partitions 4 --tick-interval 0 --ready-lag 0 --replica-id py-test \
  --sgl-model sgl-test --sgl-block-size 2 --allow-unauthenticated-writes --grpc-addr "127.0.0.1:$GRPC_PORT" --admin-addr "127.0.0.1:$ADMIN_PORT" \
  --peer-addr "127.0.0.1:$PEER_PORT" >"$LOG" 2>&1 &
SERVER=$!
TLS_SERVER=""
SHARD_SERVERS=""
# kill -CONT: the sharded live test leaves a replica stopped (SIGSTOP) or killed.
trap 'kill $SERVER $TLS_SERVER $SHARD_SERVERS 2>/dev/null || true; kill -CONT $SHARD_SERVERS 2>/dev/null || true;
      wait $SERVER $TLS_SERVER $SHARD_SERVERS 2>/dev/null || true' EXIT
BROKERS=""
for _ in $(seq 100); do
  BROKERS=$(grep -o 'bootstrap=[0-9.:]*' "$LOG" | head -1 | cut -d= -f2 || true)
  [ -n "$BROKERS" ] && break
  kill -0 $SERVER 2>/dev/null || { cat "$LOG"; echo "prefixlog serve exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$BROKERS" ] || { cat "$LOG"; echo "no broker address in the serve log" >&2; exit 1; }
TLS_DIR="$PREFIXLOG_ROOT/tests/fixtures/tls"
free_port; TLS_GRPC_PORT=$NEXT_PORT; free_port; TLS_ADMIN_PORT=$NEXT_PORT; free_port; TLS_PEER_PORT=$NEXT_PORT
TLS_LOG=$(mktemp /tmp/prefixlog-pytest-tls.XXXXXX.log)
"$BIN" serve --brokers "$BROKERS" --partitions 4 --tick-interval 0 --ready-lag 0 --replica-id py-tls \
  --grpc-addr "127.0.0.1:$TLS_GRPC_PORT" --admin-addr "127.0.0.1:$TLS_ADMIN_PORT" \
  --peer-addr "127.0.0.1:$TLS_PEER_PORT" --tls-cert "$TLS_DIR/server.pem" --tls-key "$TLS_DIR/server.key" \
  --tls-client-ca "$TLS_DIR/ca.pem" >"$TLS_LOG" 2>&1 &
TLS_SERVER=$!
# Two replicas of the same log owning one shard each (partitions p % 2 == I).
SHARD_ADMIN_PORTS=""; SHARD_GRPC=""; SHARD_LOGS=""
for I in 0 1; do
  free_port; S_GRPC=$NEXT_PORT; free_port; S_ADMIN=$NEXT_PORT; free_port; S_PEER=$NEXT_PORT
  S_LOG=$(mktemp /tmp/prefixlog-pytest-shard$I.XXXXXX.log)
  "$BIN" serve --brokers "$BROKERS" --partitions 4 --shard "$I/2" --tick-interval 0 --ready-lag 0 \
    --replica-id "py-shard$I" --grpc-addr "127.0.0.1:$S_GRPC" --admin-addr "127.0.0.1:$S_ADMIN" \
    --peer-addr "127.0.0.1:$S_PEER" >"$S_LOG" 2>&1 &
  SHARD_SERVERS="$SHARD_SERVERS $!"
  SHARD_ADMIN_PORTS="${SHARD_ADMIN_PORTS:+$SHARD_ADMIN_PORTS,}$S_ADMIN"
  SHARD_GRPC="${SHARD_GRPC:+$SHARD_GRPC,}127.0.0.1:$S_GRPC"
  SHARD_LOGS="$SHARD_LOGS $S_LOG"
done
echo "==> replaying the trace into $BROKERS (8 workers, stretch 1)"
REPLAY_LOG=$(mktemp /tmp/prefixlog-replay.XXXXXX.log)
"$BIN" publish-trace --brokers "$BROKERS" --partitions 4 --workers 8 --stretch 1 --trace "$PREFIXLOG_TRACE" \
  2>"$REPLAY_LOG" || { cat "$REPLAY_LOG" >&2
    # The embedded broker lives in the first replica: name it when that is what went away.
    kill -0 $SERVER 2>/dev/null || { echo "the first replica (and its embedded broker) exited:" >&2; tail -40 "$LOG" >&2; }
    exit 1; }
cat "$REPLAY_LOG" >&2
# The number of records published, from replay's "replayed records=N" log line (empty if the
# log level hides it).
RECORDS=$(grep -o 'records=[0-9]*' "$REPLAY_LOG" | tail -1 | cut -d= -f2 || true)
rm -f "$REPLAY_LOG"
# Ready = every replayed record applied (or skipped), per /metrics, and caught up with every
# partition's high watermark (--ready-lag 0). Counting records instead of sleeping: the replica
# polls high watermarks every 200 ms, later on a loaded 2-core CI machine, and until then
# /readyz compares against stale watermarks. Up to 60 s, generous for the same reason.
# The shard replicas are waited for together: each applies its own partitions' records only,
# so their counts add up to the replayed records.
for PORTS in "$ADMIN_PORT" "$TLS_ADMIN_PORT" "$SHARD_ADMIN_PORTS"; do
# shellcheck disable=SC2086
"$PY" - "$PORTS" "$RECORDS" <<'PYEOF' || { cat "$LOG" "$TLS_LOG" $SHARD_LOGS >&2; exit 1; }
import sys, time, urllib.request
bases = [f"http://127.0.0.1:{port}" for port in sys.argv[1].split(",")]
want = int(sys.argv[2]) if sys.argv[2] else None
if want is None:
    print("replay's record count not found in its log; falling back to a 0.5 s sleep", file=sys.stderr)
    time.sleep(0.5)  # let the replica see the new high watermarks (polled every 200 ms)

COUNTED = ("prefixlog_records_applied", "prefixlog_records_skipped")

def samples(text):
    """(name without a `_total` suffix, value) of each sample in Prometheus' text format,
    labels dropped (skipped records may be counted per reason label)."""
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            rest = rest.rsplit("}", 1)[1]
        else:
            name, _, rest = line.partition(" ")
        yield name[: -len("_total")] if name.endswith("_total") else name, float(rest.split()[0])

def done(base):
    m = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    return sum(value for name, value in samples(m) if name in COUNTED)

n = 0
end = time.monotonic() + 60
while time.monotonic() < end:
    try:
        n = sum(done(base) for base in bases)
        if (want is None or n >= want) and all(
            urllib.request.urlopen(base + "/readyz", timeout=5).status == 200 for base in bases
        ):
            sys.exit(0)
    except OSError:  # URLError (also a 503 from /readyz), a reset connection
        pass
    time.sleep(0.1)
sys.exit(f"replica(s) on admin port(s) {sys.argv[1]} never became ready: {n:.0f} of {want} records applied or skipped")
PYEOF
done
echo "==> pytest (python/tests, examples/gateway) against 127.0.0.1:$GRPC_PORT, shards $SHARD_GRPC"
echo "    (test_sharded_live stops and kills the shard 1/2 replica: bash reports it \"Killed\" at the end)"
PREFIXLOG_GRPC="127.0.0.1:$GRPC_PORT" PREFIXLOG_TRACE="$PREFIXLOG_TRACE" \
  PREFIXLOG_GRPC_TLS="127.0.0.1:$TLS_GRPC_PORT" PREFIXLOG_TLS_DIR="$TLS_DIR" \
  PREFIXLOG_GRPC_SHARDS="$SHARD_GRPC" PREFIXLOG_SHARD_PIDS="$(echo $SHARD_SERVERS | tr ' ' ,)" \
  PREFIXLOG_TEST_BROKERS="$BROKERS" PREFIXLOG_BIN="$BIN" PREFIXLOG_SGLANG_GRPC="127.0.0.1:$GRPC_PORT" \
  "$PY" -m pytest -q -rs -p no:cacheprovider python/tests examples/gateway
