//! Broker outage on tansu (an independent broker that keeps its log in SQLite across restarts).
//! Runs when `PREFIXLOG_TANSU_BIN` is set (scripts/with-tansu.sh sets it); it starts its own
//! tansu on its own port and data dir, so it can stop and restart it.
//!
//! Asserted: during the outage the replica keeps answering from its state and reports the
//! broker as unreachable; a publish made during the outage neither fails nor is lost — it stays
//! pending (back-pressure) and is acknowledged once the broker is back; afterwards the replica
//! resumes where it was and reaches the same digests as a replica that never saw the outage,
//! with every acknowledged record applied exactly once. Answers without a consistency token say
//! `stale` once the broker has been silent longer than `--stale-after` (the replica stays
//! ready), and fresh again once it is back (issue 34 item 8).

use prefixlog_engine::{KeyspaceId, MatchOptions};
use prefixlog_ingest::{LogSpec, Publisher};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_proto::v1::{
    match_request::Prompt, prefix_index_client::PrefixIndexClient, BlockHashes, MatchRequest,
};
use prefixlog_state::NextOffset;
use prefixlog_state::{token_of, KvOp, Landed, Tier};
use prefixlog_tests::replicas;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const P: u32 = 4;
const TOPIC: &str = "prefixlog.outage";

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

fn start_broker(bin: &str, dir: &std::path::Path, port: u16) -> Child {
    let url = format!("tcp://127.0.0.1:{port}");
    let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("broker.log")).unwrap();
    Command::new(bin)
        .current_dir(dir)
        .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
        .args(["--storage-engine", "sqlite://tansu.db"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start tansu")
}

async fn wait_port(port: u16) {
    // Up to 60 s: generous, CI is a loaded 2-core machine.
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("tansu did not listen on {port} within 60 s");
}

async fn replica(spec: &LogSpec, id: &str) -> ReplicaNode {
    replicas::replica(spec, id).await
}

/// Whether a token-less answer of `node` says stale.
async fn answers_stale(node: &ReplicaNode) -> bool {
    let req = MatchRequest {
        keyspace: Some(prefixlog_proto::v1::Keyspace { model: "m".into(), block_size: 16, hash_scheme: 1 }),
        prompt: Some(Prompt::Hashes(BlockHashes { local: vec![1] })),
        ..Default::default()
    };
    let mut c = PrefixIndexClient::connect(node.endpoint()).await.unwrap();
    c.r#match(req).await.unwrap().into_inner().stale
}

async fn until_stale(node: &ReplicaNode, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while answers_stale(node).await != want {
        assert!(Instant::now() < deadline, "token-less answers never said stale = {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn batch(w: u64, seq: u64) -> Vec<KvOp> {
    let blocks =
        (0..3).map(|j| prefixlog_state::BlockHashes::new(w << 32 | seq << 8 | j, 1 + j + seq * 10)).collect();
    vec![KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: None, blocks }]
}

async fn publish_phase(p: &Publisher, seqs: &mut [u64]) -> Vec<Landed> {
    let mut out = Vec::new();
    for w in 0..6u64 {
        seqs[w as usize] += 1;
        let s = seqs[w as usize];
        out.push(p.publish_kv_events(&ks(), w, 0, 1, s, false, &batch(w, s), None).await.expect("publish"));
    }
    out
}

fn token(l: &[Landed]) -> Vec<NextOffset> {
    token_of(l)
}

fn digests(r: &ReplicaNode) -> Vec<u64> {
    let a = r.applier().lock();
    (0..P).map(|p| a.partition_digest(p)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_survive_a_broker_outage() {
    let Ok(bin) = std::env::var("PREFIXLOG_TANSU_BIN") else {
        eprintln!("[outage] NOT RUN: PREFIXLOG_TANSU_BIN not set (run under scripts/with-tansu.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = prefixlog_tests::listen_port();
    let brokers = format!("127.0.0.1:{port}");
    let mut broker = start_broker(&bin, dir.path(), port);
    wait_port(port).await;
    let spec = replicas::spec(&brokers, TOPIC, P);
    prefixlog_ingest::create_topic(&spec.kafka, TOPIC, P, &[]).await.unwrap();
    let publisher = Publisher::new(&spec).unwrap();
    let opts = NodeOptions { stale_after: Duration::from_secs(2), ..replicas::options("a") };
    let a = ReplicaNode::start(spec.clone(), opts).await.unwrap();
    let mut seqs = vec![0u64; 6];
    let mut acked = publish_phase(&publisher, &mut seqs).await;
    assert!(a.status().wait_for(&token(&acked), Duration::from_secs(30)).await);
    let q: Vec<u64> = (0..3).map(|j| 1 + j + 10).collect();
    let before = a.applier().lock().engine().match_chain(&ks(), &q, &MatchOptions::default()).unwrap();
    assert!(!before.is_empty());

    // Outage.
    broker.kill().unwrap();
    broker.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.status().broker_ok.load(Ordering::Acquire) {
        assert!(Instant::now() < deadline, "the replica reports the broker as unreachable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let during = a.applier().lock().engine().match_chain(&ks(), &q, &MatchOptions::default()).unwrap();
    assert_eq!(during, before, "queries keep answering from the current state");
    until_stale(&a, true).await;
    assert!(a.ready().0, "a broker outage alone does not make the replica not ready");
    seqs[0] += 1;
    let s = seqs[0];
    let pending = {
        let p = publisher.clone();
        tokio::spawn(async move { p.publish_kv_events(&ks(), 0, 0, 1, s, false, &batch(0, s), None).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !pending.is_finished(),
        "a publish during the outage waits (back-pressure), it does not fail or vanish"
    );

    // The broker comes back on the same storage.
    let mut broker = start_broker(&bin, dir.path(), port);
    wait_port(port).await;
    acked.push(
        tokio::time::timeout(Duration::from_secs(60), pending).await.unwrap().unwrap().expect("acknowledged"),
    );
    acked.extend(publish_phase(&publisher, &mut seqs).await);
    assert!(a.status().wait_for(&token(&acked), Duration::from_secs(60)).await, "the replica resumed");
    until_stale(&a, false).await;

    // A replica that never saw the outage reaches the same state; every acknowledged record was
    // applied exactly once.
    let b = replica(&spec, "b").await;
    assert!(b.status().wait_for(&token(&acked), Duration::from_secs(60)).await);
    assert_eq!(a.status().offsets(), b.status().offsets());
    assert_eq!(digests(&a), digests(&b));
    let applied = a.status().records_applied.load(Ordering::Acquire);
    assert_eq!(applied as usize, acked.len(), "nothing acknowledged lost, nothing applied twice");
    assert_eq!(a.status().records_skipped.load(Ordering::Acquire), 0);
    broker.kill().unwrap();
    let _ = broker.wait();
    eprintln!("[outage] ran on tansu: {} acknowledged records, replicas agree", acked.len());
}
