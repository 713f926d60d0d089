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
# ZeroMQ is the bridge's own ZMTP client (bridge/src/zmtp/): linking ZeroMQ means depending on
# prefixlog-bridge (or on a ZeroMQ crate, which nothing should).
echo "==> the gateway client links no Kafka, ZeroMQ or RocksDB (cargo tree -p prefixlog-client)"
if cargo tree -p prefixlog-client | grep -qE 'rdkafka|prefixlog-bridge|zeromq|zmq|rocksdb'; then
  echo "error: prefixlog-client depends on rdkafka, the bridge (ZeroMQ) or rocksdb" >&2; exit 1
fi
# Only the Kafka edge (ingest), the bridge (ZeroMQ), node and the binary may link Kafka or
# ZeroMQ; the layers above the deterministic core reach the log through prefixlog_state::log.
echo "==> only ingest, bridge, node and the binary link Kafka or ZeroMQ (cargo tree -e normal)"
for crate in ids proto state engine workload snapshot query peer audit facades client; do
  deps="$(cargo tree -e normal -p "prefixlog-$crate")"  # fails the run if the crate is gone
  if grep -qE 'rdkafka|prefixlog-bridge|zeromq|zmq' <<<"$deps"; then
    echo "error: prefixlog-$crate depends on rdkafka or ZeroMQ (prefixlog-bridge)" >&2; exit 1
  fi
done
# The deterministic core holds no async runtime or metrics (a running replica's status is the
# query side's), and the query side does not depend on the gateway client (tests join them).
echo "==> prefixlog-state depends on no tokio or prometheus, prefixlog-query not on prefixlog-client"
if cargo tree -e normal --depth 1 -p prefixlog-state | grep -qE '(tokio|prometheus) v'; then
  echo "error: prefixlog-state depends on tokio or prometheus" >&2; exit 1
fi
if cargo tree -e normal,dev --depth 1 -p prefixlog-query | grep -q 'prefixlog-client v'; then
  echo "error: prefixlog-query depends on prefixlog-client" >&2; exit 1
fi
# Each facade is a cargo feature; only the endpoint picker (`epp`) tokenizes.
echo "==> prefixlog-facades without epp links no tokenizers; each facade builds alone"
if cargo tree -e normal -p prefixlog-facades --no-default-features --features sglang,smg,http | grep -q 'tokenizers v'; then
  echo "error: prefixlog-facades links tokenizers without the epp feature" >&2; exit 1
fi
for feature in sglang smg http epp; do
  cargo clippy -q -p prefixlog-facades --no-default-features --features "$feature" -- -D warnings
