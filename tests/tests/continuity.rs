//! The log's continuity is checked, never assumed (issue 14): retention drills, a log that ends
//! before the state (truncated or recreated topic), and partitions the log stops continuing at
//! run time — refused, recovered from a peer's checkpoint, or (opted in) accepted with the
//! partition's holders marked gapped. Never a diverged state served as ready.
//!
//! Backends: the retention drills need a broker that deletes a partition's head — the embedded
//! broker does (its fixed size retention, 5 MiB per partition); tansu implements neither
//! retention nor DeleteRecords (it drops the connection), so there they report NOT RUN. The
//! recreated-topic drill needs topic deletion: tansu has it, the embedded broker does not. The
//! crafted "log ends before the checkpoint" case runs everywhere.

use prefixlog_engine::{partition_of, HolderKey, KeyspaceId};
use prefixlog_ingest::{probe_log, KafkaConnection, LogSpec, Publisher};
use prefixlog_node::{CheckpointPolicy, GapChoice, NodeError, NodeOptions, ReplicaNode, StateSource};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::record::{encode_tick, worker_for_partition};
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{token_of, KvOp, Landed, StateSettings, Tier};
use prefixlog_tests::{kafka_backends, unique_topic, KafkaBackend};
use std::time::Duration;

const P: u32 = 2;
const WORKERS: u64 = 6;

/// The tests of this file take turns: on tansu (one SQLite store, writes serialised) a topic
/// deleted and recreated under other tests' production and probes made them fail (CreateTopics
/// timed out, a produce got an unknown broker error, a start was refused for the wrong reason).
static BROKER_HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

/// A small prefetch queue, so a replica that stops applying cannot hold the whole log locally.
fn spec(b: &KafkaBackend, topic: &str) -> LogSpec {
    let kafka = KafkaConnection::new(&b.brokers)
        .with_properties(vec![("queued.max.messages.kbytes".into(), "512".into())]);
    LogSpec::new(kafka, topic, P).with_settings(StateSettings { digest_interval: 5, ..Default::default() })
}

fn opts(name: &str, dir: Option<&std::path::Path>) -> NodeOptions {
    NodeOptions {
        replica_id: name.into(),
        admin_addr: None,
        data_dir: dir.map(|d| d.to_path_buf()),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        anti_entropy_interval: Duration::from_secs(3600),
        ..NodeOptions::default()
    }
}

async fn publish(p: &Publisher, round: u64, seqs: &mut [u64]) -> Vec<Landed> {
    let mut landed = Vec::new();
    for w in 0..WORKERS {
        seqs[w as usize] += 1;
        let blocks: Vec<BlockHashes> =
            (0..3).map(|j| (w << 40 | round << 8 | j, 1 + j + round * 10)).map(BlockHashes::from).collect();
        let ops = [KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: None, blocks }];
        landed.push(p.publish_kv_events(&ks(), w, 0, 1, seqs[w as usize], false, &ops, None).await.unwrap());
    }
    landed
}

/// Valid tick records for `partition` padded to ~64 KiB each (an unknown protobuf field, which
/// readers skip), `mib` MiB in all: enough to push the embedded broker's 5 MiB retention past
/// everything published before.
async fn pad(p: &Publisher, partition: u32, mib: usize) -> Vec<Landed> {
    let w = worker_for_partition(partition, P);
    let mut v = encode_tick(w);
    let filler = vec![0u8; 64 << 10];
    v.push(15 << 3 | 2); // field 15, length-delimited
    let mut len = filler.len();
    while len >= 0x80 {
        v.push((len as u8) | 0x80);
        len >>= 7;
    }
    v.push(len as u8);
    v.extend_from_slice(&filler);
    let mut out = Vec::new();
    for _ in 0..mib * 16 {
        out.push(p.publish_raw(w, &v, None).await.unwrap());
    }
    out
}

async fn caught_up(n: &ReplicaNode, token: &[NextOffset]) {
    assert!(n.status().wait_for(token, Duration::from_secs(60)).await, "caught up");
}

fn digests(n: &ReplicaNode) -> Vec<(i64, u64)> {
    let a = n.applier().lock();
    (0..P).map(|p| (a.partition(p).next_offset, a.partition_digest(p))).collect()
}

fn gapped(n: &ReplicaNode, worker: u64) -> bool {
    let e = n.engine();
    let ks = e.keyspace(&ks()).unwrap();
    let g = ks.read();
    g.holder(&HolderKey::new(worker, 0, 0)).is_some_and(|h| h.gapped)
}

