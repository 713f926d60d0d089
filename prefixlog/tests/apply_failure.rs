//! A failed apply across restarts of `prefixlog serve` (issue 34 item 3). The binary is built
//! for these tests with prefixlog-ingest's `testing` feature (a dev-dependency), whose hook
//! makes applying a record that starts with `PREFIXLOG_TESTING_PANIC_ON` panic.
//!
//! Asserted: the process stays up (no crash, no crash loop); /readyz says 503 naming the
//! partition and offset; /metrics counts the failure and the withheld checkpoints; a clean stop
//! exits 0 and no checkpoint on disk covers the failing record; a restart halts at the same
//! record again, and the other partition is served throughout.

use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{KafkaConnection, LogSpec, Publisher};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::record::worker_for_partition;
use prefixlog_state::BlockHashes;
use prefixlog_state::{token_of, KvOp, Landed, Tier};
use prefixlog_tests::http::{http_get, sample};
use prefixlog_tests::{kafka_backends, unique_topic, KafkaBackend};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const P: u32 = 2;
const FAILING: u32 = 0;

fn serve(
    brokers: &str,
    topic: &str,
    marker: &str,
    dir: &std::path::Path,
    admin: SocketAddr,
    run: usize,
) -> Child {
    let log = std::fs::File::create(dir.join(format!("run-{run}.log"))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_prefixlog"))
        .env("PREFIXLOG_TESTING_PANIC_ON", marker)
        .args(["serve", "--brokers", brokers, "--topic", topic, "--partitions", "2", "--ready-lag", "0"])
        .args(["--checkpoint-interval", "200ms", "--checkpoint-records", "0", "--tick-interval", "0s"])
        .args([
            "--grpc-addr",
            "127.0.0.1:0",
            "--peer-addr",
            "127.0.0.1:0",
            "--admin-addr",
            &admin.to_string(),
        ])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn prefixlog serve")
}

async fn publish(p: &Publisher, seq: u64) -> Vec<Landed> {
    let ks = KeyspaceId::new("m", 16, 1);
    let mut out = Vec::new();
    for partition in 0..P {
        let w = worker_for_partition(partition, P);
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: [(w << 16 | seq, seq)].map(BlockHashes::from).to_vec(),
        }];
        out.push(p.publish_kv_events(&ks, w, 0, 1, seq, false, &ops, None).await.unwrap());
    }
    out
}

/// Polls /metrics until `f` holds for it (60 s at most: a loaded 2-core CI machine).
async fn wait_metrics(admin: SocketAddr, what: &str, f: impl Fn(&str) -> bool) -> String {
    let t = Instant::now();
    loop {
        let (code, m) = http_get(admin, "/metrics").await;
        if code == 200 && f(&m) {
            return m;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "replica on {admin}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn next_offset(m: &str, p: u32) -> Option<f64> {
    sample(m, &format!("prefixlog_partition_next_offset{{partition=\"{p}\",shard=\"all\"}}"))
}

async fn stop(mut child: Child, dir: &std::path::Path, run: usize) -> String {
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    let t = Instant::now();
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "serve did not exit within 30 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = std::fs::read_to_string(dir.join(format!("run-{run}.log"))).unwrap();
    assert!(exit.success(), "exit {exit:?}; log:\n{log}");
    log
}

/// Next offset of the failing partition in the newest checkpoint on disk.
fn checkpointed(dir: &std::path::Path) -> i64 {
    let store = CheckpointStore::open_reader(&dir.join("data/checkpoints")).unwrap();
    let newest = store.ids()[0];
    store.meta(newest).unwrap().offsets[FAILING as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_halts_one_partition_at_a_failing_record_across_restarts() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        across_restarts(&b).await;
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn across_restarts(b: &KafkaBackend) {
    let topic = unique_topic("prefixlog.serve-apply-failure");
    b.create_topic(&topic, P).await.unwrap();
    let spec = LogSpec::new(KafkaConnection::new(&b.brokers), &topic, P);
    let publisher = Publisher::new(&spec).unwrap();
    let marker = format!("serve-apply-failure:{topic}");
    let dir = tempfile::tempdir().unwrap();
    let admin = SocketAddr::from(([127, 0, 0, 1], prefixlog_node::loopback_port()));

    let first = token_of(&publish(&publisher, 1).await);
    let mut child = serve(&b.brokers, &topic, &marker, dir.path(), admin, 0);
    let written = "prefixlog_checkpoints_written_total{shard=\"all\"}";
    let at = |p: u32| first.iter().find(|t| t.partition == p).unwrap().offset as f64;
    wait_metrics(admin, "caught up and checkpointed", |m| {
        next_offset(m, FAILING) == Some(at(FAILING)) && sample(m, written) >= Some(1.0)
    })
    .await;
    let poison =
        publisher.publish_raw(worker_for_partition(FAILING, P), marker.as_bytes(), None).await.unwrap();
    let end = token_of(&publish(&publisher, 2).await);
    let other_end = end.iter().find(|t| t.partition != FAILING).unwrap();

    let failures = format!("prefixlog_apply_failures_total{{partition=\"{FAILING}\",shard=\"all\"}}");
    let withheld = "prefixlog_checkpoints_withheld_total{shard=\"all\"}";
    let halted = |m: &str| {
        sample(m, &failures) == Some(1.0)
            && next_offset(m, other_end.partition) == Some(other_end.offset as f64)
    };
    let m = wait_metrics(admin, "halted at the failing record, the other partition caught up", |m| {
        halted(m) && sample(m, withheld) >= Some(1.0)
    })
    .await;
    assert_eq!(next_offset(&m, FAILING), Some(poison.offset as f64), "halted at the record");
    let (code, body) = http_get(admin, "/readyz").await;
    let named = format!("partition {FAILING}'s record at offset {}", poison.offset);
    assert!(code == 503 && body.contains(&named), "{code} {body}");
    assert!(child.try_wait().unwrap().is_none(), "the process keeps running");
    let log = stop(child, dir.path(), 0).await;
    assert!(log.contains("applying a record failed") && log.contains("checkpoint withheld"), "{log}");
    assert!(checkpointed(dir.path()) <= poison.offset, "a checkpoint covers the failing record");

    // Restarted: from the last sound checkpoint to the same record, halted there again.
    let child = serve(&b.brokers, &topic, &marker, dir.path(), admin, 1);
    let m = wait_metrics(admin, "halted again after the restart", halted).await;
    assert_eq!(next_offset(&m, FAILING), Some(poison.offset as f64));
    let (code, body) = http_get(admin, "/readyz").await;
    assert!(code == 503 && body.contains(&named), "{code} {body}");
    let log = stop(child, dir.path(), 1).await;
    assert!(log.contains("restored"), "{log}");
    assert!(checkpointed(dir.path()) <= poison.offset, "a checkpoint covers the failing record");
}
