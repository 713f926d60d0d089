//! Per-partition limits (issue 34): each limit refuses a record whole, before anything of it is
//! applied, with its own reason, counted like every bad record; the same records are refused
//! whatever the interleaving of partitions; and a seeded fuzz checks the applier's incremental
//! bookkeeping and its refusals against a naive recount of the state after every record.

use prefixlog_engine::{partition_of, HolderKey, KeyspaceId};
use prefixlog_state::partition_state::PartitionState;
use prefixlog_state::record::{
    encode_lifecycle, encode_placement, encode_tick, worker_for_partition, KvBatch,
};
use prefixlog_state::BlockHashes;
use prefixlog_state::{Applier, BadReason, KvOp, LaneMeta, Lifecycle, Outcome, StateSettings, Tier};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};

const P: u32 = 3;

/// Small limits, so that random streams run into every one of them.
fn settings() -> StateSettings {
    StateSettings {
        placement_ttl_ms: 500,
        expiry_interval_ms: 100,
        digest_interval: 5,
        max_keyspaces_per_partition: 3,
        max_feeds_per_partition: 6,
        max_lanes_per_feed: 3,
        max_holders_per_partition: 8,
        max_workers_per_partition: 3,
        max_worker_metadata_bytes: 80,
        max_name_bytes: 8,
        ..Default::default()
    }
}

fn ks(model: &str) -> KeyspaceId {
    KeyspaceId::new(model, 16, 1)
}

fn stored(lane: u32, blocks: &[u64]) -> KvOp {
    KvOp::Stored {
        tier: Tier::Gpu,
        lane,
        parent_ext: None,
        blocks: blocks.iter().map(|&b| (b, b)).map(BlockHashes::from).collect(),
    }
}

fn batch(model: &str, worker: u64, dp_rank: u32, seq: u64, events: &[KvOp], lanes: &[LaneMeta]) -> Vec<u8> {
    KvBatch { keyspace: &ks(model), worker, dp_rank, epoch: 1, seq, gap_before: false, events, lanes }
        .encode()
}

/// Everything of partition `p` a refused record must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot {
    digest: u64,
    feeds: String,
    workers: String,
    keyspaces: Vec<KeyspaceId>,
    holders: Vec<(KeyspaceId, HolderKey, u32, bool, bool)>,
}

fn snapshot(a: &Applier, p: u32) -> Snapshot {
    let part = a.partition(p);
    let mut holders = Vec::new();
    for id in a.engine().keyspace_ids() {
        for h in a.engine().keyspace(&id).unwrap().read().holder_summaries() {
            if partition_of(h.key.worker, P) == p {
                holders.push((id.clone(), h.key, h.blocks, h.fed, h.gapped));
            }
        }
    }
    Snapshot {
        digest: a.partition_digest(p),
        feeds: format!("{:?}", part.feeds),
        workers: format!("{:?}", part.workers),
        keyspaces: a.engine().keyspace_ids(),
        holders,
    }
}

/// One applier over a log, offset by offset per partition. Each partition's timestamps move
/// only when a test moves them, so a refused record never expires anything.
struct Log {
    a: Applier,
    next: Vec<i64>,
    time: Vec<u64>,
}

impl Log {
    fn new(s: StateSettings) -> Self {
        Self { a: Applier::new(P, s), next: vec![0; P as usize], time: vec![1_000; P as usize] }
    }

    /// Applies `v` to its worker's partition; a refusal must change nothing of the partition
    /// but its bad-record counter.
    fn put(&mut self, worker: u64, v: Vec<u8>) -> Outcome {
        let p = partition_of(worker, P);
        let before = snapshot(&self.a, p);
        let bad_before = self.a.partition(p).counters.bad.clone();
        let out = self.a.apply(p, self.next[p as usize], self.time[p as usize], Some(&v)).unwrap();
        self.next[p as usize] += 1;
        if let Outcome::Bad(r) = out {
            assert_eq!(snapshot(&self.a, p), before, "{r}: refused whole");
            let counted = self.a.partition(p).counters.bad[&r] - bad_before.get(&r).copied().unwrap_or(0);
            assert_eq!(counted, 1, "{r}: counted once");
        }
        self.a.check_usage().unwrap();
        out
    }
}

/// Workers of partition 0, in a fixed order.
fn workers_of_p0(n: usize) -> Vec<u64> {
    (0u64..).filter(|&w| partition_of(w, P) == 0).take(n).collect()
}

