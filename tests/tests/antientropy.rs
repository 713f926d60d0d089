//! Anti-entropy between live replicas (`ReplicaNode`s over gRPC, on every available backend):
//! agreement under ingest; a corrupted holder detected within one round and repaired by that
//! replica alone *while records keep arriving for every partition, the repaired one included*,
//! converging to a never-corrupted replica; a peer with other state settings reported as such,
//! never compared; an unreachable peer is not a divergence; bootstrap from a peer; a replica
//! restarted from its checkpoint agrees at every later point, and compares its digest points
//! from before the restart at once (checkpoints keep them); a hung peer delays no comparison
//! with the others; an overcount in the membership lists — invisible to anti-entropy, every
//! digest agrees — found by the scrubber and repaired under ingest.

use prefixlog_engine::{partition_of, HolderKey, KeyspaceId, MatchOptions};
use prefixlog_ingest::{KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{CheckpointPolicy, NodeOptions, ReplicaNode, StateSource};
use prefixlog_proto::v1 as pb;
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{token_of, Incompatible, KvOp, Landed, StateSettings, Tier};
use prefixlog_tests::{kafka_backends, unique_topic, KafkaBackend};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const P: u32 = 4;
const WORKERS: u64 = 10;

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

/// A fresh topic on the backend, as a log with digest points every 5 offsets.
async fn new_log(b: &KafkaBackend) -> LogSpec {
    let topic = unique_topic("prefixlog.ae");
    b.create_topic(&topic, P).await.unwrap();
    let settings = StateSettings { digest_interval: 5, ..Default::default() };
    LogSpec::new(KafkaConnection::new(&b.brokers), topic, P).with_settings(settings)
}

/// A replica with a data dir, checkpoints only when the test takes them, anti-entropy rounds
/// only when the test runs them, and the given peers.
fn opts(name: &str, dir: &std::path::Path, peers: Vec<String>) -> NodeOptions {
    NodeOptions {
        replica_id: name.into(),
        admin_addr: None,
        data_dir: Some(dir.to_path_buf()),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        peers,
        anti_entropy_interval: Duration::from_secs(3600),
        ..NodeOptions::default()
    }
}

fn peer(n: &ReplicaNode) -> String {
    n.peer_addr().unwrap().to_string()
}

/// Two replicas that know each other's peer port before either starts.
async fn pair(spec: &LogSpec, da: &std::path::Path, db: &std::path::Path) -> (ReplicaNode, ReplicaNode) {
    let (pa, pb) = (prefixlog_node::loopback_port(), prefixlog_node::loopback_port());
    let addr = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
    let a = NodeOptions { peer_addr: Some(addr(pa)), ..opts("a", da, vec![addr(pb).to_string()]) };
    let b = NodeOptions { peer_addr: Some(addr(pb)), ..opts("b", db, vec![addr(pa).to_string()]) };
    (ReplicaNode::start(spec.clone(), a).await.unwrap(), ReplicaNode::start(spec.clone(), b).await.unwrap())
}

/// One store per worker; chains accumulate (no clears), so a corrupted block stays corrupted.
async fn publish_round(p: &Publisher, round: u64, seqs: &mut [u64]) -> Vec<Landed> {
    let mut landed = Vec::new();
    for w in 0..WORKERS {
        seqs[w as usize] += 1;
        let base = round * 10;
        let blocks: Vec<BlockHashes> = (0..4)
            .map(|j| (w << 40 | (base + j) << 8 | j, 1 + (w + j) % 5 + base))
            .map(BlockHashes::from)
            .collect();
        let ops = [KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: None, blocks }];
        landed.push(p.publish_kv_events(&ks(), w, 0, 1, seqs[w as usize], false, &ops, None).await.unwrap());
    }
    landed
}

async fn publish_rounds(p: &Publisher, rounds: std::ops::Range<u64>, seqs: &mut [u64]) -> Vec<NextOffset> {
    let mut landed = Vec::new();
    for r in rounds {
        landed.extend(publish_round(p, r, seqs).await);
    }
    token_of(&landed)
}

async fn caught_up(nodes: &[&ReplicaNode], token: &[NextOffset]) {
    for n in nodes {
        assert!(n.status().wait_for(token, Duration::from_secs(60)).await, "caught up");
    }
}

