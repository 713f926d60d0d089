//! The log end to end over real Kafka clients, on every available backend: concurrent
//! publishers, two replicas reaching identical per-partition digests, dedupe, a poison record
//! (skipped, and copied to a dead-letter topic), epoch bumps, lag, and a late replica catching up.

use prefixlog_engine::{HolderKey, KeyspaceId, MatchOptions};
use prefixlog_ingest::reader::{LogReader, Read};
use prefixlog_ingest::{LogSpec, Publisher};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_state::BlockHashes;
use prefixlog_state::NextOffset;
use prefixlog_state::{token_of, KvOp, Landed, Tier};
use prefixlog_tests::{kafka_backends, replicas, unique_topic, KafkaBackend};
use prefixlog_workload::{generate, FleetConfig, Step, TraceRequest};
use std::collections::BTreeMap;
use std::time::Duration;

const P: u32 = 4;

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

fn spec(b: &KafkaBackend, topic: &str) -> LogSpec {
    replicas::spec(&b.brokers, topic, P)
}

async fn replica(b: &KafkaBackend, topic: &str) -> ReplicaNode {
    replicas::replica(&spec(b, topic), "r").await
}

/// A replica that keeps two copies of every keyspace (`--query-copy`).
async fn paired_replica(b: &KafkaBackend, topic: &str) -> ReplicaNode {
    let opts = NodeOptions { query_copy: true, ..replicas::options("r") };
    ReplicaNode::start(spec(b, topic), opts).await.expect("replica starts")
}

async fn replica_with_dead_letter(b: &KafkaBackend, topic: &str, dead_letter: &str) -> ReplicaNode {
    let opts = NodeOptions { dead_letter_topic: Some(dead_letter.into()), ..replicas::options("r") };
    ReplicaNode::start(spec(b, topic), opts).await.expect("replica starts")
}

/// The first record of partition 0 of `topic` (waits up to 30 s): payload and headers.
fn first_record(b: &KafkaBackend, topic: &str) -> (Vec<u8>, BTreeMap<String, String>) {
    let mut reader = LogReader::open(&replicas::spec(&b.brokers, topic, 1), [NextOffset::new(0, 0)]).unwrap();
    let t = std::time::Instant::now();
    loop {
        assert!(t.elapsed() < Duration::from_secs(30), "{}: nothing in {topic}", b.name);
        if let Read::Record(r) = reader.poll(Duration::from_millis(100)) {
            return (r.payload().unwrap_or_default().to_vec(), r.headers().into_iter().collect());
        }
    }
}

fn token(landed: &[Landed]) -> Vec<NextOffset> {
    token_of(landed)
}

fn digests(r: &ReplicaNode) -> Vec<u64> {
    let a = r.applier().lock();
    (0..P).map(|p| a.partition_digest(p)).collect()
}

