//! Checks docker-compose.yml, deploy/compose.local.yml, deploy/prometheus.yml and the
//! Dockerfile against the binary (no Docker engine needed): every `prefixlog` command line in
//! them parses with this build's CLI (flags exist, values parse), every partition count agrees,
//! and ports and paths line up across the files. The Kubernetes layouts (deploy/k8s) are
//! rendered and checked the same way, against the same binary, by scripts/check-k8s.sh.

use std::path::Path;
use std::process::Command;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The JSON-array command lines after `key: [` (one per line, as the files write them).
fn commands(text: &str, key: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(key).map(str::trim))
        .filter(|r| r.starts_with('['))
        .map(|r| serde_json::from_str(r).unwrap_or_else(|e| panic!("{key} {r}: {e}")))
        .collect()
}

fn value<'a>(cmd: &'a [String], flag: &str) -> Option<&'a str> {
    cmd.iter().position(|a| a == flag).map(|i| cmd[i + 1].as_str())
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

/// Runs `prefixlog <cmd> --help`: clap parses (and validates) every argument before `--help`.
fn parses(cmd: &[String]) {
    let out = Command::new(env!("CARGO_BIN_EXE_prefixlog")).args(cmd).arg("--help").output().unwrap();
    assert!(
        out.status.success(),
        "`prefixlog {}` does not parse: {}",
        cmd.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn deploy_files_match_the_cli() {
    let compose = read("docker-compose.yml");
    let k8s = read("deploy/k8s/replicas/statefulset.yaml");
    let prom = read("deploy/prometheus.yml");
    let docker = read("Dockerfile");
    let subcommands = ["serve", "publish-trace"];
    let prefixlog_cmds: Vec<Vec<String>> = commands(&compose, "command:");
    let (ours, others): (Vec<_>, Vec<_>) =
        prefixlog_cmds.into_iter().partition(|c| subcommands.contains(&c[0].as_str()));
    assert_eq!(
        ours.iter().filter(|c| c[0] == "serve").count(),
        6,
        "two compose replicas + the sharded profile's 2 x 2"
    );
    assert!(ours.iter().any(|c| c[0] == "publish-trace"), "the compose fleet");
    for c in &ours {
        parses(c);
    }
    // One partition count everywhere, including the topic creation.
    let mut partitions: Vec<&str> = ours.iter().filter_map(|c| value(c, "--partitions")).collect();
    partitions.extend(others.iter().filter_map(|c| value(c, "--partitions")));
    assert_eq!(partitions.len(), ours.len() + 1, "every command names --partitions: {partitions:?}");
    assert!(partitions.iter().all(|p| *p == partitions[0]), "partition counts differ: {partitions:?}");
    for c in ours.iter().filter(|c| c[0] == "serve") {
        let data = value(c, "--data-dir").expect("--data-dir");
        assert!(docker.contains(data), "Dockerfile does not prepare {data}");
        let (grpc, admin, peer) = (
            port(value(c, "--grpc-addr").unwrap()),
            port(value(c, "--admin-addr").unwrap()),
            port(value(c, "--peer-addr").unwrap()),
        );
        for p in [grpc, admin, peer] {
            assert!(docker.contains(&format!(" {p}")), "Dockerfile does not EXPOSE {p}");
        }
        for other in value(c, "--peers").expect("--peers").split(',') {
            assert_eq!(port(other), peer, "--peers {other} is not a --peer-addr port");
        }
        assert!(compose.contains(&format!(":{admin}\"")));
    }
    for t in ["replica-a:9151", "replica-b:9151"] {
        assert!(prom.contains(t), "prometheus.yml does not scrape {t}");
    }
    assert!(compose.contains("./deploy/prometheus.yml:/etc/prometheus/prometheus.yml"));
    assert!(k8s.contains("path: /readyz") && read("query/src/admin.rs").contains("\"/readyz\""));
    assert!(
        docker.contains("ENTRYPOINT [\"/usr/bin/tini\", \"--\", \"prefixlog\"]")
            && docker.contains("USER 10001")
    );
    // The dashboard's and the alert rules' metric names are checked against a live replica's
    // /metrics in node/tests/metrics.rs.
    assert!(compose.contains("./deploy/grafana/dashboards:/var/lib/grafana/dashboards"));
    assert!(
        read("deploy/grafana/provisioning/dashboards/prefixlog.yml").contains("/var/lib/grafana/dashboards")
    );
}

/// `${NAME:-default}` → `default` (compose's substitution, for the files' own defaults).
fn compose_defaults(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find('}').expect("closed ${") + i;
        let inner = &rest[i + 2..end];
        out.push_str(inner.split_once(":-").map_or("", |(_, d)| d));
        rest = &rest[end + 1..];
    }
    out + rest
}

#[test]
fn every_deploy_command_line_parses() {
    let mut local = commands(&compose_defaults(&read("deploy/compose.local.yml")), "command:");
    local.retain(|c| ["serve", "publish-trace"].contains(&c[0].as_str())); // not tansu's
    assert!(local.len() >= 3, "{local:?}");
    for c in &local {
        parses(c);
    }
    let shards =
        |cmds: &[Vec<String>]| cmds.iter().filter_map(|c| value(c, "--shard")).collect::<Vec<_>>().join(" ");
    assert_eq!(
        shards(&local),
        "0/2 0/2 1/2 1/2",
        "the local compose's sharded profile: 2 shards x 2 replicas"
    );
    // A sharded replica's --peers are the other replicas of its own shard.
    let sharded: Vec<&Vec<String>> = local.iter().filter(|c| value(c, "--shard").is_some()).collect();
    for c in &sharded {
        for peer in value(c, "--peers").expect("--peers").split(',') {
            let owner =
                sharded.iter().find(|o| value(o, "--peer-addr") == Some(peer)).expect("a compose replica");
            assert_eq!(value(owner, "--shard"), value(c, "--shard"), "{peer} is of another shard");
        }
    }
}

/// Every alert's `runbook` annotation names a heading of docs/operations.md.
#[test]
fn every_alert_has_a_runbook_entry() {
    let ops = read("docs/operations.md");
    let anchors: Vec<String> = ops
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|h| h.trim().to_lowercase().replace(' ', "-"))
        .collect();
    let alerts = read("deploy/prometheus/alerts.yml");
    let (mut alert_count, mut runbooks) = (0, 0);
    for l in alerts.lines().map(str::trim) {
        alert_count += usize::from(l.starts_with("- alert:"));
        if let Some(r) = l.strip_prefix("runbook: ") {
            runbooks += 1;
            let anchor =
                r.trim_matches('"').strip_prefix("docs/operations.md#").expect("docs/operations.md#...");
            assert!(
                anchors.iter().any(|a| a == anchor),
                "runbook {anchor} is not a heading of docs/operations.md"
            );
        }
    }
    assert!(alert_count >= 10 && runbooks == alert_count, "{alert_count} alerts, {runbooks} runbooks");
}
