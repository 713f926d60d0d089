//! A transactional producer never puts replicas into a loop (issue 34 item 4).
//!
//! A transaction ends with a marker (a control record) that takes an offset in each of its
//! partitions, and librdkafka never hands a control record to the application: a replica's
//! reader meets a hole in the offsets. Nothing librdkafka exposes proves a hole harmless (a
//! second read with `read_uncommitted` shows aborted records, never markers), so the replica
//! refuses it once: the partition halts, the hole is named (partition, offsets, cause) in the
//! readiness reason and the error log, counted in `prefixlog_log_holes_total{cause}`; and
//! recovery never swaps in a peer's state that ends before the hole (which would meet it again:
//! recover, halt, recover...). The other partition goes on.
//!
//! Neither test broker writes markers for rdkafka's transactional API: the embedded broker's
//! EndTxn only answers (offsets stay dense, the records are applied as usual), and tansu 0.6
//! does not implement EndTxn (librdkafka refuses the commit). `a_transactional_producer_...`
//! checks that, and would run the refusal checks on a broker that writes markers (Kafka). The
//! markers themselves are then written as a broker writes them — a control batch appended with
//! a plain Produce request ([`prefixlog_tests::raw_produce`]) — on every backend that stores one.

use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{LogSpec, Publisher};
use prefixlog_node::{CheckpointPolicy, NodeOptions, ReplicaNode};
use prefixlog_state::record::{encode_kv_events, worker_for_partition, worker_key};
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{token_of, KvOp, Landed, Tier};
use prefixlog_tests::http::sample;
use prefixlog_tests::raw_produce::{self, Marker};
use prefixlog_tests::{kafka_backends, replicas, unique_topic};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const P: u32 = 2;
/// The partition the transaction writes to.
const TXN: u32 = 1;

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

async fn publish(p: &Publisher, seq: u64) -> Vec<Landed> {
    let mut out = Vec::new();
    for partition in 0..P {
        let w = worker_for_partition(partition, P);
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: [(w << 16 | seq, seq)].map(BlockHashes::from).to_vec(),
        }];
        out.push(p.publish_kv_events(&ks(), w, 0, 1, seq, false, &ops, None).await.unwrap());
    }
    out
}

/// Writes `n` valid records for `TXN`'s worker (sequence numbers from `seq`) in one transaction
/// of rdkafka's transactional API, and commits it.
fn transaction(spec: &LogSpec, seq: u64, n: u64) -> Result<(), rdkafka::error::KafkaError> {
    let w = worker_for_partition(TXN, P);
    let producer: ThreadedProducer<DefaultProducerContext> = spec
        .kafka
        .client_config(prefixlog_ingest::ClientRole::Publisher)
        .set("transactional.id", format!("{}-txn-{seq}", spec.topic))
        .set("message.timeout.ms", "30000")
        .create()?;
    let t = Duration::from_secs(30);
    producer.init_transactions(t)?;
    producer.begin_transaction()?;
    for s in seq..seq + n {
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: [(w << 16 | s, s)].map(BlockHashes::from).to_vec(),
        }];
        let v = encode_kv_events(&ks(), w, 0, 1, s, false, &ops);
        let key = worker_key(w);
        let rec = BaseRecord::to(&spec.topic).key(&key[..]).payload(&v).partition(TXN as i32);
        producer.send(rec).map_err(|(e, _)| e)?;
    }
    producer.commit_transaction(t)
}

fn opts(name: &str, dir: &std::path::Path, me: u16, peer: u16) -> NodeOptions {
    let addr = |p: u16| std::net::SocketAddr::from(([127, 0, 0, 1], p));
    NodeOptions {
        data_dir: Some(dir.to_path_buf()),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        peer_addr: Some(addr(me)),
        peers: vec![addr(peer).to_string()],
        anti_entropy_interval: Duration::from_secs(3600),
        ..replicas::options(name)
    }
}

fn metric(node: &ReplicaNode, name: &str) -> Option<f64> {
    sample(&prefixlog_query::metrics::render(node.registry()), name)
}

/// Two replicas of `spec`, peers of each other, each with a checkpoint of `first`.
async fn pair(spec: &LogSpec, dirs: &[tempfile::TempDir; 2], first: &[NextOffset]) -> [ReplicaNode; 2] {
    let (pa, pb) = (prefixlog_node::loopback_port(), prefixlog_node::loopback_port());
    let a = ReplicaNode::start(spec.clone(), opts("a", dirs[0].path(), pa, pb)).await.unwrap();
    let b = ReplicaNode::start(spec.clone(), opts("b", dirs[1].path(), pb, pa)).await.unwrap();
    for n in [&a, &b] {
        assert!(n.status().wait_for(first, Duration::from_secs(60)).await);
        n.checkpoint_now().unwrap().expect("a store");
    }
    [a, b]
}

