//! A live replica's `/metrics` (issue 17): every family well formed and by Prometheus
//! conventions (counters end in `_total`, durations and times in seconds, a `shard` label, the
//! standard process metrics), accepted by `promtool check metrics` where promtool is installed
//! (`PREFIXLOG_PROMTOOL=required` makes its absence a failure; scripts/test.sh installs it),
//! and every metric the alert rules and the Grafana dashboard use is exported.

use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{token_of, EmbeddedKafka, KafkaConnection, KvOp, LogSpec, Publisher};
use prefixlog_node::{CheckpointPolicy, NodeOptions, ReplicaNode};
use prefixlog_query::{IndexClient, MatchQuery, Prompt};
use std::collections::BTreeSet;
use std::time::Duration;

fn repo(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// GET /metrics over HTTP/1.0.
async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    buf.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// (name, type) of every family, from `# TYPE` lines.
fn families(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (n, t) = l.split_once(' ').unwrap();
            (n.to_string(), t.to_string())
        })
        .collect()
}

/// Every metric name a PromQL text mentions (prefixlog_* and process_*).
fn names_used(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("prefixlog_") || w.starts_with("process_"))
        .map(|w| {
            w.trim_end_matches("_bucket").trim_end_matches("_count").trim_end_matches("_sum").to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_conventions_and_cover_alerts_and_dashboard() {
    let kafka = EmbeddedKafka::start("prefixlog.metrics", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.metrics", 2);
    let dir = tempfile::tempdir().unwrap();
    let opts = NodeOptions {
        data_dir: Some(dir.path().to_path_buf()),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        peers: vec!["127.0.0.1:1".into()],
        anti_entropy_interval: Duration::from_secs(3600),
        ..NodeOptions::default()
    };
    let node = ReplicaNode::start(spec.clone(), opts).await.unwrap();
    let ks = KeyspaceId::new("m", 16, 1);
    let publisher = Publisher::new(&spec).unwrap();
    let mut landed = Vec::new();
    for w in 0..4u64 {
        let ops =
            [KvOp::Stored { lane: 0, parent_ext: None, blocks: vec![(w << 8 | 1, 1), (w << 8 | 2, 2)] }];
        landed.push(publisher.publish_kv_events(&ks, w, 0, 1, 1, false, &ops, None).await.unwrap());
    }
    landed.push(publisher.publish_raw(0, b"not a record", None).await.unwrap());
    assert!(node.status().wait_for(&token_of(&landed), Duration::from_secs(30)).await);
    node.checkpoint_now().unwrap();
    node.anti_entropy_round().await;
    let client = IndexClient::new(vec![node.endpoint()], Duration::from_secs(5)).unwrap();
    client.match_prompt(&MatchQuery::new(ks, Prompt::Hashes(vec![1, 2]))).await;

    let text = scrape(node.admin_addr().unwrap()).await;
    let fams = families(&text);
    assert!(fams.len() >= 40, "{} families:\n{text}", fams.len());
    for (name, kind) in &fams {
        if kind == "counter" {
            assert!(name.ends_with("_total"), "counter {name} does not end in _total");
        }
        assert!(
            !name.contains("_ms") && !name.contains("_us") && !name.ends_with("_millis"),
            "{name}: use seconds"
        );
    }
    for line in text.lines().filter(|l| l.starts_with("prefixlog_")) {
        assert!(line.contains("shard=\"all\""), "no shard label: {line}");
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "unparsable sample: {line}");
    }
    let exported: BTreeSet<String> = fams.iter().map(|(n, _)| n.clone()).collect();
    for must in [
        "process_resident_memory_bytes",
        "prefixlog_checkpoint_duration_seconds",
        "prefixlog_checkpoint_bytes",
        "prefixlog_checkpoint_age_seconds",
        "prefixlog_checkpoint_failures_total",
        "prefixlog_match_depth_blocks",
        "prefixlog_log_discontinuities_total",
        "prefixlog_ready",
    ] {
        assert!(exported.contains(must), "{must} is not exported");
    }
    let alerts = std::fs::read_to_string(repo("deploy/prometheus/alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(repo("deploy/grafana/dashboards/prefixlog.json")).unwrap();
    for (file, used) in [("alerts.yml", names_used(&alerts)), ("the dashboard", names_used(&dashboard))] {
        assert!(!used.is_empty());
        for name in used {
            assert!(exported.contains(&name), "{file} uses {name}, which replicas do not export");
        }
    }
    promtool_check(&text);
}

/// `promtool check metrics` on the exposition, when promtool is installed.
fn promtool_check(text: &str) {
    use std::io::Write;
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        assert_ne!(
            std::env::var("PREFIXLOG_PROMTOOL").as_deref(),
            Ok("required"),
            "promtool is not installed"
        );
        eprintln!("[metrics] promtool check: NOT RUN (promtool not installed)");
        return;
    };
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool check metrics:\n{report}");
    eprintln!("[metrics] promtool check metrics: ok {}", report.trim());
}