#[test]
fn each_limit_refuses_whole_with_its_reason() {
    let w = workers_of_p0(6);
    let mut l = Log::new(settings());
    // Names.
    assert_eq!(
        l.put(w[0], batch("a-long-model", w[0], 0, 1, &[stored(0, &[1])], &[])),
        Outcome::Bad(BadReason::NameTooLong)
    );
    let kind = LaneMeta { lane: 0, kind: "sliding_window".into(), sliding_window: 8, block_size: 16 };
    assert_eq!(l.put(w[0], batch("m", w[0], 0, 1, &[], &[kind])), Outcome::Bad(BadReason::NameTooLong));
    // Keyspaces: three fit, a fourth is refused, an existing one still works.
    for (i, m) in ["m0", "m1", "m2"].iter().enumerate() {
        assert_eq!(l.put(w[0], batch(m, w[0], 0, 1, &[stored(0, &[10 + i as u64])], &[])), Outcome::Applied);
    }
    assert_eq!(
        l.put(w[0], batch("m3", w[0], 0, 1, &[KvOp::Cleared { lane: 0 }], &[])),
        Outcome::Bad(BadReason::TooManyKeyspaces)
    );
    let placed = encode_placement(&ks("m3"), HolderKey::new(w[1], 0, 0), &[5], &[], "g");
    assert_eq!(l.put(w[1], placed), Outcome::Bad(BadReason::TooManyKeyspaces));
    assert_eq!(l.put(w[0], batch("m0", w[0], 0, 2, &[stored(0, &[20])], &[])), Outcome::Applied);
    // Feeds: 3 exist (w0 dp0 in m0..m2); three more fit, the seventh is refused.
    for dp in 1..4 {
        assert_eq!(
            l.put(w[0], batch("m0", w[0], dp, 1, &[KvOp::Cleared { lane: 0 }], &[])),
            Outcome::Applied
        );
    }
    assert_eq!(l.put(w[1], batch("m0", w[1], 0, 1, &[], &[])), Outcome::Bad(BadReason::TooManyFeeds));
    // Lanes: three per feed, counting lane metadata, in one record or over several.
    let four: Vec<KvOp> = (0..4).map(|lane| KvOp::Cleared { lane }).collect();
    assert_eq!(l.put(w[0], batch("m1", w[0], 0, 2, &four, &[])), Outcome::Bad(BadReason::TooManyLanes));
    assert_eq!(l.put(w[0], batch("m1", w[0], 0, 2, &four[1..3], &[])), Outcome::Applied);
    let meta = LaneMeta { lane: 7, kind: "full".into(), sliding_window: 0, block_size: 16 };
    assert_eq!(l.put(w[0], batch("m1", w[0], 0, 3, &[], &[meta])), Outcome::Bad(BadReason::TooManyLanes));
    // Holders: 3 stored so far (w0 dp0 lane 0 in m0..m2); lanes 1 and 2 of m1 make 5, a
    // store to three new lanes of another feed makes 8 = the limit; one more is refused.
    assert_eq!(
        l.put(w[0], batch("m1", w[0], 0, 3, &[stored(1, &[30]), stored(2, &[31])], &[])),
        Outcome::Applied
    );
    assert_eq!(l.a.usage(0).holders(), 5);
    let three = [stored(0, &[40]), stored(1, &[41]), stored(2, &[42])];
    assert_eq!(l.put(w[0], batch("m0", w[0], 1, 2, &three, &[])), Outcome::Applied);
    assert_eq!(
        l.put(w[0], batch("m0", w[0], 2, 2, &[stored(0, &[50])], &[])),
        Outcome::Bad(BadReason::TooManyHolders)
    );
    let placed = encode_placement(&ks("m0"), HolderKey::new(w[2], 0, 0), &[5], &[], "g");
    assert_eq!(l.put(w[2], placed), Outcome::Bad(BadReason::TooManyHolders));
    // Writes to existing holders go on.
    assert_eq!(l.put(w[0], batch("m0", w[0], 1, 3, &[stored(0, &[43])], &[])), Outcome::Applied);
    // Workers and their metadata.
    let meta =
        |n: usize| Lifecycle::Added { metadata: (0..n).map(|i| (format!("k{i}"), "v".repeat(10))).collect() };
    assert_eq!(
        l.put(w[0], encode_lifecycle(w[0], &meta(3))),
        Bad(BadReason::MetadataTooLarge),
        "3 × (2 + 10 + 32) > 80"
    );
    for &x in &w[..3] {
        assert_eq!(l.put(x, encode_lifecycle(x, &meta(1))), Outcome::Applied);
    }
    assert_eq!(l.put(w[3], encode_lifecycle(w[3], &meta(1))), Bad(BadReason::TooManyWorkers));
    assert_eq!(
        l.put(w[1], encode_lifecycle(w[1], &meta(0))),
        Outcome::Applied,
        "a known worker's new metadata"
    );
    // WorkerRemoved frees what the worker had: its feeds, holders and keyspaces.
    assert_eq!(l.put(w[0], encode_lifecycle(w[0], &Lifecycle::Removed)), Outcome::Applied);
    assert_eq!((l.a.usage(0).holders(), l.a.usage(0).keyspaces().count()), (0, 0));
    assert!(l.a.engine().keyspace_ids().is_empty(), "keyspaces without holders are freed");
    assert_eq!(l.put(w[3], encode_lifecycle(w[3], &meta(1))), Outcome::Applied, "w0 left: room for one");
    assert_eq!(l.put(w[5], encode_lifecycle(w[5], &meta(1))), Bad(BadReason::TooManyWorkers));
    assert_eq!(l.put(w[4], batch("m3", w[4], 0, 1, &three, &[])), Outcome::Applied);
    // Every refusal is counted per partition and reason, and only in partition 0.
    let bad = &l.a.partition(0).counters.bad;
    for r in [
        BadReason::NameTooLong,
        BadReason::TooManyKeyspaces,
        BadReason::TooManyFeeds,
        BadReason::TooManyLanes,
        BadReason::TooManyHolders,
        BadReason::MetadataTooLarge,
        BadReason::TooManyWorkers,
    ] {
        assert!(bad.get(&r).copied().unwrap_or(0) >= 1, "{r} counted: {bad:?}");
    }
    assert!((1..P).all(|p| l.a.partition(p).counters.bad.is_empty()));
}

