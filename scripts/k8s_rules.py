#!/usr/bin/env python3
"""The Kubernetes PrometheusRule is deploy/prometheus/alerts.yml, one source of truth:

    python3 scripts/k8s_rules.py write   regenerate deploy/k8s/base/prometheusrule.yaml
    python3 scripts/k8s_rules.py check   fail (exit 1) when it differs from alerts.yml

The rule groups are copied as they are (the PrometheusRule's spec.groups is a rule file's
`groups`); check compares the parsed groups, so comments and formatting do not matter. Needs
PyYAML (scripts/check-k8s.sh runs it in its venv).
"""
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALERTS = os.path.join(ROOT, "deploy", "prometheus", "alerts.yml")
RULE = os.path.join(ROOT, "deploy", "k8s", "base", "prometheusrule.yaml")

HEADER = """\
# GENERATED from deploy/prometheus/alerts.yml by `python3 scripts/k8s_rules.py write`: edit
# the alerts there. scripts/check-k8s.sh fails when the two differ. The Prometheus Operator
# loads it into the Prometheus instances whose ruleSelector matches its labels (add yours,
# e.g. `release: kube-prometheus-stack`, in an overlay).
"""


def groups(path):
    with open(path) as f:
        return yaml.safe_load(f)["groups"]


def rule_resource():
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "prefixlog", "labels": {"app.kubernetes.io/name": "prefixlog"}},
        "spec": {"groups": groups(ALERTS)},
    }


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "write":
        with open(RULE, "w") as f:
            f.write(HEADER)
            yaml.safe_dump(rule_resource(), f, sort_keys=False, width=120)
        print(f"wrote {os.path.relpath(RULE, ROOT)}")
    elif cmd == "check":
        with open(RULE) as f:
            got = yaml.safe_load(f)
        if got != rule_resource():
            sys.exit(f"{os.path.relpath(RULE, ROOT)} differs from deploy/prometheus/alerts.yml: "
                     "run `python3 scripts/k8s_rules.py write`")
        print(f"ok: the PrometheusRule has alerts.yml's {sum(len(g['rules']) for g in got['spec']['groups'])} rules")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
