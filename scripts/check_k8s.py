"""Checks rendered Kubernetes layouts (scripts/check-k8s.sh renders them with `kubectl kustomize`)
for what the schemas cannot see:

    python check_k8s.py --bin PREFIXLOG --schemas deploy/k8s/schemas LAYOUT.yaml...

1. custom resources (cert-manager, Prometheus Operator) against deploy/k8s/schemas (the
   built-in kinds are validated by kubernetes-validate, in the shell script);
2. Pod Security "restricted" for every prefixlog container and its pod (non-root, seccomp
   RuntimeDefault, no privilege escalation, every capability dropped, allowed volume types
   only), and a read-only root filesystem;
3. every prefixlog container's command line -- its args plus its PREFIXLOG_* environment,
   turned into the flags they stand for (read from `prefixlog <cmd> --help`) -- parses with the
   binary; `$(VAR)` references name variables defined before them (else Kubernetes passes them
   on literally);
4. consistency: selectors match pod labels; Services, probes, ServiceMonitors and PodMonitors
   name declared ports; --grpc-addr/--admin-addr/--peer-addr are declared containerPorts;
   --data-dir and TLS files are on mounted volumes, TLS Secrets come from Certificates of the
   layout; --peers names the StatefulSet's own pods through its headless Service; the
   StatefulSets of one log cover each --shard I/N exactly once with one --partitions; the query
   Service gateways discover from is headless (its name must resolve to every replica).
"""
import argparse
import json
import os
import re
import subprocess
import sys

import jsonschema
import yaml

BUILTIN_GROUPS = ("v1", "apps/v1", "policy/v1", "networking.k8s.io/v1")
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
# Placeholder values of downward-API variables, to parse command lines that use them.
FIELD_VALUES = {"metadata.name": "pod-0", "status.podIP": "10.0.0.1", "metadata.namespace": "default"}