use Outcome::Bad;

/// Removals and clears of keyspaces that do not exist create none (issue 34: 3,000 such
/// records cost 2.4 GB); they are counted by the engine. A feed is still started: it is the
/// partition's state, bounded by the feed and keyspace limits.
#[test]
fn removals_and_clears_of_unknown_keyspaces_create_nothing() {
    let w = workers_of_p0(1)[0];
    let mut l = Log::new(StateSettings {
        max_keyspaces_per_partition: 1_000,
        max_feeds_per_partition: 1_000,
        ..settings()
    });
    for i in 0..200u64 {
        let ev = if i % 2 == 0 {
            KvOp::Cleared { lane: 0 }
        } else {
            KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: vec![i] }
        };
        assert_eq!(l.put(w, batch(&format!("r{i}"), w, 0, 1, &[ev], &[])), Outcome::Applied);
    }
    assert!(l.a.engine().keyspace_ids().is_empty());
    assert_eq!(l.a.engine().writes_without_keyspace(), 200);
    assert_eq!(l.a.partition(0).feeds.len(), 200);
    assert_eq!(l.a.usage(0).keyspaces().count(), 200, "feeds use keyspaces");
}

/// A state restored from an older build may hold keyspaces without holders: the applier frees
/// them when it takes the engine over (they digest to nothing, so no digest changes).
#[test]
fn empty_keyspaces_of_an_older_state_are_freed_on_restore() {
    let a = Applier::new(P, settings());
    let engine = a.engine().clone();
    engine.keyspace_or_create(&ks("old"));
    let digest_before = engine.digest();
    let restored = Applier::with_engine(engine, settings());
    assert!(restored.engine().keyspace_ids().is_empty());
    assert_eq!(restored.engine().digest(), digest_before);
}

/// A random record of a small universe (few keyspaces, workers, dp ranks, lanes), so that
/// limits, duplicates, epochs and expiry all happen.
struct Gen {
    rng: ChaCha8Rng,
    seq: BTreeMap<(String, u64, u32), u64>,
}

impl Gen {
    fn worker(&mut self, p: u32) -> u64 {
        let n = self.rng.random_range(0..5);
        (0u64..).filter(|&w| partition_of(w, P) == p).nth(n).unwrap()
    }