/// Both replicas halt `TXN` once at its hole, say so, and never swap a peer's state in (which
/// ends before the hole); the other partition reaches `after`.
async fn refused_once(backend: &str, nodes: &[ReplicaNode; 2], after: &[NextOffset]) {
    let other: Vec<NextOffset> = after.iter().copied().filter(|t| t.partition != TXN).collect();
    let holes =
        format!("prefixlog_log_holes_total{{cause=\"no_records\",partition=\"{TXN}\",shard=\"all\"}}");
    let failed = "prefixlog_partition_recoveries_total{outcome=\"failed\",shard=\"all\"}";
    for n in nodes {
        assert!(n.status().wait_for(&other, Duration::from_secs(60)).await, "{backend}: the other partition");
        let t = Instant::now();
        // Halted before the marker, explained, and recovery tried and refused the peer's state.
        while !(metric(n, &holes) == Some(1.0) && metric(n, failed) >= Some(1.0)) {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "{backend}: hole never explained or recovery never tried"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let hole = n.status().hole(TXN).expect("halted before a hole");
        let (ready, why) = n.ready();
        assert!(!ready, "{backend}: ready with a hole in the log");
        let named = format!("partition {TXN} skips offsets {}..{}", hole.start, hole.end);
        assert!(why.contains(&named) && why.contains("transaction markers"), "{why}");
        assert_eq!(n.applier().lock().partition(TXN).next_offset, hole.start, "halted at the hole");
    }
    // No loop: the partition was never swapped in and halted again.
    for n in nodes {
        let st = &n.status().partitions[TXN as usize];
        assert_eq!(st.discontinuities.load(Ordering::Relaxed), 1, "{backend}: met the hole once");
        let recovered = "prefixlog_partition_recoveries_total{outcome=\"recovered\",shard=\"all\"}";
        assert_eq!(metric(n, recovered), Some(0.0), "{backend}");
        assert_eq!(n.status().discontinuous(), vec![TXN], "{backend}");
    }
}

/// rdkafka's transactional API against each backend: where the broker writes markers, the
/// replicas refuse the partition once; where it does not, what it does instead is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_producer_halts_its_partition_once_where_the_broker_writes_markers() {
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.transactions");
        b.create_topic(&topic, P).await.unwrap();
        let spec = replicas::spec(&b.brokers, &topic, P);
        let publisher = Publisher::new(&spec).unwrap();
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let first = token_of(&publish(&publisher, 1).await);
        let nodes = pair(&spec, &dirs, &first).await;
        let s = spec.clone();
        let committed = tokio::task::spawn_blocking(move || transaction(&s, 100, 3)).await.unwrap();
        let after = token_of(&publish(&publisher, 2).await);
        let txn_end = after.iter().find(|t| t.partition == TXN).unwrap().offset;
        let txn_start = first.iter().find(|t| t.partition == TXN).unwrap().offset;
        match committed {
            Err(e) if b.name != "embedded" => {
                eprintln!("[transactions] {}: NOT RUN: the broker refuses the transaction ({e})", b.name)
            }
            Err(e) => panic!("{}: the embedded broker implements transactions: {e}", b.name),
            Ok(()) if txn_end == txn_start + 4 => {
                // 3 records + 1 publish after them, no marker: nothing to refuse.
                for n in &nodes {
                    assert!(n.status().wait_for(&after, Duration::from_secs(60)).await, "{}", b.name);
                    assert!(n.status().discontinuous().is_empty(), "{}", b.name);
                }
                eprintln!("[transactions] {}: the broker writes no transaction markers (offsets dense); applied as usual", b.name);
            }
            Ok(()) => {
                refused_once(b.name, &nodes, &after).await;
                eprintln!("[transactions] {}: markers written; the partition was refused once", b.name);
            }
        }
        for n in nodes {
            n.shutdown().await.unwrap();
        }
    }
}

/// A log that holds a transaction's marker (appended as a broker appends it) halts the partition
/// once, on every backend that stores a control batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_marker_in_the_log_halts_the_partition_once_without_a_recovery_loop() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.txn-markers");
        b.create_topic(&topic, P).await.unwrap();
        let spec = replicas::spec(&b.brokers, &topic, P);
        let publisher = Publisher::new(&spec).unwrap();
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let first = token_of(&publish(&publisher, 1).await);
        let nodes = pair(&spec, &dirs, &first).await;
        // The transaction's records (as its producer wrote them), then its commit marker.
        let (brokers, t) = (b.brokers.clone(), topic.clone());
        let appended = tokio::task::spawn_blocking(move || {
            let w = worker_for_partition(TXN, P);
            let values: Vec<Vec<u8>> = (100..103)
                .map(|s| {
                    let ops = [KvOp::Stored {
                        tier: Tier::Gpu,
                        lane: 0,
                        parent_ext: None,
                        blocks: [(w << 16 | s, s)].map(BlockHashes::from).to_vec(),
                    }];
                    encode_kv_events(&ks(), w, 0, 1, s, false, &ops)
                })
                .collect();
            let now = 1_700_000_000_000;
            let records = raw_produce::transactional_batch((-1, -1), &worker_key(w), &values, now);
            raw_produce::produce(&brokers, &t, TXN as i32, &records)?;
            raw_produce::produce(
                &brokers,
                &t,
                TXN as i32,
                &raw_produce::marker_batch(Marker::Commit, (-1, -1), now),
            )
        })
        .await
        .unwrap();
        match appended {
            Err(e) => eprintln!(
                "[transactions] {}: NOT RUN: the broker does not store a control batch ({e})",
                b.name
            ),
            Ok(marker) => {
                let after = token_of(&publish(&publisher, 2).await);
                refused_once(b.name, &nodes, &after).await;
                let hole = nodes[0].status().hole(TXN).unwrap();
                assert_eq!((hole.start, hole.end), (marker, marker + 1), "{}: the marker's offset", b.name);
                ran.push(b.name);
            }
        }
        for n in nodes {
            n.shutdown().await.unwrap();
        }
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}
