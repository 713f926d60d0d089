#!/usr/bin/env bash
# Validates the Kubernetes manifests (deploy/k8s/*.yaml) without a cluster (issue 18):
#   1. schema: kubernetes-validate (PyPI; bundles the OpenAPI schemas, no network at run time),
#      --strict, so unknown fields fail too;
#   2. consistency the schema cannot see: selectors match the pod labels, services select
#      existing pods and name container ports, probes use declared ports, the container's
#      --*-addr ports are declared containerPorts, --peers names this StatefulSet's pods through
#      its headless service, the --data-dir is a mounted volume, the StatefulSets of one topic
#      cover each --shard I/N exactly once with the same --partitions.
# The venv lives in ~/.cache/prefixlog/k8s-venv (created once, ~10 s).
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$PREFIXLOG_ROOT"
VENV="$HOME/.cache/prefixlog/k8s-venv"
REQS="kubernetes-validate==1.37.0"
if [ ! -x "$VENV/bin/kubernetes-validate" ] || [ "$(cat "$VENV/.prefixlog-reqs" 2>/dev/null)" != "$REQS" ]; then
  echo "==> k8s venv: $VENV ($REQS)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check $REQS
  echo "$REQS" > "$VENV/.prefixlog-reqs"
fi
shopt -s nullglob
files=(deploy/k8s/*.yaml deploy/k8s/*.yml)
[ "${#files[@]}" -gt 0 ] || { echo "error: no manifests in deploy/k8s" >&2; exit 1; }
echo "==> kubernetes-validate --strict ${files[*]}"
"$VENV/bin/kubernetes-validate" --strict --quiet "${files[@]}"
echo "==> manifest consistency"
"$VENV/bin/python" - "${files[@]}" <<'PYEOF'
import sys
import yaml

docs = [d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]
errors = []


def check(ok, msg):
    if not ok:
        errors.append(msg)


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
workloads = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]
check(workloads, "no StatefulSet or Deployment")
pod_labels = []
for w in workloads:
    name = w["metadata"]["name"]
    spec = w["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    pod_labels.append(labels)
    sel = spec["selector"].get("matchLabels", {})
    check(sel and all(labels.get(k) == v for k, v in sel.items()),
          f"{name}: selector {sel} does not match the pod labels {labels}")
    pod = spec["template"]["spec"]
    mounts_ok = {v["metadata"]["name"] for v in spec.get("volumeClaimTemplates", [])}
    mounts_ok |= {v["name"] for v in pod.get("volumes", [])}
    for c in pod["containers"]:
        ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
        numbers = set(ports.values())
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            http = c.get(probe, {}).get("httpGet")
            if http:
                p = http["port"]
                check(p in ports if isinstance(p, str) else p in numbers,
                      f"{name}/{c['name']}: {probe} port {p} is not a container port")
                check(http.get("path", "").startswith("/"), f"{name}/{c['name']}: {probe} path")
        args = c.get("args", [])
        for f in ("--grpc-addr", "--admin-addr", "--peer-addr"):
            v = flag(args, f)
            if v:
                check(int(v.rsplit(":", 1)[1]) in numbers,
                      f"{name}/{c['name']}: {f} {v} is not a declared containerPort")
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        for m in mounts.values():
            check(m in mounts_ok, f"{name}/{c['name']}: volumeMount {m} has no volume")
        data = flag(args, "--data-dir")
        if data:
            check(data in mounts, f"{name}/{c['name']}: --data-dir {data} is not a mounted volume")
        peers = flag(args, "--peers")
        if peers and w["kind"] == "StatefulSet":
            svc = spec["serviceName"]
            want = {f"{name}-{i}.{svc}:{flag(args, '--peer-addr').rsplit(':', 1)[1]}"
                    for i in range(spec.get("replicas", 1))}
            check(set(peers.split(",")) == want, f"{name}: --peers {peers}, expected {sorted(want)}")
    if w["kind"] == "StatefulSet":
        svc = services.get(spec["serviceName"])
        check(svc is not None, f"{name}: serviceName {spec['serviceName']} is not a Service here")
        if svc:
            check(svc["spec"].get("clusterIP") == "None", f"{name}: {spec['serviceName']} is not headless")
# Shards: --shard I/N is valid, and the StatefulSets that run one log (same --topic) cover every
# shard of their N exactly once with the same --partitions (a missing shard is a hole in answers).
logs = {}
for w in workloads:
    for c in w["spec"]["template"]["spec"]["containers"]:
        args = c.get("args", [])
        if not args or args[0] != "serve":
            continue
        shard = flag(args, "--shard") or "all"
        key = (flag(args, "--brokers"), flag(args, "--topic") or "prefixlog.records")
        logs.setdefault(key, []).append((w["metadata"]["name"], shard, flag(args, "--partitions") or "16"))
for (brokers, topic), sets in logs.items():
    parts = {p for _, _, p in sets}
    check(len(parts) == 1, f"{topic}: --partitions differ between {sets}")
    shards = [s for _, s, _ in sets if s != "all"]
    if not shards:
        continue
    idx = []
    for s in shards:
        try:
            i, n = (int(x) for x in s.split("/"))
            check(0 <= i < n, f"{topic}: --shard {s}: index must be below the count")
            idx.append((i, n))
        except ValueError:
            check(False, f"{topic}: --shard {s} is not I/N")
    counts = {n for _, n in idx}
    check(len(counts) == 1, f"{topic}: shard counts differ: {shards}")
    for n in counts:
        got = sorted(i for i, m in idx if m == n)
        check(got == list(range(n)), f"{topic}: shards {got} of {n}: each shard 0..{n - 1} exactly once")
for s in services.values():
    sel = s["spec"].get("selector", {})
    targets = [w for w, l in zip(workloads, pod_labels) if all(l.get(k) == v for k, v in sel.items())]
    check(sel and targets, f"service {s['metadata']['name']}: selector {sel} matches no pod template")
    for p in s["spec"]["ports"]:
        tp = p.get("targetPort", p["port"])
        declared = [
            (q.get("name"), q["containerPort"])
            for w in targets for c in w["spec"]["template"]["spec"]["containers"] for q in c.get("ports", [])
        ]
        check(any(tp in (n, num) for n, num in declared),
              f"service {s['metadata']['name']}: port {p} targets no container port")
for e in errors:
    print("error:", e, file=sys.stderr)
if errors:
    sys.exit(1)
print(f"ok: {len(docs)} resources ({', '.join(sorted(d['kind'] + '/' + d['metadata']['name'] for d in docs))})")
PYEOF
