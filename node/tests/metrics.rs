//! A live replica's `/metrics` (issues 17 and 35): every series it can emit, by Prometheus
//! conventions (`prefixlog_query::exposition`: counters end in `_total`, seconds, Unix times in
//! `_timestamp_seconds`, canonical gRPC code names, a `shard` label on every series, the
//! standard process metrics) and accepted by `promtool check metrics` where promtool is
//! installed (`PREFIXLOG_PROMTOOL=required` makes its absence a failure; scripts/test.sh
//! installs it); and every metric the alert rules and the Grafana dashboard use is exported,
//! by a replica or (`prefixlog_bridge_*`) by the bridge.
//!
//! Series created on first use are made to exist first: two replicas peering with each other
//! (anti-entropy's per-peer success time), a dead-letter topic and a refused record (its copy),
//! an answered query (per-keyspace depth and prompt length) and refused ones (non-OK codes), a
//! checkpoint. The bridge's own exposition is checked against the real binary by
//! prefixlog/tests/bridge_metrics.rs.

use prefixlog_client::{IndexClient, MatchOutcome, MatchQuery, Prompt};
use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{CheckpointPolicy, NodeOptions, ReplicaNode};
use prefixlog_query::exposition::{convention_problems, parse, promtool_check};
use prefixlog_state::BlockHashes;
use prefixlog_state::{token_of, KvOp, Tier};
use std::collections::BTreeSet;
use std::time::Duration;