/// Workers publish their own event streams concurrently (one task per worker).
async fn publish_fleet(publisher: &Publisher) -> Vec<Landed> {
    let trace: Vec<TraceRequest> = (0..240u64)
        .map(|i| TraceRequest { timestamp_ms: i, hash_ids: vec![0, 1 + i % 13, 30 + i % 29, 100 + i] })
        .collect();
    let steps =
        generate(&trace, &FleetConfig { workers: 6, capacity_blocks: 48, stretch: 2, copies: 1, seed: 2 });
    let mut per_worker: BTreeMap<u32, Vec<KvOp>> = BTreeMap::new();
    for s in steps {
        match s {
            Step::Stored { worker, parent_ext, blocks } => per_worker
                .entry(worker)
                .or_default()
                .push(KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext, blocks }),
            Step::Removed { worker, exts } => {
                per_worker.entry(worker).or_default().push(KvOp::Removed { tier: Tier::Gpu, lane: 0, exts })
            }
            Step::Match { .. } => {}
        }
    }
    let mut tasks = Vec::new();
    for (w, ops) in per_worker {
        let publisher = publisher.clone();
        tasks.push(tokio::spawn(async move {
            let mut landed = Vec::new();
            for (i, op) in ops.into_iter().enumerate() {
                let l = publisher
                    .publish_kv_events(
                        &ks(),
                        u64::from(w),
                        0,
                        1,
                        i as u64 + 1,
                        false,
                        &[op],
                        Some(1_000 + i as i64),
                    )
                    .await
                    .expect("publish");
                landed.push(l);
            }
            landed
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_converge_and_late_replica_catches_up() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.converge");
        b.create_topic(&topic, P).await.unwrap();
        let publisher = Publisher::new(&spec(&b, &topic)).unwrap();
        let r1 = replica(&b, &topic).await;
        // The second keeps two copies of every keyspace (`--query-copy`): the same state.
        let r2 = paired_replica(&b, &topic).await;
        let landed = publish_fleet(&publisher).await;
        let tok = token(&landed);
        for r in [&r1, &r2] {
            assert!(
                r.status().wait_for(&tok, Duration::from_secs(60)).await,
                "{}: replica caught up",
                b.name
            );
        }
        let d1 = digests(&r1);
        assert_eq!(d1, digests(&r2), "{}: identical per-partition digests at equal offsets", b.name);
        let cells = r2.engine().keyspaces();
        assert!(!cells.is_empty() && cells.iter().all(|c| c.is_paired()), "{}: two copies", b.name);
        for c in &cells {
            let copies = c.copies();
            assert!(copies[0].dump() == copies[1].dump(), "{}: the two copies are identical", b.name);
        }
        assert_eq!(r1.status().offsets(), r2.status().offsets());
        assert!(d1.iter().any(|&d| d != 0));
        // Lag is reported and drops to 0 once caught up (watermarks are polled).
        let mut lag = i64::MAX;
        for _ in 0..100 {
            lag = r1.status().lag();
            if lag == 0
                && r1
                    .status()
                    .partitions
                    .iter()
                    .any(|p| p.high_watermark.load(std::sync::atomic::Ordering::Acquire) > 0)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(lag, 0, "{}: lag drops to 0", b.name);
        // A replica started after everything was published catches up to the same digests.
        let late = replica(&b, &topic).await;
        assert!(late.status().wait_for(&tok, Duration::from_secs(60)).await);
        assert_eq!(digests(&late), d1, "{}: late replica agrees", b.name);
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// A bug that makes the two copies of a `--query-copy` replica disagree (planted: one copy
/// loses a block) is caught by the next write to the keyspace. That record's apply fails: its
/// partition halts at it (as would any other at its next write to the keyspace), and the
/// replica reports not ready and why, instead of answering from a state that no longer follows
/// the log. A replica beside it is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diverging_copies_stop_ingest_and_the_replica_is_not_ready() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.diverge");
        b.create_topic(&topic, P).await.unwrap();
        let publisher = Publisher::new(&spec(&b, &topic)).unwrap();
        let plain = replica(&b, &topic).await;
        let r = paired_replica(&b, &topic).await;
        let tok = token(&publish_fleet(&publisher).await);
        for node in [&plain, &r] {
            assert!(node.status().wait_for(&tok, Duration::from_secs(60)).await, "{}: caught up", b.name);
        }
        let victim = HolderKey::new(3, 0, 0);
        let cell = r.engine().keyspace(&ks()).expect("keyspace");
        eprintln!("[{}] planting a divergence: the ingest thread's panic printed next is expected", b.name);
        assert_eq!(cell.write_back_copy_for_test(|k| k.corrupt_for_test(&victim)), Some(true));
        // Any write to the keyspace compares the copies: a placement for another worker.
        let placed = publisher
            .publish_placement(&ks(), HolderKey::new(99, 0, 0), &[1, 2], &[], "test", Some(5_000))
            .await
            .expect("publish");
        assert!(plain.status().wait_for(&[placed.token()], Duration::from_secs(60)).await);
        let mut state = r.ready();
        for _ in 0..300 {
            if !state.0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            state = r.ready();
        }
        assert!(
            !state.0 && state.1.contains("(a bug)") && state.1.contains("diverged"),
            "{}: {state:?}",
            b.name
        );
        let failed = r.status().apply_failures();
        assert_eq!(failed.iter().map(|f| f.offset).collect::<Vec<_>>(), vec![placed.offset], "{}", b.name);
        assert!(plain.ready().0, "{}: the other replica is unaffected: {:?}", b.name, plain.ready());
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_poison_and_epochs_over_kafka() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.policy");
        b.create_topic(&topic, P).await.unwrap();
        let dead_letter = format!("{topic}.dead-letter");
        b.create_topic(&dead_letter, 1).await.unwrap();
        let publisher = Publisher::new(&spec(&b, &topic)).unwrap();
        let r = replica_with_dead_letter(&b, &topic, &dead_letter).await;
        let w = 5u64;
        let store = |parent: Option<u64>, blocks: &[BlockHashes]| KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: parent,
            blocks: blocks.to_vec(),
        };
        let mut landed = Vec::new();
        landed.push(
            publisher
                .publish_kv_events(
                    &ks(),
                    w,
                    0,
                    1,
                    1,
                    false,
                    &[store(None, &[(11, 1), (12, 2)].map(BlockHashes::from))],
                    None,
                )
                .await
                .unwrap(),
        );
        // A bridge retry of the same batch, then a poison record in the middle of the partition.
        landed.push(
            publisher
                .publish_kv_events(
                    &ks(),
                    w,
                    0,
                    1,
                    1,
                    false,
                    &[store(None, &[(11, 1), (12, 2)].map(BlockHashes::from))],
                    None,
                )
                .await
                .unwrap(),
        );
        landed.push(publisher.publish_raw(w, b"not a record", None).await.unwrap());
        landed.push(
            publisher
                .publish_kv_events(
                    &ks(),
                    w,
                    0,
                    1,
                    2,
                    false,
                    &[store(Some(12), &[(13, 3)].map(BlockHashes::from))],
                    None,
                )
                .await
                .unwrap(),
        );
        assert!(r.status().wait_for(&token(&landed), Duration::from_secs(30)).await);
        let depth = |r: &ReplicaNode, q: &[u64]| {
            r.applier()
                .lock()
                .engine()
                .match_chain(&ks(), q, &MatchOptions::default())
                .unwrap_or_default()
                .iter()
                .find(|m| m.holder == HolderKey::new(w, 0, 0))
                .map_or(0, |m| m.depth)
        };
        assert_eq!(depth(&r, &[1, 2, 3]), 3, "{}: later records still apply after the poison", b.name);
        {
            let a = r.applier().lock();
            let c = &a.partition(landed[0].partition).counters;
            assert_eq!((c.duplicates, c.bad.values().sum::<u64>()), (1, 1), "{}", b.name);
        }
        // The poison record (and only it: the duplicate is normal) went to the dead-letter topic.
        let (payload, headers) = first_record(&b, &dead_letter);
        assert_eq!(payload, b"not a record", "{}", b.name);
        let want: BTreeMap<String, String> = [
            ("prefixlog-source-topic", topic.clone()),
            ("prefixlog-source-partition", landed[2].partition.to_string()),
            ("prefixlog-source-offset", landed[2].offset.to_string()),
            ("prefixlog-reason", "undecodable".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(headers, want, "{}", b.name);
        // Epoch bump clears.
        let l = publisher
            .publish_kv_events(
                &ks(),
                w,
                0,
                2,
                1,
                false,
                &[store(None, &[(21, 7)].map(BlockHashes::from))],
                None,
            )
            .await
            .unwrap();
        assert!(r.status().wait_for(&[l.token()], Duration::from_secs(30)).await);
        assert_eq!(depth(&r, &[1, 2, 3]), 0, "{}", b.name);
        assert_eq!(depth(&r, &[7]), 1, "{}", b.name);
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_count_mismatch_is_refused() {
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.mismatch");
        b.create_topic(&topic, 3).await.unwrap();
        let err = ReplicaNode::start(spec(&b, &topic), replicas::options("r")).await.err().expect("refused");
        assert!(err.to_string().contains("has 3 partitions"), "{}: {err}", b.name);
        // A dead-letter topic that is the consumed topic would copy refused records in a loop.
        let opts = NodeOptions { dead_letter_topic: Some(topic.clone()), ..replicas::options("r") };
        let err =
            ReplicaNode::start(replicas::spec(&b.brokers, &topic, 3), opts).await.err().expect("refused");
        assert!(
            err.to_string().contains("dead-letter topic is the topic being consumed"),
            "{}: {err}",
            b.name
        );
    }
}

/// Every record of every partition, once and in order, although each partition is halted and
/// resumed many times in quick succession while records are in flight, sometimes past the log's
/// end first (a discontinuity, then a resume at the right offset, back to back, as
/// `--accept-log-gaps` does; Kafka and the embedded broker answer such a fetch with an
/// out-of-range error, tansu with no records and its high watermark). A round of resumes
/// follows each record read: a resume opens a new consumer, and on a real broker its first
/// fetch takes longer than a poll, so resuming on every poll would never let one deliver. A
/// resume used to re-assign the consumer, and two assignments closer together than a
/// partition's fetch stop made librdkafka 2.12 abort the process (confluentinc/librdkafka#5573: `rd_kafka_assignment_partition_stopped: Assertion
/// rktp->rktp_started failed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_resumed_over_and_over_reads_every_record_once() {
    const RESUMES: u32 = 200;
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.resume");
        b.create_topic(&topic, P).await.unwrap();
        let spec = spec(&b, &topic);
        let landed = publish_fleet(&Publisher::new(&spec).unwrap()).await;
        let mut end: BTreeMap<u32, i64> = (0..P).map(|p| (p, 0)).collect();
        end.extend(token(&landed).into_iter().map(|t| (t.partition, t.offset)));
        let mut reader = LogReader::open(&spec, (0..P).map(|p| NextOffset::new(p, 0))).unwrap();
        let mut next: BTreeMap<u32, i64> = (0..P).map(|p| (p, 0)).collect();
        // Bounded by progress, not by the whole run's time: every resume opens a fetch again.
        let mut progress = std::time::Instant::now();
        let (mut resumes, mut past_end) = (0, std::collections::BTreeSet::new());
        let mut read_since_resume = true;
        while next != end || !past_end.is_empty() {
            let stuck = progress.elapsed();
            assert!(stuck < Duration::from_secs(30), "{}: read {next:?} of {end:?}, then nothing", b.name);
            match reader.poll(Duration::from_millis(100)) {
                Read::Record(r) => {
                    let at = next.get_mut(&r.partition()).unwrap();
                    assert_eq!(r.offset(), *at, "{}: partition {} in order, once", b.name, r.partition());
                    *at += 1;
                    read_since_resume = true;
                    progress = std::time::Instant::now();
                }
                Read::Discontinuity(d) => {
                    progress = std::time::Instant::now();
                    assert!(past_end.remove(&d.partition), "{}: only the resumes past the end: {d}", b.name);
                    assert_eq!(d.expected, end[&d.partition] + 100, "{}: {d}", b.name);
                    reader.resume_at(d.partition, next[&d.partition]);
                }
                Read::Idle | Read::BrokerError(_) => {}
            }
            if resumes < RESUMES && read_since_resume {
                // Every partition, back to back: records fetched but not yet delivered are
                // dropped and fetched again.
                let running: Vec<u32> = (0..P).filter(|p| !past_end.contains(p)).collect();
                for p in running {
                    reader.halt(p).unwrap();
                    if resumes % 10 == 9 && p == (resumes / 10) % P {
                        reader.resume_at(p, end[&p] + 100);
                        past_end.insert(p);
                    } else {
                        reader.resume_at(p, reader.expected(p).unwrap());
                    }
                }
                resumes += 1;
                read_since_resume = false;
            }
        }
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// A bounded replay asks for 512 KiB per fetch; a record larger than that is still read, since a
/// broker returns a fetch's first record whatever its size (Kafka's KIP-74; tansu with the
/// patch `scripts/install-tansu.sh` applies). Unpatched tansu returned nothing for it, and a
/// reader stalled there for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_reader_reads_records_larger_than_its_fetch_size() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.large");
        b.create_topic(&topic, 1).await.unwrap();
        let spec = replicas::spec(&b.brokers, &topic, 1);
        let publisher = Publisher::new(&spec).unwrap();
        // Under the publisher's message.max.bytes (1,000,000), over the replay's 524,288.
        let sizes = [100usize, 700_000, 100, 600_000, 600_000, 100];
        for (i, &n) in sizes.iter().enumerate() {
            publisher.publish_raw(7, &vec![i as u8; n], Some(i as i64)).await.unwrap();
        }
        let mut reader = LogReader::open_bounded(&spec, [NextOffset::new(0, 0)]).unwrap();
        let (mut read, t) = (Vec::new(), std::time::Instant::now());
        while read.len() < sizes.len() {
            assert!(t.elapsed() < Duration::from_secs(30), "{}: read {} of the records", b.name, read.len());
            match reader.poll(Duration::from_millis(100)) {
                Read::Record(r) => read.push((r.offset(), r.payload().map_or(0, <[u8]>::len))),
                Read::Discontinuity(d) => panic!("{}: {d}", b.name),
                Read::Idle | Read::BrokerError(_) => {}
            }
        }
        let want: Vec<(i64, usize)> = sizes.iter().enumerate().map(|(i, &n)| (i as i64, n)).collect();
        assert_eq!(read, want, "{}: every record once, in order, whole", b.name);
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

/// Threads of this process named `prefixlog-ingest` (the kernel keeps 15 bytes of a name)
/// whose CPU set is exactly `cpus` (as /proc writes it, e.g. `0`).
fn ingest_threads_on(cpus: &str) -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap().flatten();
    tasks
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "prefixlog-inges")
        })
        .filter(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            status.lines().any(|l| l.strip_prefix("Cpus_allowed_list:").is_some_and(|v| v.trim() == cpus))
        })
        .count()
}