    fn model(&mut self) -> String {
        match self.rng.random_range(0..20) {
            0 => "long-model-name".into(),
            n => format!("m{}", n % 5),
        }
    }

    /// A record of partition `p`: (worker, value, whether it advances log time).
    fn record(&mut self, p: u32) -> (u64, Vec<u8>, bool) {
        let w = self.worker(p);
        let r = &mut self.rng;
        match r.random_range(0..100) {
            0..=54 => {
                let (model, dp) = (self.model(), self.rng.random_range(0..3));
                let s = self.seq.entry((model.clone(), w, dp)).or_insert(0);
                *s += u64::from(self.rng.random_bool(0.9)); // sometimes a duplicate
                let seq = *s;
                let r = &mut self.rng;
                let events: Vec<KvOp> = (0..r.random_range(0..4))
                    .map(|_| {
                        let lane = r.random_range(0..5);
                        // Each tier of a lane is a holder of its own: the holder limit counts them.
                        let tier = Tier::ALL[r.random_range(0..4)];
                        match r.random_range(0..10) {
                            0..=5 => KvOp::Stored {
                                tier,
                                lane,
                                parent_ext: r.random_bool(0.2).then(|| r.random_range(0..30)),
                                blocks: (0..r.random_range(1..4))
                                    .map(|_| (r.random_range(0..30), r.random_range(0..4)))
                                    .map(BlockHashes::from)
                                    .collect(),
                            },
                            6..=7 => KvOp::Removed { tier, lane, exts: vec![r.random_range(0..30)] },
                            _ => KvOp::Cleared { lane },
                        }
                    })
                    .collect();
                let lanes: Vec<LaneMeta> = (0..usize::from(r.random_bool(0.2)))
                    .map(|_| LaneMeta {
                        lane: r.random_range(0..5),
                        kind: if r.random_bool(0.2) { "a-long-kind".into() } else { "full".into() },
                        sliding_window: 0,
                        block_size: 16,
                    })
                    .collect();
                let epoch = if r.random_bool(0.05) { 2 } else { 1 };
                let b = KvBatch {
                    keyspace: &ks(&model),
                    worker: w,
                    dp_rank: dp,
                    epoch,
                    seq,
                    gap_before: false,
                    events: &events,
                    lanes: &lanes,
                };
                (w, b.encode(), false)
            }
            55..=74 => {
                let model = self.model();
                let r = &mut self.rng;
                let h = HolderKey::new(w, r.random_range(0..3), r.random_range(0..3));
                let locals: Vec<u64> = (0..r.random_range(0..4)).map(|_| r.random_range(0..4)).collect();
                (w, encode_placement(&ks(&model), h, &locals, &[], "g"), false)
            }
            75..=84 => {
                let metadata = (0..r.random_range(0..4))
                    .map(|i| (format!("k{i}"), "v".repeat(r.random_range(0..30))))
                    .collect();
                (w, encode_lifecycle(w, &Lifecycle::Added { metadata }), false)
            }
            85..=88 => (w, encode_lifecycle(w, &Lifecycle::Removed), false),
            89..=90 => {
                (w, encode_lifecycle(w, &Lifecycle::Restarted { new_epoch: r.random_range(1..4) }), false)
            }
            _ => (worker_for_partition(p, P), encode_tick(worker_for_partition(p, P)), true),
        }
    }
}

/// What a naive recount of partition `p`'s state says it uses.
struct Naive {
    keyspaces: BTreeSet<KeyspaceId>,
    holders: usize,
    holder_keys: BTreeSet<(KeyspaceId, HolderKey)>,
}

fn naive(a: &Applier, p: u32) -> Naive {
    let part: &PartitionState = a.partition(p);
    let mut n = Naive {
        keyspaces: part.feeds.keys().map(|k| k.keyspace.clone()).collect(),
        holders: 0,
        holder_keys: BTreeSet::new(),
    };
    for id in a.engine().keyspace_ids() {
        for h in a.engine().keyspace(&id).unwrap().read().holder_summaries() {
            if partition_of(h.key.worker, P) == p {
                n.keyspaces.insert(id.clone());
                n.holders += 1;
                n.holder_keys.insert((id.clone(), h.key));
            }
        }
    }
    n
}

