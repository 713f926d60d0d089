//! Anti-entropy between two live replicas: agreement under ingest, then a corrupted holder on
//! one replica is detected within one round and repaired by that replica alone; the other
//! self-checks as consistent; queries keep answering during the repair.

use prefixlog_engine::{partition_of, Engine, EngineConfig, HolderKey, KeyspaceId, MatchOptions};
use prefixlog_ingest::{
    Applier, ApplyConfig, EmbeddedKafka, KvOp, Publisher, PublisherConfig, Replica, ReplicaConfig,
};
use prefixlog_peer::{AntiEntropy, AntiEntropyStats, PeerService, RepairContext};
use prefixlog_snapshot::{checkpoint, CheckpointStore, LogIdentity};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const P: u32 = 4;
const TOPIC: &str = "prefixlog.ae";

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

struct Node {
    replica: Replica,
    store: Arc<CheckpointStore>,
    addr: String,
    ctx: RepairContext,
    _dir: tempfile::TempDir,
}

fn cfgs() -> (EngineConfig, ApplyConfig) {
    (
        EngineConfig { partitions: P, ..Default::default() },
        ApplyConfig { partitions: P, digest_every: 5, ..Default::default() },
    )
}

async fn node(brokers: &str, name: &str) -> Node {
    let (ecfg, acfg) = cfgs();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(CheckpointStore::open(dir.path()).unwrap());
    node_with(brokers, name, Applier::new(Arc::new(Engine::new(ecfg)), acfg), store, dir).await
}

