//! The fault drill (issue 48), CI-sized: two replicas on the embedded broker, two gateways
//! writing KV events and asking with their own read-your-writes token in a steady stream, while
//! (a) each replica in turn stops cleanly (the SIGTERM path: NOT_SERVING, final checkpoint) and
//! restarts from its data dir, (b) one replica is killed abruptly and restarts, (c) one replica
//! is replaced by a new one from an empty disk. Every decision must be answered (0 blind), by a
//! replica at or past the gateway's token (0 stale), and afterwards both replicas' digests equal
//! a fresh replica's.

use prefixlog_client::{IndexClient, MatchOutcome, MatchQuery, Prompt};
use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{loopback_port, NodeOptions, ReplicaNode};
use prefixlog_state::record::encode_kv_events;
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{KvOp, Tier};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const P: u32 = 4;
const TOPIC: &str = "prefixlog.faults";
/// Debug build on a loaded 2-core machine: a generous deadline (the mechanism is the same at 20 ms).
const DEADLINE: Duration = Duration::from_secs(3);

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

/// One replica's fixed place: its gRPC port (gateways keep their endpoint list) and data dir.
struct Slot {
    id: String,
    grpc: SocketAddr,
    dir: PathBuf,
}

impl Slot {
    fn new(root: &std::path::Path, id: &str) -> Self {
        let grpc = SocketAddr::from(([127, 0, 0, 1], loopback_port()));
        Self { id: id.into(), grpc, dir: root.join(id) }
    }

    async fn start(&self, spec: &LogSpec) -> ReplicaNode {
        let opts = NodeOptions {
            replica_id: self.id.clone(),
            grpc_addr: self.grpc,
            admin_addr: None,
            data_dir: Some(self.dir.clone()),
            shutdown_grace: Duration::from_secs(2),
            ..NodeOptions::default()
        };
        let t = Instant::now();
        loop {
            // The port of the replica just stopped may take a moment to be free again.
            match ReplicaNode::start(spec.clone(), opts.clone()).await {
                Ok(n) => return n,
                Err(e) if t.elapsed() < Duration::from_secs(20) => {
                    tracing_free_wait(&e.to_string()).await;
                }
                Err(e) => panic!("replica {} does not start: {e}", self.id),
            }
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }
}

async fn tracing_free_wait(_why: &str) {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[derive(Default)]
struct Seen {
    decisions: AtomicU64,
    blind: AtomicU64,
    stale: AtomicU64,
}

/// A gateway: write one KV event of its own worker, then ask for that prefix with the landed
/// token, until `stop`.
async fn gateway(g: u64, client: IndexClient, publisher: Publisher, seen: Arc<Seen>, stop: Arc<AtomicBool>) {
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let worker = g * 100 + seq % 7;
        let blocks: Vec<BlockHashes> =
            (0..4).map(|b| (seq * 10 + b, seq * 10 + b)).map(BlockHashes::from).collect();
        let op = KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: None, blocks: blocks.clone() };
        let record = encode_kv_events(&ks(), worker, 0, 1, seq, false, &[op]);
        let landed = publisher.publish_raw(worker, &record, None).await.expect("publish");
        let q =
            MatchQuery::new(ks(), Prompt::Hashes(blocks.iter().map(|b| b.local).collect())).after(&[landed]);
        seen.decisions.fetch_add(1, Ordering::Relaxed);
        match client.match_prompt(&q).await {
            MatchOutcome::Scores(a) | MatchOutcome::Empty(a) => {
                let need = landed.token();
                let behind =
                    a.applied.iter().any(|at| at.partition == need.partition && at.offset < need.offset);
                if a.stale || behind || !a.scores.iter().any(|s| s.worker == worker) {
                    seen.stale.fetch_add(1, Ordering::Relaxed);
                }
            }
            MatchOutcome::Unavailable(why) => {
                eprintln!("gateway {g}: blind decision: {why:?}");
                seen.blind.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_ready(node: &ReplicaNode, publisher: &Publisher) {
    let all: Vec<u32> = (0..P).collect();
    let token: Vec<NextOffset> =
        publisher.publish_ticks(&all, None).await.expect("ticks").iter().map(|l| l.token()).collect();
    assert!(node.status().wait_for(&token, Duration::from_secs(60)).await, "replica never caught up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_see_no_blind_or_stale_answer_through_restarts_crashes_and_an_empty_disk() {
    let kafka = EmbeddedKafka::start(TOPIC, P).expect("embedded broker");
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), TOPIC, P);
    let root = tempfile::tempdir().unwrap();
    let slots = [Slot::new(root.path(), "r0"), Slot::new(root.path(), "r1")];
    let publisher = Publisher::new(&spec).unwrap();
    let mut nodes = vec![Some(slots[0].start(&spec).await), Some(slots[1].start(&spec).await)];
    for n in nodes.iter().flatten() {
        wait_ready(n, &publisher).await;
    }
    let (seen, stop) = (Arc::new(Seen::default()), Arc::new(AtomicBool::new(false)));
    let urls: Vec<String> = slots.iter().map(Slot::url).collect();
    let gateways: Vec<_> = (0..2)
        .map(|g| {
            let client = IndexClient::new(urls.clone(), DEADLINE).unwrap();
            tokio::spawn(gateway(g, client, publisher.clone(), seen.clone(), stop.clone()))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // (a) rolling restart: each replica stops cleanly (final checkpoint) and restarts from it.
    for (i, slot) in slots.iter().enumerate() {
        let stopped = nodes[i].take().unwrap().shutdown().await.expect("clean stop");
        assert!(stopped.final_checkpoint.is_some(), "{}: no final checkpoint on a clean stop", slot.id);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let n = slot.start(&spec).await;
        wait_ready(&n, &publisher).await;
        nodes[i] = Some(n);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // (b) kill -9 one replica mid-stream, restart it on the same disk.
    nodes[0].take().unwrap().kill().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = slots[0].start(&spec).await;
    wait_ready(&n, &publisher).await;
    nodes[0] = Some(n);
    // (c) replace the other replica by one from an empty disk.
    nodes[1].take().unwrap().shutdown().await.expect("clean stop");
    std::fs::remove_dir_all(&slots[1].dir).unwrap();
    let n = slots[1].start(&spec).await;
    wait_ready(&n, &publisher).await;
    nodes[1] = Some(n);
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for g in gateways {
        g.await.unwrap();
    }

    let decisions = seen.decisions.load(Ordering::Relaxed);
    let (blind, stale) = (seen.blind.load(Ordering::Relaxed), seen.stale.load(Ordering::Relaxed));
    eprintln!("faults drill: blind {blind} of {decisions}, stale {stale}");
    assert!(decisions > 50, "too few decisions to mean anything: {decisions}");
    assert_eq!(blind, 0, "blind (fail-open) decisions during faults");
    assert_eq!(stale, 0, "answers behind the caller's token");

    // Every replica, and one fresh from the log alone, hold the same state.
    let fresh = Slot::new(root.path(), "fresh").start(&spec).await;
    let mut all: Vec<ReplicaNode> = nodes.into_iter().flatten().collect();
    all.push(fresh);
    for n in &all {
        wait_ready(n, &publisher).await;
    }
    let digests: Vec<u64> = all.iter().map(|n| n.engine().digest()).collect();
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "digests differ: {digests:x?}");
    drop(publisher);
    for n in all {
        n.shutdown().await.unwrap();
    }
    tokio::task::spawn_blocking(prefixlog_ingest::log_spec::wait_for_closing_clients).await.unwrap();
}