/// After every record: the incremental usage equals a recount, every limit holds in every
/// partition, and a refused record is refused for a reason the naive recount confirms.
#[test]
fn random_streams_stay_within_limits_and_refusals_are_justified() {
    let s = settings();
    let mut reasons: BTreeMap<BadReason, u32> = BTreeMap::new();
    for seed in 0..60u64 {
        let mut g = Gen { rng: ChaCha8Rng::seed_from_u64(seed), seq: BTreeMap::new() };
        let mut l = Log::new(s);
        for step in 0..300 {
            let p = g.rng.random_range(0..P);
            let (w, v, tick) = g.record(p);
            if tick {
                l.time[p as usize] += g.rng.random_range(0..300);
            }
            let before = naive(&l.a, p);
            let out = l.put(w, v.clone());
            let ctx = format!("seed {seed} step {step} partition {p}: {out:?}");
            if let Bad(r) = out {
                *reasons.entry(r).or_default() += 1;
                justify(r, &before, &l.a, p, &v, &s).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            }
            for q in 0..P {
                let n = naive(&l.a, q);
                let part = l.a.partition(q);
                assert!(
                    n.keyspaces.len() <= s.max_keyspaces_per_partition as usize,
                    "{ctx}: keyspaces of {q}"
                );
                assert!(n.holders <= s.max_holders_per_partition as usize, "{ctx}: holders of {q}");
                assert!(part.feeds.len() <= s.max_feeds_per_partition as usize, "{ctx}: feeds of {q}");
                assert!(part.workers.len() <= s.max_workers_per_partition as usize, "{ctx}: workers of {q}");
                for (k, f) in &part.feeds {
                    let lanes: BTreeSet<u32> = f.lanes.iter().chain(f.lane_meta.keys()).copied().collect();
                    assert!(lanes.len() <= s.max_lanes_per_feed as usize, "{ctx}: lanes of {k:?}");
                }
            }
            for id in l.a.engine().keyspace_ids() {
                let k = l.a.engine().keyspace(&id).unwrap();
                let k = k.read();
                assert!(k.holder_count() > 0, "{ctx}: {id} exists without holders");
                k.check_invariants().unwrap_or_else(|e| panic!("{ctx}: {id}: {e}"));
            }
        }
    }
    for r in [
        BadReason::NameTooLong,
        BadReason::TooManyKeyspaces,
        BadReason::TooManyFeeds,
        BadReason::TooManyLanes,
        BadReason::TooManyHolders,
        BadReason::TooManyWorkers,
        BadReason::MetadataTooLarge,
    ] {
        assert!(reasons.get(&r).copied().unwrap_or(0) >= 5, "{r} exercised: {reasons:?}");
    }
}

/// Checks, from the recount before the record, that refusing `v` for `r` was right.
fn justify(
    r: BadReason,
    before: &Naive,
    a: &Applier,
    p: u32,
    v: &[u8],
    s: &StateSettings,
) -> Result<(), String> {
    use prefixlog_state::record::{decode, Op};
    let op = decode(Some(v), p, P, usize::MAX).map_err(|e| format!("undecodable: {e}"))?;
    let part = a.partition(p);
    let ok = match (&op, r) {
        (Op::KvEvents { keyspace, lanes, .. }, BadReason::NameTooLong) => {
            keyspace.model.len() > s.max_name_bytes as usize
                || lanes.iter().any(|l| l.kind.len() > s.max_name_bytes as usize)
        }
        (Op::Placement { keyspace, .. }, BadReason::NameTooLong) => {
            keyspace.model.len() > s.max_name_bytes as usize
        }
        (Op::KvEvents { keyspace, .. } | Op::Placement { keyspace, .. }, BadReason::TooManyKeyspaces) => {
            !before.keyspaces.contains(keyspace)
                && before.keyspaces.len() == s.max_keyspaces_per_partition as usize
        }
        (Op::KvEvents { .. }, BadReason::TooManyFeeds) => {
            part.feeds.len() == s.max_feeds_per_partition as usize
        }
        (Op::KvEvents { keyspace, worker, dp_rank, epoch, events, lanes, .. }, BadReason::TooManyLanes) => {
            let feed = part
                .feeds
                .iter()
                .find(|(k, _)| &k.keyspace == keyspace && k.worker == *worker && k.dp_rank == *dp_rank);
            let mut all: BTreeSet<u32> = match feed {
                Some((_, f)) if f.epoch == *epoch => {
                    f.lanes.iter().chain(f.lane_meta.keys()).copied().collect()
                }
                _ => BTreeSet::new(),
            };
            all.extend(events.iter().map(KvOp::lane).chain(lanes.iter().map(|l| l.lane)));
            all.len() > s.max_lanes_per_feed as usize
        }
        (Op::KvEvents { keyspace, worker, dp_rank, events, .. }, BadReason::TooManyHolders) => {
            // One holder per (lane, tier).
            let new: BTreeSet<HolderKey> = events
                .iter()
                .filter_map(|e| match e {
                    KvOp::Stored { tier, lane, parent_ext: None, .. } => {
                        Some(HolderKey::new(*worker, *dp_rank, *lane).on(*tier))
                    }
                    _ => None,
                })
                .filter(|k| !before.holder_keys.contains(&(keyspace.clone(), *k)))
                .collect();
            !new.is_empty() && before.holders + new.len() > s.max_holders_per_partition as usize
        }
        (Op::Placement { .. }, BadReason::TooManyHolders) => {
            before.holders == s.max_holders_per_partition as usize
        }
        (Op::Lifecycle { change: Lifecycle::Added { metadata }, .. }, BadReason::MetadataTooLarge) => {
            metadata.iter().map(|(k, v)| k.len() + v.len() + 32).sum::<usize>()
                > s.max_worker_metadata_bytes as usize
        }
        (Op::Lifecycle { worker, .. }, BadReason::TooManyWorkers) => {
            !part.workers.contains_key(worker) && part.workers.len() == s.max_workers_per_partition as usize
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("refused as {r}, which the recount does not confirm: {op:?}"))
    }
}

