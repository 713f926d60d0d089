#!/usr/bin/env bash
# The container leg of `make test` (issue 18), run by scripts/test.sh after the tansu leg:
#   1. a Docker engine (scripts/docker-engine.sh: installs docker.io if missing, starts dockerd
#      if none answers, stops it at the end if it started it);
#   2. the local images (scripts/build-images.sh; built once per machine, seconds afterwards);
#   3. the cross-crate suite with the testcontainers backend only, and required:
#      PREFIXLOG_TEST_BACKENDS=testcontainers (tansu in a container per test, host network);
#   4. the local-image stack check (scripts/check-stack.sh).
# Each step prints its duration. Containers the suite leaves behind (a test binary killed before
# it removed its broker) are removed before and after.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
if [ "${1:-}" != "--engine-up" ]; then
  exec bash scripts/docker-engine.sh run bash scripts/container-leg.sh --engine-up
fi

# Test brokers whose test process is gone (tests/src/lib.rs labels them with its pid).
reap_test_containers() {
  local id pid
  for id in $(docker ps -aq --filter label=org.prefixlog.test); do
    pid=$(docker inspect -f '{{index .Config.Labels "org.prefixlog.test.pid"}}' "$id" 2>/dev/null || true)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
      echo "==> removing leftover test container ${id:0:12} (test process $pid is gone)"
      docker rm -f "$id" >/dev/null 2>&1 || true
    fi
  done
}

t=$(date +%s)
echo "==> local images (scripts/build-images.sh)"
bash scripts/build-images.sh all
echo "==> images ready in $(( $(date +%s) - t ))s"

reap_test_containers
trap reap_test_containers EXIT
echo "==> cargo test (cross-crate integration tests on the testcontainers backend: local/tansu:0.6.0 in a container)"
t=$(date +%s)
PREFIXLOG_TEST_BACKENDS=testcontainers cargo test -p prefixlog-tests -- --nocapture
echo "==> testcontainers suite finished in $(( $(date +%s) - t ))s"

echo "==> local-image stack check (deploy/compose.local.yml)"
t=$(date +%s)
bash scripts/check-stack.sh
echo "==> stack check finished in $(( $(date +%s) - t ))s"