class Checker:
    def __init__(self, binary, schemas):
        self.binary = binary
        self.schemas = schemas
        self.errors = []
        self._flags = {}

    def check(self, ok, msg):
        if not ok:
            self.errors.append(msg)

    # --- the binary's flags ---------------------------------------------------------------

    def flags(self, sub):
        """{env var: (flag, takes a value)} of `prefixlog <sub>`, from its --help."""
        if sub not in self._flags:
            out = subprocess.run([self.binary, sub, "--help"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
            table, flag, takes = {}, None, False
            for line in out.stdout.splitlines():
                m = re.match(r"^\s+(?:-(\w)(?:, )?)?(?:--([a-z0-9-]+))?( <[A-Z_]+>)?\s*$", line)
                if m and (m.group(1) or m.group(2)):
                    flag = f"--{m.group(2)}" if m.group(2) else f"-{m.group(1)}"
                    takes = bool(m.group(3))
                e = re.search(r"\[env: ([A-Z0-9_]+)=", line)
                if e and flag:
                    table[e.group(1)] = (flag, takes)
            self.check(table, f"no [env: ...] in `prefixlog {sub} --help`")
            self._flags[sub] = table
        return self._flags[sub]

    def command_line(self, where, c):
        """The container's command line: args, then the flags its PREFIXLOG_* variables stand for."""
        args = list(c.get("args", []))
        if not args:
            self.check(False, f"{where}: no args (the subcommand)")
            return None, {}
        table = self.flags(args[0])
        values, cmd = {}, list(args)
        for e in c.get("env", []):
            name = e["name"]
            if "value" in e:
                refs = re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", e["value"])
                for r in refs:
                    self.check(r in values, f"{where}: {name} uses $({r}), not defined before it")
                value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values.get(m.group(1), m.group(0)), e["value"])
            elif "fieldRef" in e.get("valueFrom", {}):
                value = FIELD_VALUES.get(e["valueFrom"]["fieldRef"]["fieldPath"], "x")
            else:
                secret = e.get("valueFrom", {}).get("secretKeyRef", {})
                self.check(secret.get("optional") is True or not name.startswith("PREFIXLOG_"),
                           f"{where}: {name} from a Secret that is not optional cannot be checked")
                continue  # a Secret's value: not known here
            values[name] = value
            if not name.startswith("PREFIXLOG_"):
                continue
            if name not in table:
                self.check(False, f"{where}: {name} is no `prefixlog {args[0]}` setting")
                continue
            flag, takes = table[name]
            if not takes:
                if value not in ("true", "false"):
                    self.check(False, f"{where}: {name}={value!r}: a switch takes true or false")
                elif value == "true":
                    cmd.append(flag)
            elif name == "PREFIXLOG_KAFKA_PROPERTIES":
                for p in value.split(";"):
                    cmd += [flag, p]
            else:
                cmd += [flag, value]
        out = subprocess.run([self.binary, *cmd, "--help"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        self.check(out.returncode == 0, f"{where}: `prefixlog {' '.join(cmd)}` does not parse: {out.stderr.strip()}")
        flags = {}
        i = 1
        while i < len(cmd):
            if cmd[i].startswith("-") and i + 1 < len(cmd) and not cmd[i + 1].startswith("-"):
                flags[cmd[i]] = cmd[i + 1]
                i += 2
            else:
                flags[cmd[i]] = "true"
                i += 1
        return args[0], flags

    # --- checks -----------------------------------------------------------------------------

    def custom_resource(self, d):
        path = os.path.join(self.schemas, d["kind"].lower() + ".json")
        if not os.path.exists(path):
            self.check(False, f"{d['kind']}/{d['metadata']['name']}: no schema in {self.schemas}")
            return
        with open(path) as f:
            schema = json.load(f)
        for e in jsonschema.Draft7Validator(schema).iter_errors(d):
            self.check(False, f"{d['kind']}/{d['metadata']['name']}: {'/'.join(map(str, e.absolute_path))}: {e.message}")

    def restricted(self, where, pod, containers):
        ps = pod.get("securityContext", {})
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            self.check(not pod.get(key), f"{where}: {key}")
        for v in pod.get("volumes", []):
            kinds = set(v) - {"name"}
            self.check(kinds <= ALLOWED_VOLUMES, f"{where}: volume {v['name']} of type {kinds} (restricted)")
        for c in containers:
            cs = c.get("securityContext", {})
            w = f"{where}/{c['name']}"
            self.check(cs.get("allowPrivilegeEscalation") is False, f"{w}: allowPrivilegeEscalation must be false")
            self.check(not cs.get("privileged"), f"{w}: privileged")
            caps = cs.get("capabilities", {})
            self.check("ALL" in caps.get("drop", []), f"{w}: capabilities must drop ALL")
            self.check(set(caps.get("add", [])) <= {"NET_BIND_SERVICE"}, f"{w}: adds capabilities {caps.get('add')}")
            self.check(cs.get("runAsNonRoot", ps.get("runAsNonRoot")) is True, f"{w}: runAsNonRoot must be true")
            self.check(cs.get("runAsUser", ps.get("runAsUser", 1)) != 0, f"{w}: runAsUser 0")
            seccomp = cs.get("seccompProfile", ps.get("seccompProfile", {})).get("type")
            self.check(seccomp in ("RuntimeDefault", "Localhost"), f"{w}: seccompProfile RuntimeDefault or Localhost")
            self.check(cs.get("readOnlyRootFilesystem") is True, f"{w}: readOnlyRootFilesystem (it writes only to volumes)")
            self.check(not any(p.get("hostPort") for p in c.get("ports", [])), f"{w}: hostPort")

    def workload(self, w, services, certificates):
        name, spec = w["metadata"]["name"], w["spec"]
        pod = spec["template"]["spec"]
        labels = spec["template"]["metadata"].get("labels", {})
        sel = spec["selector"].get("matchLabels", {})
        self.check(sel and all(labels.get(k) == v for k, v in sel.items()), f"{name}: selector {sel} does not match the pod labels {labels}")
        for tsc in pod.get("topologySpreadConstraints", []):
            ml = tsc["labelSelector"]["matchLabels"]
            self.check(all(labels.get(k) == v for k, v in ml.items()), f"{name}: topology spread selects other pods: {ml}")
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {v["metadata"]["name"] for v in spec.get("volumeClaimTemplates", [])}
        ours = [c for c in pod["containers"] if c["image"].split("/")[-1].split(":")[0] == "prefixlog"]
        self.check(ours, f"{name}: no prefixlog container")
        self.restricted(f"{w['kind']}/{name}", pod, ours)
        for c in pod["containers"]:
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                http = c.get(probe, {}).get("httpGet")
                if http:
                    p = http["port"]
                    self.check(p in ports if isinstance(p, str) else p in ports.values(), f"{name}/{c['name']}: {probe} port {p} is not a container port")
                    self.check(http.get("path", "").startswith("/"), f"{name}/{c['name']}: {probe} path")
            mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
            for m in mounts.values():
                self.check(m in volumes or m in claims, f"{name}/{c['name']}: volumeMount {m} has no volume")
            if c not in ours:
                continue
            sub, flags = self.command_line(f"{name}/{c['name']}", c)
            for f in ("--grpc-addr", "--admin-addr", "--peer-addr"):
                if f in flags:
                    self.check(int(flags[f].rsplit(":", 1)[1]) in ports.values(), f"{name}: {f} {flags[f]} is not a declared containerPort")
            def mounted(path):
                return next((mounts[m] for m in sorted(mounts, key=len, reverse=True) if path == m or path.startswith(m + "/")), None)
            if "--data-dir" in flags:
                self.check(mounted(flags["--data-dir"]) in claims, f"{name}: --data-dir {flags['--data-dir']} is not on a persistent volume")
            for f in ("--tls-cert", "--tls-key", "--tls-client-ca", "--peer-tls-cert", "--peer-tls-key", "--peer-tls-ca"):
                if f in flags:
                    vol = volumes.get(mounted(flags[f]) or "", {})
                    secret = vol.get("secret", {}).get("secretName")
                    self.check(secret is not None, f"{name}: {f} {flags[f]} is not in a mounted Secret")
                    self.check(secret is None or secret in certificates, f"{name}: {f}: Secret {secret} is made by no Certificate here")
            self.certificate_names(name, flags, volumes, mounted, services, certificates)
            if sub == "serve" and w["kind"] == "StatefulSet":
                svc = services.get(spec["serviceName"])
                self.check(svc is not None and svc["spec"].get("clusterIP") == "None", f"{name}: serviceName {spec['serviceName']} is not a headless Service here")
                if "--peers" in flags:
                    port = flags.get("--peer-addr", "0:50152").rsplit(":", 1)[1]
                    want = {f"{name}-{i}.{spec['serviceName']}:{port}" for i in range(spec.get("replicas", 1))}
                    got = set(flags["--peers"].split(","))
                    self.check(got == want, f"{name}: --peers {sorted(got)}, expected {sorted(want)}")
                yield flags

    def certificate_names(self, name, flags, volumes, mounted, services, certificates):
        """The peer certificate names every --peers host, the query certificate the Service
        gateways discover from."""
        def names(flag):
            vol = volumes.get(mounted(flags[flag]) or "", {})
            cert = certificates.get(vol.get("secret", {}).get("secretName"))
            return cert["spec"].get("dnsNames", []) if cert else None

        def covered(host, dns):
            return any(host == d or (d.startswith("*.") and host.split(".", 1)[-1] == d[2:] and "." in host) for d in dns)
        if "--peer-tls-cert" in flags and "--peers" in flags and names("--peer-tls-cert") is not None:
            for peer in flags["--peers"].split(","):
                host = peer.rsplit(":", 1)[0]
                self.check(covered(host, names("--peer-tls-cert")), f"{name}: the peer certificate does not name {host}")
        if "--tls-cert" in flags and names("--tls-cert") is not None:
            for s in services.values():
                if s["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "query":
                    self.check(covered(s["metadata"]["name"], names("--tls-cert")),
                               f"{name}: the query certificate does not name the Service {s['metadata']['name']}")

    def layout(self, path):
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:
            if d["apiVersion"] not in BUILTIN_GROUPS:
                self.custom_resource(d)
        services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
        certificates = {d["spec"]["secretName"]: d for d in docs if d["kind"] == "Certificate"}
        workloads = [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]
        self.check(workloads, f"{path}: no StatefulSet or Deployment")
        serving = [(w["metadata"]["name"], f) for w in workloads for f in self.workload(w, services, certificates)]
        self.shards(serving)
        pods = [(w["spec"]["template"]["metadata"].get("labels", {}), w["spec"]["template"]["spec"]) for w in workloads]

        def port_names(selected):
            return {(p.get("name"), p["containerPort"]) for _, spec in selected for c in spec["containers"] for p in c.get("ports", [])}

        def matching(sel):
            return [(l, s) for l, s in pods if sel and all(l.get(k) == v for k, v in sel.items())]
        for s in services.values():
            sel = s["spec"].get("selector", {})
            targets = matching(sel)
            self.check(targets, f"service {s['metadata']['name']}: selector {sel} matches no pod template")
            for p in s["spec"]["ports"]:
                tp = p.get("targetPort", p["port"])
                self.check(any(tp in pn for pn in port_names(targets)), f"service {s['metadata']['name']}: port {p} targets no container port")
            if s["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "query":
                self.check(s["spec"].get("clusterIP") == "None", f"service {s['metadata']['name']}: gateways discover from it: it must be headless")
        for m in (d for d in docs if d["kind"] == "ServiceMonitor"):
            sel = m["spec"]["selector"].get("matchLabels", {})
            svcs = [s for s in services.values() if all(s["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
            self.check(svcs, f"ServiceMonitor {m['metadata']['name']}: selects no Service")
            for e in m["spec"]["endpoints"]:
                self.check(any(e["port"] == p.get("name") for s in svcs for p in s["spec"]["ports"]), f"ServiceMonitor {m['metadata']['name']}: port {e['port']}")
        for m in (d for d in docs if d["kind"] == "PodMonitor"):
            targets = matching(m["spec"]["selector"].get("matchLabels", {}))
            self.check(targets, f"PodMonitor {m['metadata']['name']}: selects no pod")
            for e in m["spec"].get("podMetricsEndpoints", []):
                self.check(any(e["port"] == n for n, _ in port_names(targets)), f"PodMonitor {m['metadata']['name']}: port {e['port']}")
        for n in (d for d in docs if d["kind"] == "NetworkPolicy"):
            targets = matching(n["spec"]["podSelector"].get("matchLabels", {}))
            self.check(targets, f"NetworkPolicy {n['metadata']['name']}: selects no pod")
            for rule in n["spec"].get("ingress", []):
                for p in rule.get("ports", []):
                    self.check(any(p["port"] in pn for pn in port_names(targets)), f"NetworkPolicy {n['metadata']['name']}: port {p['port']}")
        return docs

    def shards(self, serving):
        """The StatefulSets of one log (topic) cover each --shard I/N once, with one --partitions."""
        logs = {}
        for name, f in serving:
            logs.setdefault(f.get("--topic", "prefixlog.records"), []).append((name, f.get("--shard", "all"), f.get("--partitions", "16")))
        for topic, sets in logs.items():
            self.check(len({p for _, _, p in sets}) == 1, f"{topic}: --partitions differ: {sets}")
            shards = [s for _, s, _ in sets if s != "all"]
            if not shards:
                continue
            idx = []
            for s in shards:
                try:
                    i, n = (int(x) for x in s.split("/"))
                    self.check(0 <= i < n, f"{topic}: --shard {s}: index must be below the count")
                    idx.append((i, n))
                except ValueError:
                    self.check(False, f"{topic}: --shard {s} is not I/N")
            self.check(len({n for _, n in idx}) == 1, f"{topic}: shard counts differ: {shards}")
            for n in {n for _, n in idx}:
                got = sorted(i for i, m in idx if m == n)
                self.check(got == list(range(n)), f"{topic}: shards {got} of {n}: each shard 0..{n - 1} exactly once")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--schemas", required=True)
    ap.add_argument("layouts", nargs="+")
    a = ap.parse_args()
    c = Checker(a.bin, a.schemas)
    for path in a.layouts:
        before = len(c.errors)
        docs = c.layout(path)
        kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
        if len(c.errors) == before:
            print(f"ok: {os.path.basename(path)}: {len(docs)} resources ({', '.join(kinds)})")
    for e in c.errors:
        print("error:", e, file=sys.stderr)
    sys.exit(1 if c.errors else 0)


if __name__ == "__main__":
    main()