fn repo(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// GET a path of the admin port over HTTP/1.0: (status line, body).
async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
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

/// The bridge's families (its library collector with one stream: every family exists then).
fn bridge_families() -> BTreeSet<String> {
    use prefixlog_bridge::metrics::{BridgeCollector, BridgeMetrics};
    let collector = std::sync::Arc::new(BridgeCollector::default());
    let registry = prometheus::Registry::new();
    collector.register(&registry).unwrap();
    collector.add(1, "tcp://h:5557", std::sync::Arc::new(BridgeMetrics::default()));
    registry.gather().iter().map(|f| f.name().to_string()).collect()
}

async fn node(spec: &LogSpec, dir: &std::path::Path, name: &str, peer_port: u16, other: u16) -> ReplicaNode {
    let opts = NodeOptions {
        replica_id: name.into(),
        data_dir: Some(dir.join(name)),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        peer_addr: Some(([127, 0, 0, 1], peer_port).into()),
        peers: vec![format!("127.0.0.1:{other}")],
        anti_entropy_interval: Duration::from_secs(3600),
        dead_letter_topic: Some("prefixlog.metrics.dead".into()),
        ..NodeOptions::default()
    };
    ReplicaNode::start(spec.clone(), opts).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_follows_conventions_and_covers_alerts_and_dashboard() {
    let kafka = EmbeddedKafka::start("prefixlog.metrics", 2).unwrap();
    kafka.create_topic("prefixlog.metrics.dead", 1).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.metrics", 2);
    let dir = tempfile::tempdir().unwrap();
    let (pa, pb) = (prefixlog_node::loopback_port(), prefixlog_node::loopback_port());
    let a = node(&spec, dir.path(), "a", pa, pb).await;
    let b = node(&spec, dir.path(), "b", pb, pa).await;
    let ks = KeyspaceId::new("m", 16, 1);
    let publisher = Publisher::new(&spec).unwrap();
    let mut landed = Vec::new();
    for w in 0..4u64 {
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: [(w << 8 | 1, 1), (w << 8 | 2, 2)].map(BlockHashes::from).to_vec(),
        }];
        landed.push(publisher.publish_kv_events(&ks, w, 0, 1, 1, false, &ops, None).await.unwrap());
    }
    landed.push(publisher.publish_raw(0, b"not a record", None).await.unwrap());
    for n in [&a, &b] {
        assert!(n.status().wait_for(&token_of(&landed), Duration::from_secs(30)).await);
        n.checkpoint_now().unwrap();
    }
    a.anti_entropy_round().await.unwrap();
    let client = IndexClient::new(vec![a.endpoint()], Duration::from_secs(5)).unwrap();
    assert!(matches!(
        client.match_prompt(&MatchQuery::new(ks, Prompt::Hashes(vec![1, 2, 3]))).await,
        MatchOutcome::Scores(_)
    ));
    let unknown = KeyspaceId::new("no-such-model", 16, 1);
    assert!(matches!(
        client.match_prompt(&MatchQuery::new(unknown, Prompt::Hashes(vec![1]))).await,
        MatchOutcome::Unavailable(_)
    ));
    // The refused record's dead-letter copy is delivered in the background.
    let admin = a.admin_addr().unwrap();
    let t = std::time::Instant::now();
    let text = loop {
        let (_, text) = get(admin, "/metrics").await;
        if text.contains("prefixlog_dead_letter_copies_total{outcome=\"copied\",shard=\"all\"} 1") {
            break text;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no dead-letter copy counted:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let fams = parse(&text);
    assert!(fams.len() >= 45, "{} families:\n{text}", fams.len());
    let problems = convention_problems(&text);
    assert!(problems.is_empty(), "{problems:#?}");
    for line in text.lines().filter(|l| l.starts_with("prefixlog_")) {
        assert!(line.contains("shard=\"all\""), "no shard label: {line}");
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "unparsable sample: {line}");
    }
    for want in [
        "prefixlog_build_info{revision=",
        "prefixlog_queries_total{code=\"OK\"",
        "prefixlog_queries_total{code=\"NOT_FOUND\"",
        "prefixlog_match_prompt_length_blocks_sum{keyspace=\"m/bs16/scheme1\",shard=\"all\"} 3",
        "prefixlog_startup_phase{phase=\"serving\",shard=\"all\"} 1",
        "prefixlog_anti_entropy_last_success_timestamp_seconds{peer=",
        "prefixlog_partition_log_timestamp_seconds{partition=\"0\"",
        "prefixlog_records_skipped_total{reason=",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
    let exported: BTreeSet<String> = fams.keys().cloned().collect();
    for must in [
        "process_resident_memory_bytes",
        "prefixlog_checkpoint_duration_seconds",
        "prefixlog_checkpoint_bytes",
        "prefixlog_checkpoint_age_seconds",
        "prefixlog_checkpoint_failures_total",
        "prefixlog_match_depth_blocks",
        "prefixlog_log_discontinuities_total",
        "prefixlog_restore_checkpoint_holder_blocks",
        "prefixlog_partition_recoveries_total",
        "prefixlog_ready",
    ] {
        assert!(exported.contains(must), "{must} is not exported");
    }
    let bridge = bridge_families();
    let alerts = std::fs::read_to_string(repo("deploy/prometheus/alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(repo("deploy/grafana/dashboards/prefixlog.json")).unwrap();
    for (file, used) in [("alerts.yml", names_used(&alerts)), ("the dashboard", names_used(&dashboard))] {
        assert!(!used.is_empty());
        for name in used {
            let from = if name.starts_with("prefixlog_bridge_") { &bridge } else { &exported };
            assert!(from.contains(&name), "{file} uses {name}, which nothing exports");
        }
    }
    match promtool_check(&text) {
        Ok(Some(report)) => eprintln!("[metrics] promtool check metrics: ok {}", report.trim()),
        Ok(None) => {
            assert_ne!(
                std::env::var("PREFIXLOG_PROMTOOL").as_deref(),
                Ok("required"),
                "promtool is not installed"
            );
            eprintln!("[metrics] promtool check: NOT RUN (promtool not installed)");
        }
        Err(report) => panic!("promtool check metrics:\n{report}\n{text}"),
    }
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// While a replica restores its state the admin port already answers: `/healthz` 200,
/// `/readyz` 503 naming the start-up phase, `/metrics` with the phase. Seen here from a start
/// that waits on an unreachable broker (the first phase: probing the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_port_reports_the_start_before_the_replica_serves() {
    let port = prefixlog_node::loopback_port();
    let admin: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    // Nothing listens on port 1: the start stays in its first phase until the probe gives up.
    let spec = LogSpec::new(KafkaConnection::new("127.0.0.1:1"), "prefixlog.nowhere", 1);
    let opts = NodeOptions { admin_addr: Some(admin), ..NodeOptions::default() };
    let starting = tokio::spawn(ReplicaNode::start(spec, opts));
    let t = std::time::Instant::now();
    let (status, body) = loop {
        if let Ok(s) = tokio::net::TcpStream::connect(admin).await {
            drop(s);
            break get(admin, "/readyz").await;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the admin port never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.contains("503"), "{status}: {body}");
    assert!(body.starts_with("not ready: starting: probing log"), "{body}");
    assert!(get(admin, "/healthz").await.0.contains("200"));
    let (_, text) = get(admin, "/metrics").await;
    assert!(text.contains("prefixlog_startup_phase{phase=\"probing_log\",shard=\"all\"} 1"), "{text}");
    assert!(text.contains("prefixlog_build_info{"), "{text}");
    starting.abort();
}