fn digests(n: &ReplicaNode) -> Vec<(i64, u64)> {
    let a = n.applier().lock();
    (0..P).map(|p| (a.partition(p).next_offset, a.partition_digest(p))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_replica_repairs_itself_under_steady_ingest() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        repair_under_ingest(&backend).await;
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn repair_under_ingest(backend: &KafkaBackend) {
    let spec = new_log(backend).await;
    let publisher = Publisher::new(&spec).unwrap();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = pair(&spec, da.path(), db.path()).await;
    let mut seqs = vec![0u64; WORKERS as usize];
    for phase in 0..3 {
        let tok = publish_rounds(&publisher, phase * 6..phase * 6 + 6, &mut seqs).await;
        caught_up(&[&a, &b], &tok).await;
        a.checkpoint_now().unwrap();
        b.checkpoint_now().unwrap();
    }
    let r = a.anti_entropy_round().await.unwrap();
    assert!(r.compared >= 20, "{r:?}");
    assert!(r.mismatches.is_empty() && r.unreachable.is_empty() && r.incompatible.is_empty(), "{r:?}");
    assert!(b.anti_entropy_round().await.unwrap().mismatches.is_empty());

    // Fault: one holder on b silently loses a block.
    let victim = HolderKey::new(3, 0, 0);
    let q = partition_of(victim.worker, P);
    assert!(b.engine().keyspace(&ks()).unwrap().write(|k| k.corrupt_for_test(&victim)));
    let tok = publish_rounds(&publisher, 18..24, &mut seqs).await;
    caught_up(&[&a, &b], &tok).await;

    // From now on records keep arriving for every worker — the victim's partition included —
    // until the repair is over.
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (publisher, stop, rounds, mut seqs) =
            (publisher.clone(), stop.clone(), rounds.clone(), seqs.clone());
        tokio::spawn(async move {
            let mut round = 24;
            let mut landed = Vec::new();
            while !stop.load(Ordering::Acquire) {
                landed.extend(publish_round(&publisher, round, &mut seqs).await);
                round += 1;
                rounds.fetch_add(1, Ordering::AcqRel);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (token_of(&landed), seqs, round)
        })
    };
    // Rounds published, counted: the waits below are on them, not on time (bounded, so a
    // feeder that stopped fails the test instead of hanging it).
    let rounds_past = |n: u64| {
        let rounds = rounds.clone();
        async move {
            for _ in 0..6000 {
                if rounds.load(Ordering::Acquire) >= n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("the feeder never published round {n}");
        }
    };
    // Queries for a worker of another partition keep answering on b throughout.
    let other = (0..WORKERS).find(|&w| partition_of(w, P) != q).unwrap();
    let answered = Arc::new(AtomicU64::new(0));
    let querier = {
        let (engine, stop, answered) = (b.engine(), stop.clone(), answered.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let chain: Vec<u64> = (0..4).map(|j| 1 + (other + j) % 5 + 10).collect();
                if engine.match_chain(&ks(), &chain, &MatchOptions::default()).is_some() {
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    rounds_past(2).await;
    // The healthy replica sees the mismatch, self-checks, and leaves the repair to b.
    let ra = a.anti_entropy_round().await.unwrap();
    assert!(ra.mismatches.iter().any(|m| m.1 == q), "{ra:?}");
    assert!(ra.repaired.is_empty(), "the healthy replica does not rebuild: {ra:?}");
    // The corrupted replica detects it in one round and repairs partition q only, under ingest.
    let rb = b.anti_entropy_round().await.unwrap();
    assert!(rb.mismatches.iter().any(|m| m.1 == q), "{rb:?}");
    assert_eq!(rb.repaired, vec![q]);
    // Records go on arriving after the repair, and the other partition was answered meanwhile.
    rounds_past(rounds.load(Ordering::Acquire) + 2).await;
    for _ in 0..6000 {
        if answered.load(Ordering::Relaxed) > 0 || querier.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(answered.load(Ordering::Relaxed) > 0, "queries answered during the repair");
    stop.store(true, Ordering::Release);
    querier.join().unwrap();
    let (tok, mut seqs, round) = feeder.await.unwrap();
    let stats = &b.anti_entropy().unwrap().stats;
    assert_eq!(stats.repairs.get(), 1);
    assert!(stats.mismatches_total() >= 1);

    // They converge: equal digests at equal offsets, and at every later point.
    caught_up(&[&a, &b], &tok).await;
    assert_eq!(digests(&a), digests(&b));
    let tok = publish_rounds(&publisher, round..round + 6, &mut seqs).await;
    caught_up(&[&a, &b], &tok).await;
    let (ra, rb) = (a.anti_entropy_round().await.unwrap(), b.anti_entropy_round().await.unwrap());
    assert!(ra.mismatches.is_empty() && rb.mismatches.is_empty(), "{ra:?} {rb:?}");
    assert_eq!(digests(&a), digests(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_other_settings_is_reported_never_compared() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        settings_differ(&backend).await;
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn settings_differ(backend: &KafkaBackend) {
    let spec = new_log(backend).await;
    let publisher = Publisher::new(&spec).unwrap();
    let (da, dc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = ReplicaNode::start(spec.clone(), opts("a", da.path(), vec![])).await.unwrap();
    let other = StateSettings { placement_ttl_ms: 1_000, ..spec.settings };
    let c_spec = spec.clone().with_settings(other);
    let c = ReplicaNode::start(c_spec, opts("c", dc.path(), vec![peer(&a)])).await.unwrap();
    let mut seqs = vec![0u64; WORKERS as usize];
    let tok = publish_rounds(&publisher, 0..6, &mut seqs).await;
    caught_up(&[&a, &c], &tok).await;
    let r = c.anti_entropy_round().await.unwrap();
    assert_eq!(r.compared, 0, "{r:?}");
    assert!(r.mismatches.is_empty() && r.repaired.is_empty(), "{r:?}");
    assert!(
        matches!(&r.incompatible[..], [(_, Incompatible::Settings { differences })] if differences[0].contains("placement_ttl_ms")),
        "{r:?}"
    );
    let stats = &c.anti_entropy().unwrap().stats;
    assert_eq!(stats.mismatches_total(), 0);
    assert_eq!(stats.incompatible.with_label_values(&["settings_differ"]).get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_peer_is_not_a_divergence_and_bootstrap_fetches_a_checkpoint() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        unreachable_and_bootstrap(&backend).await;
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn unreachable_and_bootstrap(backend: &KafkaBackend) {
    let spec = new_log(backend).await;
    let publisher = Publisher::new(&spec).unwrap();
    let da = tempfile::tempdir().unwrap();
    let a = ReplicaNode::start(spec.clone(), opts("a", da.path(), vec!["127.0.0.1:1".into()])).await.unwrap();
    let r = a.anti_entropy_round().await.unwrap();
    assert_eq!(r.unreachable, vec!["127.0.0.1:1".to_string()]);
    assert!(r.mismatches.is_empty());
    assert_eq!(a.anti_entropy().unwrap().stats.unreachable.with_label_values(&["127.0.0.1:1"]).get(), 1);

    // Bootstrap: a new replica fetches a's checkpoint over gRPC and restores the same state.
    let mut seqs = vec![0u64; WORKERS as usize];
    let tok = publish_rounds(&publisher, 0..6, &mut seqs).await;
    caught_up(&[&a], &tok).await;
    let meta = a.checkpoint_now().unwrap().unwrap();
    let db = tempfile::tempdir().unwrap();
    let o = NodeOptions { bootstrap_from: Some(peer(&a)), ..opts("b", db.path(), vec![]) };
    let b = ReplicaNode::start(spec.clone(), o).await.unwrap();
    assert_eq!(b.source(), &StateSource::Peer { peer: peer(&a), checkpoint: meta.id });
    caught_up(&[&b], &tok).await;
    assert_eq!(digests(&a), digests(&b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_from_its_checkpoint_agrees_at_every_later_point() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        restart_agrees(&backend).await;
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn restart_agrees(backend: &KafkaBackend) {
    let spec = new_log(backend).await;
    let publisher = Publisher::new(&spec).unwrap();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = pair(&spec, da.path(), db.path()).await;
    let mut seqs = vec![0u64; WORKERS as usize];
    let tok = publish_rounds(&publisher, 0..12, &mut seqs).await;
    caught_up(&[&a, &b], &tok).await;
    b.checkpoint_now().unwrap();
    // More records b never sees before it stops: its restart must replay them.
    let tok = publish_rounds(&publisher, 12..18, &mut seqs).await;
    caught_up(&[&a], &tok).await;
    let peer_addr = b.peer_addr();
    b.kill().await;
    let o = NodeOptions { peer_addr, ..opts("b2", db.path(), vec![peer(&a)]) };
    let b2 = ReplicaNode::start(spec.clone(), o).await.unwrap();
    assert!(matches!(b2.source(), StateSource::LocalCheckpoint(_)), "{:?}", b2.source());
    let mut compared = 0;
    for phase in 3..6 {
        let tok = publish_rounds(&publisher, phase * 6..phase * 6 + 6, &mut seqs).await;
        caught_up(&[&a, &b2], &tok).await;
        let (ra, rb) = (a.anti_entropy_round().await.unwrap(), b2.anti_entropy_round().await.unwrap());
        assert!(ra.mismatches.is_empty() && rb.mismatches.is_empty(), "{ra:?} {rb:?}");
        compared += ra.compared + rb.compared;
        assert_eq!(digests(&a), digests(&b2));
    }
    assert!(compared >= 20, "points compared after the restart: {compared}");
}

/// A peer that accepts every call and never answers.
struct Hung;

#[tonic::async_trait]
impl pb::replica_peer_server::ReplicaPeer for Hung {
    async fn digests(
        &self,
        _: tonic::Request<pb::DigestsRequest>,
    ) -> Result<tonic::Response<pb::DigestsResponse>, tonic::Status> {
        std::future::pending().await
    }

    async fn holder_digests(
        &self,
        _: tonic::Request<pb::HolderDigestsRequest>,
    ) -> Result<tonic::Response<pb::HolderDigestsResponse>, tonic::Status> {
        std::future::pending().await
    }

    type FetchCheckpointStream = tonic::codegen::BoxStream<pb::CheckpointChunk>;

    async fn fetch_checkpoint(
        &self,
        _: tonic::Request<pb::FetchCheckpointRequest>,
    ) -> Result<tonic::Response<Self::FetchCheckpointStream>, tonic::Status> {
        std::future::pending().await
    }
}

/// Serves [`Hung`] on a loopback port; returns its address.
async fn hung_peer() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let incoming = tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .add_service(pb::replica_peer_server::ReplicaPeerServer::new(Hung))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_peer_delays_no_comparison_with_the_others() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        hung_and_healthy(&backend).await;
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn hung_and_healthy(backend: &KafkaBackend) {
    let spec = new_log(backend).await;
    let publisher = Publisher::new(&spec).unwrap();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = ReplicaNode::start(spec.clone(), opts("b", db.path(), vec![])).await.unwrap();
    let hung = hung_peer().await;
    // The hung peer first: asked one after the other, it would hold up the comparison with b.
    // The timeout is every peer's, b's too: long enough for b to answer on a loaded machine.
    let a_opts = NodeOptions {
        peer_timeout: Duration::from_secs(3),
        ..opts("a", da.path(), vec![hung.clone(), peer(&b)])
    };
    let a = ReplicaNode::start(spec.clone(), a_opts).await.unwrap();
    let mut seqs = vec![0u64; WORKERS as usize];
    let tok = publish_rounds(&publisher, 0..6, &mut seqs).await;
    caught_up(&[&a, &b], &tok).await;
    for round in 1..=2 {
        let r = a.anti_entropy_round().await.unwrap();
        assert_eq!(r.unreachable, vec![hung.clone()], "round {round}: {r:?}");
        assert!(r.compared >= 10 && r.mismatches.is_empty(), "round {round}: compared with b: {r:?}");
        let stats = &a.anti_entropy().unwrap().stats;
        assert_eq!(stats.unreachable.with_label_values(&[hung.as_str()]).get(), round);
        assert!(stats.last_success.with_label_values(&[peer(&b).as_str()]).get() > 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_points_survive_a_restart() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        points_survive(&backend).await;
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

fn points(n: &ReplicaNode) -> Vec<Vec<prefixlog_state::DigestPoint>> {
    n.applier().lock().all_digest_points()
}

async fn points_survive(backend: &KafkaBackend) {
    let spec = new_log(backend).await;
    let publisher = Publisher::new(&spec).unwrap();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = pair(&spec, da.path(), db.path()).await;
    let mut seqs = vec![0u64; WORKERS as usize];
    let tok = publish_rounds(&publisher, 0..12, &mut seqs).await;
    caught_up(&[&a, &b], &tok).await;
    a.checkpoint_now().unwrap();
    // A tail the checkpoint does not cover: replayed after the restart.
    let tok = publish_rounds(&publisher, 12..15, &mut seqs).await;
    caught_up(&[&a, &b], &tok).await;
    let before = points(&a);
    assert!(before.iter().map(Vec::len).sum::<usize>() >= 30, "{before:?}");
    let peer_addr = a.peer_addr();
    let peers = vec![peer(&b)];
    a.kill().await;
    let a2 = ReplicaNode::start(spec.clone(), NodeOptions { peer_addr, ..opts("a2", da.path(), peers) })
        .await
        .unwrap();
    assert!(matches!(a2.source(), StateSource::LocalCheckpoint(_)), "{:?}", a2.source());
    caught_up(&[&a2], &tok).await;
    assert_eq!(points(&a2), before, "every point from before the restart, the checkpoint's and the tail's");
    // Compared at once, before any new record.
    let r = a2.anti_entropy_round().await.unwrap();
    let all: usize = before.iter().map(Vec::len).sum();
    assert_eq!(r.compared as usize, all, "{r:?}");
    assert!(r.mismatches.is_empty(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrubber_finds_and_repairs_an_overcount_anti_entropy_cannot_see() {
    let mut ran = Vec::new();
    for backend in kafka_backends().await {
        scrub_repairs(&backend).await;
        ran.push(backend.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn scrub_repairs(backend: &KafkaBackend) {
    let spec = new_log(backend).await;
    let publisher = Publisher::new(&spec).unwrap();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (pa, pb_) = (prefixlog_node::loopback_port(), prefixlog_node::loopback_port());
    let addr = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
    // Scrub steps only when the test asks (the first interval tick steps once at start).
    let scrub = prefixlog_peer::ScrubOptions { interval: Duration::from_secs(3600), budget: 200 };
    let a =
        NodeOptions { peer_addr: Some(addr(pa)), scrub, ..opts("a", da.path(), vec![addr(pb_).to_string()]) };
    let b =
        NodeOptions { peer_addr: Some(addr(pb_)), scrub, ..opts("b", db.path(), vec![addr(pa).to_string()]) };
    let (a, b) = (
        ReplicaNode::start(spec.clone(), a).await.unwrap(),
        ReplicaNode::start(spec.clone(), b).await.unwrap(),
    );
    let mut seqs = vec![0u64; WORKERS as usize];
    let tok = publish_rounds(&publisher, 0..12, &mut seqs).await;
    caught_up(&[&a, &b], &tok).await;
    b.checkpoint_now().unwrap();
    let clean: Vec<_> = b.scrubber().unwrap().pass().await;
    assert!(clean.iter().all(|r| r.finding.is_none()), "a consistent replica passes: {clean:?}");

    // Fault: a membership no write made — b credits worker 3 with blocks it never stored.
    let victim = HolderKey::new(3, 0, 0);
    let q = partition_of(victim.worker, P);
    let chain =
        b.engine().keyspace(&ks()).unwrap().write(|k| k.corrupt_membership_for_test(&victim)).unwrap();
    let depth = |n: &ReplicaNode| {
        let m = n.engine().match_chain(&ks(), &chain, &MatchOptions::default()).unwrap();
        m.iter().find(|m| m.holder == victim).map_or(0, |m| m.depth)
    };
    assert!(depth(&b) > 0 && depth(&a) == 0, "an overcount on b");
    let r = b.anti_entropy_round().await.unwrap();
    assert!(
        r.compared > 0 && r.mismatches.is_empty(),
        "every digest agrees: anti-entropy cannot see it: {r:?}"
    );

    // Records keep arriving while the scrubber finds and repairs it.
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = {
        let (publisher, stop, mut seqs) = (publisher.clone(), stop.clone(), seqs.clone());
        tokio::spawn(async move {
            let (mut round, mut landed) = (12, Vec::new());
            while !stop.load(Ordering::Acquire) {
                landed.extend(publish_round(&publisher, round, &mut seqs).await);
                round += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (token_of(&landed), seqs, round)
        })
    };
    let reports = b.scrubber().unwrap().pass().await;
    let found: Vec<_> = reports.iter().filter_map(|r| r.finding.as_ref()).collect();
    assert_eq!(found.len(), 1, "{reports:?}");
    assert_eq!(found[0].1.partitions, vec![q], "{:?}", found[0]);
    assert_eq!(reports.iter().flat_map(|r| r.repaired.clone()).collect::<Vec<_>>(), vec![q]);
    stop.store(true, Ordering::Release);
    let (tok, mut seqs, round) = feeder.await.unwrap();
    caught_up(&[&a, &b], &tok).await;
    assert_eq!(depth(&b), 0, "no overcount after the repair");
    let o = MatchOptions { intervals: true, ..Default::default() };
    assert_eq!(b.engine().match_chain(&ks(), &chain, &o), a.engine().match_chain(&ks(), &chain, &o));
    assert_eq!(digests(&a), digests(&b));
    let stats = &b.scrubber().unwrap().stats;
    assert_eq!(stats.findings.with_label_values(&[q.to_string().as_str()]).get(), 1);
    assert_eq!(stats.repairs.with_label_values(&["repaired"]).get(), 1);
    // And the next pass finds nothing, with more records applied since.
    let tok = publish_rounds(&publisher, round..round + 3, &mut seqs).await;
    caught_up(&[&a, &b], &tok).await;
    let again = b.scrubber().unwrap().pass().await;
    assert!(again.iter().all(|r| r.finding.is_none()), "{again:?}");
    let (ra, rb) = (a.anti_entropy_round().await.unwrap(), b.anti_entropy_round().await.unwrap());
    assert!(ra.mismatches.is_empty() && rb.mismatches.is_empty(), "{ra:?} {rb:?}");
}