fn worker_of(partition: u32) -> u64 {
    (0..WORKERS).find(|&w| partition_of(w, P) == partition).unwrap()
}

/// Deletes the partition's head past everything published so far (embedded broker only).
/// Returns whether it could.
async fn cut_head(b: &KafkaBackend, spec: &LogSpec, publisher: &Publisher, before: i64) -> bool {
    if b.name != "embedded" {
        eprintln!(
            "[continuity] {}: NOT RUN: this broker deletes no records (no retention, no DeleteRecords)",
            b.name
        );
        return false;
    }
    pad(publisher, 0, 7).await;
    let low = probe_log(spec).unwrap().low(0);
    assert!(low > before, "retention deleted the head past offset {before} (log starts at {low})");
    true
}

/// The retention drill at start: the log's head was deleted past a replica's checkpoint. It
/// refuses to start; with a peer whose checkpoint the log continues it takes the partition
/// from it and ends equal to the never-stopped reference; with `--accept-log-gaps` it starts
/// with that partition's holders gapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_behind_retention_is_refused_or_replaced_from_a_peer() {
    let _turn = BROKER_HEAVY.lock().await;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.retention");
        b.create_topic(&topic, P).await.unwrap();
        let spec = spec(&b, &topic);
        let publisher = Publisher::new(&spec).unwrap();
        let (dr, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let r = ReplicaNode::start(spec.clone(), opts("reference", Some(dr.path()))).await.unwrap();
        let node_b = ReplicaNode::start(spec.clone(), opts("b", Some(db.path()))).await.unwrap();
        let mut seqs = vec![0u64; WORKERS as usize];
        let mut landed = Vec::new();
        for round in 0..3 {
            landed.extend(publish(&publisher, round, &mut seqs).await);
        }
        caught_up(&node_b, &token_of(&landed)).await;
        let ck = node_b.checkpoint_now().unwrap().unwrap();
        node_b.kill().await;
        if !cut_head(&b, &spec, &publisher, ck.offsets[0]).await {
            continue;
        }
        for round in 3..5 {
            landed.extend(publish(&publisher, round, &mut seqs).await);
        }
        let all = token_of(&[landed.clone(), pad(&publisher, 1, 0).await].concat());
        caught_up(&r, &all).await;
        r.checkpoint_now().unwrap();

        // No peer: refused, naming the partition, the offsets and the remedies.
        let err = ReplicaNode::start(spec.clone(), opts("b", Some(db.path()))).await.err().expect("refused");
        let msg = err.to_string();
        assert!(matches!(err, NodeError::LogDoesNotContinue { .. }), "{msg}");
        assert!(msg.contains("partition 0") && msg.contains("deleted by retention"), "{msg}");
        assert!(msg.contains("--bootstrap-from") && msg.contains("--accept-log-gaps"), "{msg}");
        // A fresh replica without a checkpoint would replay an incomplete log: refused too.
        let err = ReplicaNode::start(spec.clone(), opts("fresh", None)).await.err().expect("refused");
        assert!(matches!(err, NodeError::LogDoesNotContinue { .. }), "{err}");

        // With a peer: partition 0 from the peer's checkpoint, partition 1 from its own.
        let o = NodeOptions { peers: vec![r.peer_addr().unwrap().to_string()], ..opts("b", Some(db.path())) };
        let b2 = ReplicaNode::start(spec.clone(), o).await.unwrap();
        assert!(matches!(b2.source(), StateSource::LocalCheckpoint(_)), "{:?}", b2.source());
        caught_up(&b2, &all).await;
        assert_eq!(digests(&b2), digests(&r), "{}: equal to the never-stopped reference", b.name);
        assert!(b2.ready().0 || b2.status().discontinuous().is_empty());
        b2.kill().await;

        // Opted in: starts, partition 0's holders gapped (a removal may be among the lost
        // records), partition 1's not.
        let o = NodeOptions { gaps: GapChoice::Accept, ..opts("b", Some(db.path())) };
        let b3 = ReplicaNode::start(spec.clone(), o).await.unwrap();
        caught_up(&b3, &all).await;
        assert!(gapped(&b3, worker_of(0)) && !gapped(&b3, worker_of(1)), "{}", b.name);
        assert_eq!(b3.applier().lock().partition(0).counters.log_gaps, 1);
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// The retention drill at run time: a replica falls behind retention (it stops applying while
/// the broker deletes records it has not read). The partition halts — discontinuous, counted,
/// not ready — and, with a peer configured, recovers from the peer's checkpoint and ends equal
/// to the reference. With `--accept-log-gaps` it reads on with the partition's holders gapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// The applier lock is held across awaits on purpose: it is what stalls the replica's ingest
// while the broker's retention runs.
#[allow(clippy::await_holding_lock)]
async fn a_replica_that_falls_behind_retention_halts_then_recovers_from_a_peer() {
    let _turn = BROKER_HEAVY.lock().await;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        if b.name != "embedded" {
            eprintln!("[continuity] {}: NOT RUN: this broker deletes no records", b.name);
            continue;
        }
        for accept in [false, true] {
            let topic = unique_topic("prefixlog.behind");
            b.create_topic(&topic, P).await.unwrap();
            let spec = spec(&b, &topic);
            let publisher = Publisher::new(&spec).unwrap();
            let dr = tempfile::tempdir().unwrap();
            let r = ReplicaNode::start(spec.clone(), opts("reference", Some(dr.path()))).await.unwrap();
            let mut o = opts("b", None);
            if accept {
                o.gaps = GapChoice::Accept;
            } else {
                o.peers = vec![r.peer_addr().unwrap().to_string()];
            }
            let node_b = ReplicaNode::start(spec.clone(), o).await.unwrap();
            let mut seqs = vec![0u64; WORKERS as usize];
            let landed = publish(&publisher, 0, &mut seqs).await;
            caught_up(&node_b, &token_of(&landed)).await;
            let before = node_b.status().offsets()[0].offset;
            {
                // b stops applying (its ingest thread waits on the applier) while the log moves
                // on and retention deletes what b has not read.
                let _stalled = node_b.applier().lock();
                let more = publish(&publisher, 1, &mut seqs).await;
                assert!(cut_head(&b, &spec, &publisher, before + more.len() as i64).await);
            }
            let end =
                token_of(&[publish(&publisher, 2, &mut seqs).await, pad(&publisher, 1, 0).await].concat());
            caught_up(&r, &end).await;
            if accept {
                caught_up(&node_b, &end).await;
                assert!(gapped(&node_b, worker_of(0)) && !gapped(&node_b, worker_of(1)));
                assert_eq!(node_b.applier().lock().partition(0).counters.log_gaps, 1);
                assert!(node_b.status().discontinuous().is_empty(), "accepted: reading on");
            } else {
                // Halted and not ready until the peer's checkpoint replaces the partition.
                r.checkpoint_now().unwrap();
                caught_up(&node_b, &end).await;
                assert_eq!(digests(&node_b), digests(&r), "recovered from the peer: equal to the reference");
                assert!(!gapped(&node_b, worker_of(0)));
            }
            let st = &node_b.status().partitions[0];
            assert_eq!(st.discontinuities.load(std::sync::atomic::Ordering::Relaxed), 1, "counted once");
        }
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// A log that ends before a checkpoint (the topic was truncated or recreated): refused, or with
/// `--accept-log-gaps` read from the log's start with the partition's holders gapped. The
/// checkpoint's offsets are moved past the log's end on disk (every backend); where the broker
/// can delete topics, the topic is also really deleted and recreated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_ends_before_the_checkpoint_is_refused() {
    let _turn = BROKER_HEAVY.lock().await;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.rewind");
        b.create_topic(&topic, P).await.unwrap();
        let spec = spec(&b, &topic);
        let publisher = Publisher::new(&spec).unwrap();
        let d = tempfile::tempdir().unwrap();
        let a = ReplicaNode::start(spec.clone(), opts("a", Some(d.path()))).await.unwrap();
        let mut seqs = vec![0u64; WORKERS as usize];
        let landed = publish(&publisher, 0, &mut seqs).await;
        caught_up(&a, &token_of(&landed)).await;
        let ck = a.checkpoint_now().unwrap().unwrap();
        a.kill().await;
        // The checkpoint claims more of partition 0 than the log has.
        {
            let store = CheckpointStore::open(&d.path().join("checkpoints")).unwrap();
            let l = store.load(ck.id).unwrap();
            let mut state = prefixlog_snapshot::Capture::of(&prefixlog_snapshot::restore(&l).unwrap());
            state.partitions[0].next_offset += 1_000;
            store.write(&l.meta.identity, &state, 0).unwrap();
        }
        let err = ReplicaNode::start(spec.clone(), opts("a", Some(d.path()))).await.err().expect("refused");
        assert!(err.to_string().contains("recreated or truncated"), "{}: {err}", b.name);
        let o = NodeOptions { gaps: GapChoice::Accept, ..opts("a", Some(d.path())) };
        let a2 = ReplicaNode::start(spec.clone(), o).await.unwrap();
        assert!(gapped(&a2, worker_of(0)) && !gapped(&a2, worker_of(1)), "{}", b.name);
        // It read partition 0 again from the log's start: the same records, all duplicates now.
        caught_up(&a2, &token_of(&landed)).await;
        {
            let a = a2.applier().lock();
            assert_eq!((a.partition(0).counters.log_gaps, a.partition(1).counters.log_gaps), (1, 0));
            assert!(a.partition(0).counters.duplicates > 0, "{}", b.name);
        }
        a2.kill().await;
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// A topic deleted and recreated (offsets start again at 0) is never papered over: a restart
/// from a checkpoint of the old topic is refused. Needs a broker that deletes topics (tansu,
/// Kafka). The replica and every client of the topic stop first: librdkafka 2.12 corrupts its
/// metadata cache when a topic it knows comes back with a new topic id and crashes the process
/// (confluentinc/librdkafka#4964) — a replica running through a recreation dies, and this
/// check is what its restart meets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_topic_refuses_the_restart() {
    let _turn = BROKER_HEAVY.lock().await;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        if b.name == "embedded" {
            eprintln!("[continuity] embedded: NOT RUN: the embedded broker cannot delete topics");
            continue;
        }
        let topic = unique_topic("prefixlog.recreated");
        b.create_topic(&topic, P).await.unwrap();
        let spec = spec(&b, &topic);
        let d = tempfile::tempdir().unwrap();
        let mut seqs = vec![0u64; WORKERS as usize];
        {
            let publisher = Publisher::new(&spec).unwrap();
            let a = ReplicaNode::start(spec.clone(), opts("a", Some(d.path()))).await.unwrap();
            let landed =
                [publish(&publisher, 0, &mut seqs).await, publish(&publisher, 1, &mut seqs).await].concat();
            caught_up(&a, &token_of(&landed)).await;
            a.checkpoint_now().unwrap();
            a.kill().await;
        }
        prefixlog_ingest::delete_topic(&spec.kafka, &topic).await.unwrap();
        // The broker finishes the deletion in its own time: create again until it takes (a
        // bounded number of tries, so a broker that never lets go fails instead of hanging).
        let mut created = b.create_topic(&topic, P).await;
        for _ in 0..100 {
            if created.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            created = b.create_topic(&topic, P).await;
        }
        created.unwrap_or_else(|e| panic!("{}: the topic is not created again: {e}", b.name));
        let publisher = Publisher::new(&spec).unwrap();
        let mut new_seqs = vec![0u64; WORKERS as usize];
        publish(&publisher, 9, &mut new_seqs).await;
        let err = ReplicaNode::start(spec.clone(), opts("a", Some(d.path()))).await.err().expect("refused");
        assert!(err.to_string().contains("recreated or truncated"), "{}: {err}", b.name);
        // The new topic grows past the checkpoint's offsets: the offsets alone now fit, but the
        // record before each is another one.
        for round in 10..13 {
            publish(&publisher, round, &mut new_seqs).await;
        }
        let err = ReplicaNode::start(spec.clone(), opts("a", Some(d.path()))).await.err().expect("refused");
        assert!(matches!(err, NodeError::LogDoesNotContinue { .. }), "{}: {err}", b.name);
        assert!(err.to_string().contains("is not the one the state applied"), "{}: {err}", b.name);
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// A state's record fingerprints read back from its own log match, and a fingerprint of another
/// record is found out (what tells a recreated topic that has grown past a checkpoint from the
/// log it came from; the recreation itself is the drill above). Runs on every backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_marks_tell_the_log_a_state_came_from() {
    use prefixlog_ingest::continuity::{check_marks, OffsetProblem};
    use prefixlog_ingest::{apply_log, ApplyLogError};
    use prefixlog_state::Applier;
    use prefixlog_state::Until;
    let _turn = BROKER_HEAVY.lock().await;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.marks");
        b.create_topic(&topic, P).await.unwrap();
        let spec = spec(&b, &topic);
        let publisher = Publisher::new(&spec).unwrap();
        let mut seqs = vec![0u64; WORKERS as usize];
        let landed =
            [publish(&publisher, 0, &mut seqs).await, publish(&publisher, 1, &mut seqs).await].concat();
        let a = ReplicaNode::start(spec.clone(), opts("m", None)).await.unwrap();
        caught_up(&a, &token_of(&landed)).await;
        let marks: Vec<(u32, i64, u64)> = {
            let app = a.applier().lock();
            (0..P).map(|p| (p, app.partition(p).next_offset, app.partition(p).last_mark)).collect()
        };
        a.kill().await;
        assert!(marks.iter().all(|&(_, o, m)| o > 0 && m != 0), "{}: {marks:?}", b.name);
        let probe = probe_log(&spec).unwrap();
        let wait = Duration::from_secs(30);
        assert_eq!(check_marks(&spec, &marks, &probe, wait).unwrap(), vec![], "{}", b.name);
        let mut other = marks.clone();
        other[1].2 ^= 1;
        let found = check_marks(&spec, &other, &probe, wait).unwrap();
        assert_eq!(found, vec![OffsetProblem::Replaced { partition: 1, state: marks[1].1 }], "{}", b.name);
        // Unknown marks (a checkpoint of an older format) and offset 0 are not checked.
        let unknown: Vec<_> = marks.iter().map(|&(p, o, _)| (p, o, 0)).chain([(0, 0, 7)]).collect();
        assert_eq!(check_marks(&spec, &unknown, &probe, wait).unwrap(), vec![], "{}", b.name);

        // Applying the log to a target (audits, repairs) starts at the record before the
        // state's offsets and checks it the same way, at no extra read.
        let more = publish(&publisher, 2, &mut seqs).await;
        let until = Until::Offsets(token_of(&more).into_iter().map(|t| (t.partition, t.offset)).collect());
        let at_landed = || {
            let mut app = Applier::new(P, spec.settings);
            let until =
                Until::Offsets(token_of(&landed).into_iter().map(|t| (t.partition, t.offset)).collect());
            apply_log(&spec, &mut app, &until, Default::default()).unwrap();
            app
        };
        let (mut at_marks, mut wrong) = (at_landed(), at_landed());
        let mut parts = wrong.partitions().to_vec();
        parts[1].last_mark ^= 1;
        wrong.restore_partitions(parts);
        match apply_log(&spec, &mut wrong, &until, Default::default()) {
            Err(ApplyLogError::NotContinued(OffsetProblem::Replaced { partition: 1, .. })) => {}
            other => panic!("{}: {other:?}", b.name),
        }
        apply_log(&spec, &mut at_marks, &until, Default::default()).expect("the same log");
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// A compacted topic is refused at start (compaction drops a worker's earlier records, which no
/// offset check would notice). Runs where the broker describes topic configs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_is_refused() {
    use prefixlog_ingest::{cleanup_policy, CleanupPolicy};
    let _turn = BROKER_HEAVY.lock().await;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        if b.name == "embedded" {
            eprintln!("[continuity] embedded: NOT RUN: the embedded broker has no topic configs");
            continue;
        }
        let topic = unique_topic("prefixlog.compacted");
        let spec = spec(&b, &topic);
        prefixlog_ingest::create_topic(&spec.kafka, &topic, P, &[("cleanup.policy", "compact")])
            .await
            .unwrap();
        match cleanup_policy(&spec).await {
            CleanupPolicy::Compacted(_) => {
                let err = ReplicaNode::start(spec, opts("c", None)).await.err().expect("refused");
                assert!(matches!(err, NodeError::CompactedTopic { .. }), "{}: {err}", b.name);
                ran.push(b.name);
            }
            other => eprintln!(
                "[continuity] {}: NOT RUN: the broker reports {other:?} for a compacted topic",
                b.name
            ),
        }
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// A replica applying records while they are published never reports a rewind: its watermark
/// is polled, so the next offset often runs past the last polled watermark, and that alone must
/// not read as "the log ends before the state" (a readiness flap seen by a gateway).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingesting_while_the_log_grows_never_reads_as_a_rewind() {
    let _turn = BROKER_HEAVY.lock().await;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.growing");
        b.create_topic(&topic, P).await.unwrap();
        let spec = spec(&b, &topic);
        let publisher = Publisher::new(&spec).unwrap();
        let a = ReplicaNode::start(spec.clone(), opts("a", None)).await.unwrap();
        let status = a.status().clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watcher = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seen = std::collections::BTreeSet::new();
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    seen.extend(status.rewound());
                    std::thread::sleep(Duration::from_micros(200));
                }
                seen
            })
        };
        let mut seqs = vec![0u64; WORKERS as usize];
        let mut landed = Vec::new();
        for round in 0..200 {
            landed = publish(&publisher, round, &mut seqs).await;
        }
        caught_up(&a, &token_of(&landed)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, std::sync::atomic::Ordering::Release);
        let seen = watcher.join().unwrap();
        assert!(seen.is_empty(), "{}: rewound reported for partitions {seen:?} during ingest", b.name);
        assert!(a.status().rewound().is_empty() && a.status().lag() == 0, "{}", b.name);
        a.kill().await;
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}
