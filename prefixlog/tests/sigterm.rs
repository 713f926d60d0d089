//! A clean stop (issue 14 item 8): `prefixlog serve` as a child process gets SIGTERM. It turns
//! NOT_SERVING, stops consuming, writes a final checkpoint, lets in-flight queries finish and
//! exits 0 within a bound; restarted on the same data dir it has no tail to replay (its
//! checkpoint covers the whole log).

use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{KafkaConnection, LogSpec, Publisher};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::BlockHashes;
use prefixlog_state::{token_of, KvOp, Tier};
use prefixlog_tests::http::{http_get, sample};
use prefixlog_tests::{kafka_backends, unique_topic, KafkaBackend};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const P: u32 = 2;

fn serve(brokers: &str, topic: &str, dir: &std::path::Path, admin: SocketAddr, run: usize) -> Child {
    let log = std::fs::File::create(dir.join(format!("run-{run}.log"))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_prefixlog"))
        .args(["serve", "--brokers", brokers, "--topic", topic, "--partitions", "2", "--ready-lag", "0"])
        // No timed or counted checkpoints: only the final one can cover the log.
        .args(["--checkpoint-interval", "1h", "--checkpoint-records", "0", "--tick-interval", "0s"])
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

/// Waits until the replica's /metrics shows `next` as partition 0's next offset and it is ready.
async fn wait_ready_at(admin: SocketAddr, next: i64) {
    let metric = "prefixlog_partition_next_offset{partition=\"0\",shard=\"all\"}";
    let t = Instant::now();
    loop {
        let (code, m) = http_get(admin, "/metrics").await;
        let ready = http_get(admin, "/readyz").await.0 == 200;
        if code == 200 && ready && sample(&m, metric) == Some(next as f64) {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "replica on {admin} not ready at offset {next}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_a_clean_stop_with_a_final_checkpoint() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        clean_stop(&b).await;
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn clean_stop(b: &KafkaBackend) {
    let topic = unique_topic("prefixlog.sigterm");
    b.create_topic(&topic, P).await.unwrap();
    let brokers = b.brokers.clone();
    let spec = LogSpec::new(KafkaConnection::new(&brokers), &topic, P);
    let publisher = Publisher::new(&spec).unwrap();
    let ks = KeyspaceId::new("m", 16, 1);
    let mut landed = Vec::new();
    for w in 0..8u64 {
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: [(w << 8 | 1, 1), (w << 8 | 2, 2)].map(BlockHashes::from).to_vec(),
        }];
        landed.push(publisher.publish_kv_events(&ks, w, 0, 1, 1, false, &ops, None).await.unwrap());
    }
    let end = token_of(&landed);
    let end0 = end.iter().find(|t| t.partition == 0).map_or(0, |t| t.offset);
    let dir = tempfile::tempdir().unwrap();
    let admin = SocketAddr::from(([127, 0, 0, 1], prefixlog_node::loopback_port()));
    let mut child = serve(&brokers, &topic, dir.path(), admin, 0);
    wait_ready_at(admin, end0).await;

    let t = Instant::now();
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "serve did not exit within 30 s of SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = std::fs::read_to_string(dir.path().join("run-0.log")).unwrap();
    assert!(exit.success(), "exit {exit:?}; log:\n{log}");
    assert!(log.contains("signal=\"SIGTERM\"") || log.contains("signal=SIGTERM"), "{log}");
    assert!(log.contains("replica stopped cleanly"), "{log}");

    // The final checkpoint covers the whole log.
    let store = CheckpointStore::open_reader(&dir.path().join("data/checkpoints")).unwrap();
    let ids = store.ids();
    assert_eq!(ids.len(), 1, "only the final checkpoint: {ids:?}");
    let meta = store.meta(ids[0]).unwrap();
    assert_eq!(meta.covered_offsets(), end, "the final checkpoint covers every record");
    drop(store);

    // Restarted: restored from it, ready at the log's end with nothing to replay.
    let mut child = serve(&brokers, &topic, dir.path(), admin, 1);
    wait_ready_at(admin, end0).await;
    let log = std::fs::read_to_string(dir.path().join("run-1.log")).unwrap();
    assert!(log.contains("restored"), "{log}");
    child.kill().unwrap();
    child.wait().unwrap();
}