/// The same per-partition records in different interleavings give the same refusals, counters,
/// usage, digests and digest points per partition, and the same keyspaces and holders.
#[test]
fn limits_refuse_the_same_records_in_every_interleaving() {
    let s = settings();
    let mut g = Gen { rng: ChaCha8Rng::seed_from_u64(7), seq: BTreeMap::new() };
    // Per partition: (timestamp, value); log time advances on ticks.
    let mut log: Vec<Vec<(u64, Vec<u8>)>> = vec![Vec::new(); P as usize];
    let mut time = vec![1_000u64; P as usize];
    for _ in 0..600 {
        let p = g.rng.random_range(0..P);
        let (_, v, tick) = g.record(p);
        if tick {
            time[p as usize] += g.rng.random_range(0..300);
        }
        log[p as usize].push((time[p as usize], v));
    }
    let run = |order: &mut dyn FnMut(&[usize]) -> usize| {
        let mut a = Applier::new(P, s);
        let mut next = vec![0usize; P as usize];
        loop {
            let open: Vec<usize> = (0..P as usize).filter(|&p| next[p] < log[p].len()).collect();
            if open.is_empty() {
                break;
            }
            let p = order(&open);
            let (t, v) = &log[p][next[p]];
            a.apply(p as u32, next[p] as i64, *t, Some(v)).unwrap();
            next[p] += 1;
        }
        a
    };
    let reference = run(&mut |open| open[0]);
    let refused: u64 = (0..P).map(|p| reference.partition(p).counters.bad.values().sum::<u64>()).sum();
    assert!(refused >= 30, "the limits refuse records: {refused}");
    let holders = |a: &Applier| {
        a.engine()
            .keyspace_ids()
            .into_iter()
            .map(|id| (id.clone(), a.engine().keyspace(&id).unwrap().read().holder_summaries()))
            .collect::<Vec<_>>()
    };
    for seed in 0..12u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let a = run(&mut |open| open[rng.random_range(0..open.len())]);
        for p in 0..P {
            assert_eq!(
                a.partition(p),
                reference.partition(p),
                "seed {seed} partition {p}: state and counters"
            );
            assert_eq!(a.usage(p), reference.usage(p), "seed {seed} partition {p}: usage");
            assert_eq!(a.partition_digest(p), reference.partition_digest(p), "seed {seed} partition {p}");
            let (x, y): (Vec<_>, Vec<_>) =
                (a.digest_points(p).collect(), reference.digest_points(p).collect());
            assert_eq!(x, y, "seed {seed} partition {p}: digest points");
        }
        assert_eq!(holders(&a), holders(&reference), "seed {seed}: keyspaces and holders");
    }
}