/// A replica over `applier` (fresh, or restored from a checkpoint) with its peer server.
async fn node_with(
    brokers: &str,
    name: &str,
    applier: Applier,
    store: Arc<CheckpointStore>,
    dir: tempfile::TempDir,
) -> Node {
    let (ecfg, acfg) = cfgs();
    let rcfg =
        ReplicaConfig { brokers: brokers.into(), topic: TOPIC.into(), partitions: P, properties: vec![] };
    let replica = Replica::start(rcfg.clone(), applier).unwrap();
    let svc = PeerService {
        applier: replica.applier().clone(),
        store: Some(store.clone()),
        replica_id: name.into(),
        topic: TOPIC.into(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc.into_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let ctx = RepairContext { store: Some(store.clone()), log: rcfg, engine_cfg: ecfg, apply_cfg: acfg };
    Node { replica, store, addr, ctx, _dir: dir }
}

async fn publish_phase(p: &Publisher, phase: u64, seqs: &mut [u64]) -> Vec<(u32, i64)> {
    let mut landed = Vec::new();
    for round in 0..6u64 {
        for w in 0..10u64 {
            seqs[w as usize] += 1;
            let base = phase * 100 + round * 10;
            let blocks: Vec<(u64, u64)> =
                (0..4).map(|j| (w << 40 | (base + j) << 8 | j, 1 + (w + j) % 5 + base)).collect();
            // Chains accumulate (no clears), so a corrupted block stays corrupted.
            let ops = [KvOp::Stored { lane: 0, parent_ext: None, blocks }];
            let l = p.publish_kv_events(&ks(), w, 0, 1, seqs[w as usize], false, &ops, None).await.unwrap();
            landed.push((l.partition, l.offset));
        }
    }
    landed
}

fn anti_entropy(me: &Node, peer: &Node, stats: &Arc<AntiEntropyStats>) -> AntiEntropy {
    AntiEntropy {
        applier: me.replica.applier().clone(),
        peers: vec![peer.addr.clone()],
        ctx: me.ctx.clone(),
        stats: stats.clone(),
    }
}

fn digests(n: &Node) -> Vec<(i64, u64)> {
    let a = n.replica.applier().lock();
    (0..P).map(|p| (a.partition(p).next_offset, a.partition_digest(p))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatch_is_detected_and_the_corrupted_replica_repairs_itself() {
    let kafka = EmbeddedKafka::start(TOPIC, P).unwrap();
    let brokers = kafka.bootstrap_servers();
    let publisher = Publisher::new(PublisherConfig::new(&brokers, TOPIC, P)).unwrap();
    let (a, b) = (node(&brokers, "a").await, node(&brokers, "b").await);
    let (sa, sb) = (Arc::new(AntiEntropyStats::default()), Arc::new(AntiEntropyStats::default()));
    let (ae_a, ae_b) = (anti_entropy(&a, &b, &sa), anti_entropy(&b, &a, &sb));
    let identity = LogIdentity { cluster_id: "c".into(), topic: TOPIC.into(), partitions: P };
    let mut seqs = vec![0u64; 10];

    // Steady ingest, both agree.
    for phase in 0..3 {
        let tok = publish_phase(&publisher, phase, &mut seqs).await;
        for n in [&a, &b] {
            assert!(n.replica.status().wait_for(&tok, Duration::from_secs(30)).await);
            checkpoint(n.replica.applier(), &n.store, &identity).unwrap();
        }
    }
    let r = ae_a.round().await;
    assert!(r.compared >= 20, "{r:?}");
    assert!(r.mismatches.is_empty() && r.unreachable.is_empty(), "{r:?}");
    assert!(ae_b.round().await.mismatches.is_empty());

    // Fault: one holder on b silently loses a block.
    let victim = HolderKey::new(3, 0, 0);
    let q = partition_of(victim.worker, P);
    {
        let ap = b.replica.applier().lock();
        assert!(ap.engine().keyspace(&ks()).unwrap().write().corrupt_for_test(&victim));
    }
    let tok = publish_phase(&publisher, 3, &mut seqs).await;
    for n in [&a, &b] {
        assert!(n.replica.status().wait_for(&tok, Duration::from_secs(30)).await);
    }
    // A query loop on b for a worker of another partition runs throughout the repair.
    let other = (0..10u64).find(|&w| partition_of(w, P) != q).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let querier = {
        let (engine, stop, answered) =
            (b.replica.applier().lock().engine().clone(), stop.clone(), answered.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let q: Vec<u64> = (0..4).map(|j| 1 + (other + j) % 5 + 300 + 50).collect();
                if engine.match_chain(&ks(), &q, &MatchOptions::default()).is_some() {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    // The healthy replica sees the mismatch, self-checks, and leaves the repair to b.
    let ra = ae_a.round().await;
    assert!(ra.mismatches.iter().any(|m| m.1 == q), "{ra:?}");
    assert!(ra.repaired.is_empty(), "the healthy replica does not rebuild: {ra:?}");
    // The corrupted replica detects it in one round and repairs partition q only.
    let rb = ae_b.round().await;
    assert!(rb.mismatches.iter().any(|m| m.1 == q), "{rb:?}");
    assert_eq!(rb.repaired, vec![q]);
    stop.store(true, Ordering::Release);
    querier.join().unwrap();
    assert!(answered.load(Ordering::Relaxed) > 0, "queries answered during the repair");
    assert_eq!(sb.repairs.load(Ordering::Relaxed), 1);
    assert!(sb.mismatches_total() >= 1);

    // They agree again, at equal offsets and at every later point.
    assert_eq!(digests(&a), digests(&b));
    let tok = publish_phase(&publisher, 4, &mut seqs).await;
    for n in [&a, &b] {
        assert!(n.replica.status().wait_for(&tok, Duration::from_secs(30)).await);
    }
    let (ra, rb) = (ae_a.round().await, ae_b.round().await);
    assert!(ra.mismatches.is_empty() && rb.mismatches.is_empty(), "{ra:?} {rb:?}");
    assert_eq!(digests(&a), digests(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_peer_is_reported_not_a_divergence_and_bootstrap_fetches_a_checkpoint() {
    let kafka = EmbeddedKafka::start(TOPIC, P).unwrap();
    let brokers = kafka.bootstrap_servers();
    let publisher = Publisher::new(PublisherConfig::new(&brokers, TOPIC, P)).unwrap();
    let a = node(&brokers, "a").await;
    let stats = Arc::new(AntiEntropyStats::default());
    let ae = AntiEntropy {
        applier: a.replica.applier().clone(),
        peers: vec!["127.0.0.1:1".into()],
        ctx: a.ctx.clone(),
        stats: stats.clone(),
    };
    let r = ae.round().await;
    assert_eq!(r.unreachable, vec!["127.0.0.1:1".to_string()]);
    assert!(r.mismatches.is_empty());
    assert_eq!(stats.peers.lock()["127.0.0.1:1"].0, 1);

    // Bootstrap: a new replica fetches a's checkpoint over gRPC and restores the same state.
    let mut seqs = vec![0u64; 10];
    let tok = publish_phase(&publisher, 0, &mut seqs).await;
    assert!(a.replica.status().wait_for(&tok, Duration::from_secs(30)).await);
    let identity = LogIdentity { cluster_id: "c".into(), topic: TOPIC.into(), partitions: P };
    let meta = checkpoint(a.replica.applier(), &a.store, &identity).unwrap().0;
    let dir = tempfile::tempdir().unwrap();
    let fresh = CheckpointStore::open(dir.path()).unwrap();
    let got = prefixlog_peer::fetch_checkpoint(&a.addr, &fresh).await.unwrap();
    assert_eq!((got.offsets.clone(), got.holder_blocks()), (meta.offsets.clone(), meta.holder_blocks()));
    let l = fresh.load(got.id).unwrap();
    let restored =
        prefixlog_snapshot::restore(&l, a.ctx.engine_cfg.clone(), a.ctx.apply_cfg.clone()).unwrap();
    let want = digests(&a);
    for p in 0..P {
        assert_eq!(restored.partition_digest(p), want[p as usize].1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_from_a_checkpoint_agrees_with_its_peer_at_every_later_point() {
    let kafka = EmbeddedKafka::start(TOPIC, P).unwrap();
    let brokers = kafka.bootstrap_servers();
    let publisher = Publisher::new(PublisherConfig::new(&brokers, TOPIC, P)).unwrap();
    let (a, b) = (node(&brokers, "a").await, node(&brokers, "b").await);
    let identity = LogIdentity { cluster_id: "c".into(), topic: TOPIC.into(), partitions: P };
    let mut seqs = vec![0u64; 10];
    for phase in 0..2 {
        let tok = publish_phase(&publisher, phase, &mut seqs).await;
        for n in [&a, &b] {
            assert!(n.replica.status().wait_for(&tok, Duration::from_secs(30)).await);
        }
    }
    checkpoint(b.replica.applier(), &b.store, &identity).unwrap();
    // More records b never sees before it stops: its restart must replay them.
    let tok = publish_phase(&publisher, 2, &mut seqs).await;
    assert!(a.replica.status().wait_for(&tok, Duration::from_secs(30)).await);
    let Node { replica, store, _dir, .. } = b;
    drop(replica.stop());
    let loaded = store.load(store.ids()[0]).unwrap();
    let (ecfg, acfg) = cfgs();
    let restored = prefixlog_snapshot::restore(&loaded, ecfg, acfg).unwrap();
    let b2 = node_with(&brokers, "b2", restored, store, _dir).await;
    let stats = Arc::new(AntiEntropyStats::default());
    let (ae_a, ae_b) = (anti_entropy(&a, &b2, &stats), anti_entropy(&b2, &a, &stats));
    let mut compared = 0;
    for phase in 3..6 {
        let tok = publish_phase(&publisher, phase, &mut seqs).await;
        for n in [&a, &b2] {
            assert!(n.replica.status().wait_for(&tok, Duration::from_secs(30)).await);
        }
        let (ra, rb) = (ae_a.round().await, ae_b.round().await);
        assert!(ra.mismatches.is_empty() && rb.mismatches.is_empty(), "{ra:?} {rb:?}");
        compared += ra.compared + rb.compared;
        assert_eq!(digests(&a), digests(&b2));
    }
    assert!(compared >= 20, "points compared after the restart: {compared}");
}