done
echo "==> Prometheus alert rules (promtool check rules)"
PROMTOOL="$(bash scripts/promtool.sh)"
"$PROMTOOL" check rules deploy/prometheus/alerts.yml
# node/tests/metrics.rs runs `promtool check metrics` on a live replica's /metrics; required here.
PATH="$(dirname "$PROMTOOL"):$PATH"
export PATH PREFIXLOG_PROMTOOL=required
echo "==> cargo test (workspace, unit and crate tests; Kafka-backed ones on the embedded mock)"
PREFIXLOG_TEST_BACKENDS=embedded cargo test --workspace --exclude prefixlog-tests --no-fail-fast
# The hostile-clients drills again on a release build, the fast publisher at full length: one
# SMG Publish stream written as fast as flow control lets it for 60 s keeps its connection and
# gets an ack for every update (the debug run above writes for 10 s at a fraction of the rate).
echo "==> hostile clients on a release build (60 s fast-publisher drill)"
PREFIXLOG_DRILL_PUBLISH_SECS=60 cargo test --release -p prefixlog-facades --test hostile_live -- --nocapture
echo "==> self-contained: the demo smoke test in a copy of the repository alone"
bash scripts/check-self-contained.sh
echo "==> Kubernetes manifests (schema and consistency, no cluster)"
bash scripts/check-k8s.sh
echo "==> python for the bridge end-to-end test (pyzmq + msgpack)"
bash scripts/bridge-fixtures.sh
export PREFIXLOG_BRIDGE_E2E=required  # tests/tests/bridge.rs fails instead of skipping
echo "==> python for the foreign-producer test (kafka-python with lz4 and zstd)"
bash scripts/foreign-producer.sh
export PREFIXLOG_FOREIGN_PRODUCER=required  # tests/tests/foreign_producer.rs fails instead of skipping
# The cross-crate suite runs once per Kafka backend leg; PREFIXLOG_TEST_BACKENDS names the
# backend of each leg, and a named backend that cannot start fails the leg (tests/src/lib.rs).
# Every test prints which backends ran.
echo "==> cargo test (cross-crate integration tests on the embedded librdkafka mock cluster)"
leg_start=$(date +%s)
PREFIXLOG_TEST_BACKENDS=embedded cargo test -p prefixlog-tests -- --nocapture
echo "==> embedded leg finished in $(( $(date +%s) - leg_start ))s"
# The same suites against tansu, an independent Kafka-compatible broker (installed once per
# machine), plus the broker-outage test. PREFIXLOG_SKIP_TANSU=1 skips it for quick local runs;
# CI never skips it.
if [ "${PREFIXLOG_SKIP_TANSU:-}" = "1" ] && [ "${CI:-}" != "true" ]; then
  echo "==> tansu leg SKIPPED (PREFIXLOG_SKIP_TANSU=1)"
else
  echo "==> cargo test (cross-crate integration tests again, on tansu; includes the outage test)"
  leg_start=$(date +%s)
  PREFIXLOG_TEST_BACKENDS=external bash scripts/with-tansu.sh cargo test -p prefixlog-tests -- --nocapture
  # SIGTERM mid-ingest and restart, on a real broker as well (the workspace leg runs it embedded);
  # the binary's -X / --kafka-config / PREFIXLOG_KAFKA_PROPERTIES against SASL/SCRAM over TLS
  # (tests/tests/secured_kafka.rs, in the suite above, covers the libraries the same way).
  PREFIXLOG_TEST_BACKENDS=external bash scripts/with-tansu.sh \
    cargo test -p prefixlog --test sigterm --test secured_cli -- --nocapture
  echo "==> tansu leg finished in $(( $(date +%s) - leg_start ))s"
fi
# The same suites on tansu in a container started by testcontainers, then the local-image
# stack (tansu, two replicas, the fleet) checked with the Python client and the replicas'
# digests. Starts a Docker engine if none runs (and stops it afterwards), builds the local
# images once per machine. PREFIXLOG_SKIP_CONTAINERS=1 skips it for quick local runs; CI never
# skips it.
if [ "${PREFIXLOG_SKIP_CONTAINERS:-}" = "1" ] && [ "${CI:-}" != "true" ]; then
  echo "==> container leg SKIPPED (PREFIXLOG_SKIP_CONTAINERS=1)"
else
  echo "==> container leg (testcontainers backend, local-image stack)"
  leg_start=$(date +%s)
  bash scripts/container-leg.sh
  echo "==> container leg finished in $(( $(date +%s) - leg_start ))s"
fi
echo "==> python client (venv, stubs from proto/, pytest against a live replica)"
bash python/run_tests.sh
# Other projects' released code (tests/upstream/pins.txt) against the bridge and the facades:
# the engines' own publishers and hashes, the real Dynamo indexer, the peers' published schemas.
echo "==> upstream leg (tests/upstream: released vLLM, SGLang, Dynamo, Envoy, SMG, LMCache code)"
leg_start=$(date +%s)
bash tests/upstream/run.sh
echo "==> upstream leg finished in $(( $(date +%s) - leg_start ))s"
echo "==> test suite finished in $(( $(date +%s) - start ))s"
