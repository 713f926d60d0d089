#!/usr/bin/env bash
# The local-image stack check (issue 18): starts deploy/compose.local.yml (tansu, the topic, two
# replicas peering with each other, the trace-replay fleet, and the `sharded` profile's 2 shards
# x 2 replicas; query and peer ports over mutual TLS with certificates scripts/make-certs.sh
# makes for this run) on free loopback ports under a project name of its own, waits for the replicas,
# queries them with the Python client (the shards fanned out and merged), compares anti-entropy
# digests (scripts/check_stack.py), and removes the stack with its
# volumes — also when a step fails (after printing the containers' logs).
# Needs a running engine and the images: scripts/docker-engine.sh run scripts/check-stack.sh
# after scripts/build-images.sh (scripts/container-leg.sh does all of it). Installs Debian's
# docker-compose (1.29) if no compose is available.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
CACHE="$HOME/.cache/prefixlog"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
t0=$(date +%s)

if command -v docker-compose >/dev/null; then
  DC=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  DC=(docker compose)
else
  echo "==> installing docker-compose (Debian's 1.29, once per machine)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
  DC=(docker-compose)
fi
for img in local/tansu:0.6.0 prefixlog:local; do
  docker image inspect "$img" >/dev/null 2>&1 || { echo "error: image $img missing (scripts/build-images.sh)" >&2; exit 1; }
done

# A venv with the client's runtime dependencies (python/pyproject.toml), once per machine. The
# client itself and its committed stubs (query, records, peer) are imported from python/.
VENV="$CACHE/stack-venv"
REQS="grpcio>=1.75.1 protobuf>=6.31.1,<8 xxhash>=3.0"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.prefixlog-reqs" 2>/dev/null)" != "$REQS" ]; then
  echo "==> python venv for the stack check: $VENV"
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086  # one word per requirement
  "$VENV/bin/pip" install -q --disable-pip-version-check $REQS
  echo "$REQS" > "$VENV/.prefixlog-reqs"
fi
PY="$VENV/bin/python"
export PYTHONDONTWRITEBYTECODE=1  # nothing written into the clone

# Free loopback ports below the ephemeral range (see listen_port() in tests/src/lib.rs).
read -r KAFKA AG AA AP BG BA BP S0AG S0AA S0AP S0BG S0BA S0BP S1AG S1AA S1AP S1BG S1BA S1BP < <("$PY" - <<'PYEOF'
import random, socket
ports, held = [], []
while len(ports) < 19:
    p = random.randrange(18000, 32000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    held.append(s)
    ports.append(p)
print(*ports)
PYEOF
)
export PREFIXLOG_KAFKA_PORT=$KAFKA PREFIXLOG_A_GRPC_PORT=$AG PREFIXLOG_A_ADMIN_PORT=$AA PREFIXLOG_A_PEER_PORT=$AP
export PREFIXLOG_B_GRPC_PORT=$BG PREFIXLOG_B_ADMIN_PORT=$BA PREFIXLOG_B_PEER_PORT=$BP
# The `sharded` profile: 2 shards x 2 replicas of the same log.
export PREFIXLOG_S0A_GRPC_PORT=$S0AG PREFIXLOG_S0A_ADMIN_PORT=$S0AA PREFIXLOG_S0A_PEER_PORT=$S0AP
export PREFIXLOG_S0B_GRPC_PORT=$S0BG PREFIXLOG_S0B_ADMIN_PORT=$S0BA PREFIXLOG_S0B_PEER_PORT=$S0BP
export PREFIXLOG_S1A_GRPC_PORT=$S1AG PREFIXLOG_S1A_ADMIN_PORT=$S1AA PREFIXLOG_S1A_PEER_PORT=$S1AP
export PREFIXLOG_S1B_GRPC_PORT=$S1BG PREFIXLOG_S1B_ADMIN_PORT=$S1BA PREFIXLOG_S1B_PEER_PORT=$S1BP
PREFIXLOG_TRACE_DIR="$(dirname "$PREFIXLOG_TRACE")"
export PREFIXLOG_TRACE_DIR
# Mutual TLS on the query and peer ports: certificates of this run only, readable by the
# containers' user (uid 10001) through the bind mount.
CERTS=$(mktemp -d)
chmod 0755 "$CERTS"
bash scripts/make-certs.sh "$CERTS"
export PREFIXLOG_CERTS_DIR="$CERTS"
PROJECT="prefixlog-check-$$"
COMPOSE=("${DC[@]}" --ansi never -f deploy/compose.local.yml -p "$PROJECT" --profile sharded)

ok=0
cleanup() {
  if [ "$ok" != 1 ]; then
    echo "==> stack check FAILED; the containers' logs:" >&2
    "${COMPOSE[@]}" ps >&2 || true
    "${COMPOSE[@]}" logs --no-color --tail=60 >&2 || true
  fi
  echo "==> removing the stack ($PROJECT) and its volumes"
  "${COMPOSE[@]}" down -v --remove-orphans -t 10 >/dev/null 2>&1 || true
  rm -rf "$CERTS"
}
trap cleanup EXIT
echo "==> starting the local-image stack $PROJECT (${DC[*]}): tansu on 127.0.0.1:$KAFKA," \
  "replica-a gRPC $AG admin $AA peer $AP, replica-b gRPC $BG admin $BA peer $BP," \
  "2 shards x 2 replicas on gRPC $S0AG $S0BG $S1AG $S1BG"
"${COMPOSE[@]}" up -d

FLEET=$("${COMPOSE[@]}" ps -q fleet)
[ -n "$FLEET" ] || { echo "error: no fleet container" >&2; exit 1; }
code=$(timeout 300 docker wait "$FLEET") || { echo "error: the fleet did not finish within 300 s" >&2; exit 1; }
[ "$code" = 0 ] || { echo "error: the fleet exited with $code" >&2; exit 1; }
RECORDS=$(docker logs "$FLEET" 2>&1 | grep -o 'records=[0-9]*' | tail -1 | cut -d= -f2 || true)
[ -n "$RECORDS" ] || { echo "error: no record count in the fleet's log" >&2; docker logs "$FLEET" >&2; exit 1; }
echo "==> fleet replayed $RECORDS records after $(( $(date +%s) - t0 ))s"

# --stretch: the fleet's in deploy/compose.local.yml (the queried chain depends on it).
STRETCH=$(grep -o '"--stretch", "[0-9]*"' deploy/compose.local.yml | grep -o '[0-9]*') \
  || { echo "error: no --stretch in the fleet's command in deploy/compose.local.yml" >&2; exit 1; }
PYTHONPATH="$PREFIXLOG_ROOT/python" "$PY" scripts/check_stack.py --a "$AG,$AA,$AP" --b "$BG,$BA,$BP" \
  --records "$RECORDS" --trace "$PREFIXLOG_TRACE" --stretch "$STRETCH" --certs "$CERTS" \
  --shards "$S0AG,$S0AA,$S0AP" "$S0BG,$S0BA,$S0BP" "$S1AG,$S1AA,$S1AP" "$S1BG,$S1BA,$S1BP"
ok=1
echo "==> stack check passed in $(( $(date +%s) - t0 ))s"