/// `--ingest-cpus`: the ingest thread runs on the CPUs given and applies the log as an unpinned
/// one does; CPUs the machine does not have fail the start with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_pinned_to_cpus_ingests_there_and_a_missing_cpu_is_refused() {
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.pinned");
        b.create_topic(&topic, P).await.unwrap();
        let landed = publish_fleet(&Publisher::new(&spec(&b, &topic)).unwrap()).await;
        let before = ingest_threads_on("0");
        let pinned = NodeOptions { ingest_cpus: Some("0".parse().unwrap()), ..replicas::options("pinned") };
        let r = ReplicaNode::start(spec(&b, &topic), pinned).await.expect("pinned replica starts");
        let unpinned = replica(&b, &topic).await;
        assert_eq!(ingest_threads_on("0"), before + 1, "{}: the pinned replica's ingest thread", b.name);
        for n in [&r, &unpinned] {
            assert!(n.status().wait_for(&token(&landed), Duration::from_secs(30)).await, "{}", b.name);
        }
        assert_eq!(digests(&r), digests(&unpinned), "{}", b.name);
        let missing = NodeOptions { ingest_cpus: Some("1023".parse().unwrap()), ..replicas::options("m") };
        let err = ReplicaNode::start(spec(&b, &topic), missing).await.err().expect("refused");
        assert!(
            err.to_string().contains("could not pin the ingest thread to CPUs 1023"),
            "{}: {err}",
            b.name
        );
    }
}
