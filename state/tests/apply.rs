//! The applier without Kafka: determinism across partition interleavings and batching, the
//! feed policy (duplicates, epochs, gaps, bad records), strict offsets and accepted log gaps,
//! the log-time step limit, and announced workers.

use prefixlog_engine::{partition_of, HolderKey, KeyspaceId, MatchOptions};
use prefixlog_state::record::{
    encode_kv_events, encode_lifecycle, encode_placement, encode_tick, worker_for_partition,
};
use prefixlog_state::BlockHashes;
use prefixlog_state::{Applier, BadReason, KvOp, Lifecycle, NotNext, Outcome, StateSettings, Tier};
use prefixlog_workload::{generate, FleetConfig, Step, TraceRequest};
use rand::{Rng, SeedableRng};

const P: u32 = 4;

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}

fn settings() -> StateSettings {
    StateSettings {
        max_blocks_per_record: 64,
        expiry_interval_ms: 100,
        digest_interval: 7,
        ..Default::default()
    }
}

fn applier() -> Applier {
    Applier::new(P, settings())
}

/// A partitioned log from the trace workload: per partition, (timestamp, value).
fn log() -> Vec<Vec<(u64, Vec<u8>)>> {
    let trace: Vec<TraceRequest> = (0..300u64)
        .map(|i| TraceRequest { timestamp_ms: i, hash_ids: vec![0, 1 + i % 11, 20 + i % 37, 100 + i] })
        .collect();
    let steps =
        generate(&trace, &FleetConfig { workers: 9, capacity_blocks: 40, stretch: 2, copies: 1, seed: 5 });
    let mut parts = vec![Vec::new(); P as usize];
    let mut seq = [0u64; 9];
    for (i, s) in steps.iter().enumerate() {
        let t = 1_000 + i as u64 * 7;
        let (w, v) = match s {
            Step::Stored { worker, parent_ext, blocks } => {
                let w = *worker as usize;
                seq[w] += 1;
                let ev = KvOp::Stored {
                    tier: Tier::Gpu,
                    lane: 0,
                    parent_ext: *parent_ext,
                    blocks: blocks.clone(),
                };
                (*worker as u64, encode_kv_events(&ks(), *worker as u64, 0, 1, seq[w], false, &[ev]))
            }
            Step::Removed { worker, exts } => {
                let w = *worker as usize;
                seq[w] += 1;
                let ev = KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: exts.clone() };
                (*worker as u64, encode_kv_events(&ks(), *worker as u64, 0, 1, seq[w], false, &[ev]))
            }
            Step::Match { locals } => {
                let w = 100 + (i as u64 % 5); // placement-only workers
                (w, encode_placement(&ks(), HolderKey::new(w, 0, 0), locals, &[], "g"))
            }
        };
        parts[partition_of(w, P) as usize].push((t, v));
    }
    for (p, part) in parts.iter_mut().enumerate() {
        let w = prefixlog_state::record::worker_for_partition(p as u32, P);
        part.push((1_000_000, encode_tick(w)));
    }
    parts
}

fn digests(a: &Applier) -> Vec<u64> {
    (0..P).map(|p| a.partition_digest(p)).collect()
}

#[test]
fn interleaving_of_partitions_does_not_change_digests() {
    let log = log();
    let mut reference = applier();
    for (p, part) in log.iter().enumerate() {
        for (o, (t, v)) in part.iter().enumerate() {
            assert_eq!(reference.apply(p as u32, o as i64, *t, Some(v)), Ok(Outcome::Applied));
        }
    }
    let want = digests(&reference);
    assert!(want.iter().filter(|&&d| d != 0).count() >= 2, "most partitions hold state: {want:?}");
    for seed in 0..20u64 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut a = applier();
        let mut next = vec![0usize; P as usize];
        loop {
            let open: Vec<usize> = (0..P as usize).filter(|&p| next[p] < log[p].len()).collect();
            if open.is_empty() {
                break;
            }
            let p = open[rng.random_range(0..open.len())];
            // A random batch of this partition's records.
            for _ in 0..rng.random_range(1..6) {
                if next[p] < log[p].len() {
                    let (t, v) = &log[p][next[p]];
                    a.apply(p as u32, next[p] as i64, *t, Some(v)).unwrap();
                    next[p] += 1;
                }
            }
        }
        assert_eq!(digests(&a), want, "seed {seed}");
        // Digest points are recorded at the same offsets with the same digests, whatever the
        // interleaving: what anti-entropy compares across replicas.
        for p in 0..P {
            let got: Vec<_> = a.digest_points(p).copied().collect();
            let exp: Vec<_> = reference.digest_points(p).copied().collect();
            assert!(!exp.is_empty());
            assert_eq!(got, exp, "seed {seed} partition {p}");
        }
        // Same answers, too.
        let q: Vec<u64> = prefixlog_workload::expand_request(
            &TraceRequest { timestamp_ms: 0, hash_ids: vec![0, 3, 23] },
            0,
            2,
        )
        .iter()
        .map(|b| b.local)
        .collect();
        let o = MatchOptions { intervals: true, ..Default::default() };
        assert_eq!(a.engine().match_chain(&ks(), &q, &o), reference.engine().match_chain(&ks(), &q, &o));
    }
    // Re-delivery of already applied offsets is a no-op.
    let (t, v) = &log[0][0];
    assert_eq!(reference.apply(0, 0, *t, Some(v)), Ok(Outcome::AlreadyApplied));
    assert_eq!(digests(&reference), want);
}

fn stored(parent: Option<u64>, blocks: &[BlockHashes]) -> KvOp {
    KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: parent, blocks: blocks.to_vec() }
}

fn depth(a: &Applier, w: u64, q: &[u64]) -> u32 {
    a.engine()
        .match_chain(&ks(), q, &MatchOptions::default())
        .unwrap_or_default()
        .iter()
        .find(|m| m.holder.worker == w)
        .map_or(0, |m| m.depth)
}

/// Applies records to one partition at offsets 0, 1, 2, … (log time 10 + offset).
struct Appender {
    partition: u32,
    next: i64,
}

impl Appender {
    fn new(partition: u32) -> Self {
        Self { partition, next: 0 }
    }

    fn put(&mut self, a: &mut Applier, v: Vec<u8>) -> Outcome {
        let o = self.next;
        self.next += 1;
        a.apply(self.partition, o, 10 + o as u64, Some(&v)).expect("offsets in order")
    }
}

#[test]
fn duplicates_epochs_gaps_and_bad_records() {
    let w = 7u64;
    let p = partition_of(w, P);
    let mut a = applier();
    let mut log = Appender::new(p);
    let mut put = |a: &mut Applier, v: Vec<u8>| log.put(a, v);
    let b1 = encode_kv_events(
        &ks(),
        w,
        0,
        1,
        1,
        false,
        &[stored(None, &[(11, 1), (12, 2)].map(BlockHashes::from))],
    );
    assert_eq!(put(&mut a, b1.clone()), Outcome::Applied);
    let d = a.partition_digest(p);
    assert_eq!(put(&mut a, b1), Outcome::Duplicate, "a bridge retry");
    assert_eq!(a.partition_digest(p), d);
    assert_eq!(depth(&a, w, &[1, 2]), 2);

    // A poison record in the middle is skipped, later records still apply.
    assert_eq!(put(&mut a, b"\xff\xfe garbage".to_vec()), Outcome::Bad(BadReason::Undecodable));
    let too_many: Vec<BlockHashes> = (0..65).map(|i| (1000 + i, i)).map(BlockHashes::from).collect();
    assert_eq!(
        put(&mut a, encode_kv_events(&ks(), w, 0, 1, 2, false, &[stored(None, &too_many)])),
        Outcome::Bad(BadReason::TooManyBlocks)
    );
    let other = (0..).find(|&x| partition_of(x, P) != p).unwrap();
    assert_eq!(
        put(&mut a, encode_kv_events(&ks(), other, 0, 1, 1, false, &[])),
        Outcome::Bad(BadReason::WrongPartition)
    );
    assert_eq!(a.partition(p).counters.bad.values().sum::<u64>(), 3);

    // A gap (seq 3 → 5) is applied and marks the holder gapped.
    let b =
        encode_kv_events(&ks(), w, 0, 1, 5, false, &[stored(Some(12), &[(13, 3)].map(BlockHashes::from))]);
    assert_eq!(put(&mut a, b), Outcome::Applied);
    assert_eq!(depth(&a, w, &[1, 2, 3]), 3);
    let h = HolderKey::new(w, 0, 0);
    assert!(a.engine().keyspace(&ks()).unwrap().read().holder(&h).unwrap().gapped);
    assert_eq!(a.partition(p).counters.gaps, 1);

    // An older epoch is stale; a newer epoch clears first and un-gaps.
    assert_eq!(put(&mut a, encode_kv_events(&ks(), w, 0, 0, 9, false, &[])), Outcome::StaleEpoch);
    let b = encode_kv_events(&ks(), w, 0, 2, 1, false, &[stored(None, &[(21, 9)].map(BlockHashes::from))]);
    assert_eq!(put(&mut a, b), Outcome::Applied);
    assert_eq!(depth(&a, w, &[1, 2, 3]), 0, "new epoch cleared the old blocks");
    assert_eq!(depth(&a, w, &[9]), 1);
    assert!(!a.engine().keyspace(&ks()).unwrap().read().holder(&h).unwrap().gapped);

    // Restarted lifecycle clears too; removed drops the worker.
    assert_eq!(put(&mut a, encode_lifecycle(w, &Lifecycle::Restarted { new_epoch: 3 })), Outcome::Applied);
    assert_eq!(depth(&a, w, &[9]), 0);
    let b = encode_kv_events(&ks(), w, 0, 3, 1, false, &[stored(None, &[(31, 4)].map(BlockHashes::from))]);
    assert_eq!(put(&mut a, b), Outcome::Applied);
    assert_eq!(depth(&a, w, &[4]), 1);
    assert_eq!(put(&mut a, encode_lifecycle(w, &Lifecycle::Removed)), Outcome::Applied);
    assert_eq!(depth(&a, w, &[4]), 0);
    assert!(a.partition(p).feeds.is_empty());
    assert_eq!(a.partition(p).next_offset, log.next);
}

#[test]
fn placements_expire_by_log_time_of_their_partition_only() {
    let mut a = Applier::new(P, StateSettings { placement_ttl_ms: 500, ..settings() });
    let w = 3u64;
    let p = partition_of(w, P);
    let q = (0..P).find(|&x| x != p).unwrap();
    a.apply(p, 0, 1_000, Some(&encode_placement(&ks(), HolderKey::new(w, 0, 0), &[1, 2], &[], "g"))).unwrap();
    assert_eq!(depth(&a, w, &[1, 2]), 2);
    // Time passing on another partition does not expire it.
    let tq = prefixlog_state::record::worker_for_partition(q, P);
    a.apply(q, 0, 5_000, Some(&encode_tick(tq))).unwrap();
    assert_eq!(depth(&a, w, &[1, 2]), 2);
    // A tick on its own partition does.
    let tp = prefixlog_state::record::worker_for_partition(p, P);
    a.apply(p, 1, 1_499, Some(&encode_tick(tp))).unwrap();
    assert_eq!(depth(&a, w, &[1, 2]), 2);
    a.apply(p, 2, 1_600, Some(&encode_tick(tp))).unwrap();
    assert_eq!(depth(&a, w, &[1, 2]), 0);
}

#[test]
fn lane_metadata_is_kept_per_feed_and_cleared_by_a_new_epoch() {
    use prefixlog_state::{KvBatch, LaneMeta};
    let w = 9u64;
    let p = partition_of(w, P);
    let mut a = applier();
    let meta = LaneMeta { lane: 1, kind: "sliding_window".into(), sliding_window: 128, block_size: 16 };
    let b = KvBatch {
        keyspace: &ks(),
        worker: w,
        dp_rank: 0,
        epoch: 1,
        seq: 1,
        gap_before: false,
        events: &[stored(None, &[(1, 1)].map(BlockHashes::from))],
        lanes: std::slice::from_ref(&meta),
    }
    .encode();
    assert_eq!(a.apply(p, 0, 10, Some(&b)), Ok(Outcome::Applied));
    let d = a.partition_digest(p);
    let feed = a.partition(p).feeds.values().next().unwrap();
    assert_eq!(feed.lane_meta.get(&1), Some(&meta));
    // A restart (new epoch) forgets it until the bridge announces it again.
    let b = encode_kv_events(&ks(), w, 0, 2, 1, false, &[stored(None, &[(1, 1)].map(BlockHashes::from))]);
    assert_eq!(a.apply(p, 1, 11, Some(&b)), Ok(Outcome::Applied));
    assert!(a.partition(p).feeds.values().next().unwrap().lane_meta.is_empty());
    assert_ne!(a.partition_digest(p), d);
}

/// Offsets are strict: a record above the next offset is refused (records are missing), and
/// only an accepted gap moves past it, marking the partition's holders and feeds gapped.
#[test]
fn a_gap_in_offsets_is_refused_until_accepted_and_then_visible() {
    let w = 7u64;
    let p = partition_of(w, P);
    let mut a = applier();
    let b1 = encode_kv_events(
        &ks(),
        w,
        0,
        1,
        1,
        false,
        &[stored(None, &[(11, 1), (12, 2)].map(BlockHashes::from))],
    );
    assert_eq!(a.apply(p, 0, 10, Some(&b1)), Ok(Outcome::Applied));
    let b2 =
        encode_kv_events(&ks(), w, 0, 1, 2, false, &[stored(Some(12), &[(13, 3)].map(BlockHashes::from))]);
    assert_eq!(a.apply(p, 5, 11, Some(&b2)), Err(NotNext { partition: p, expected: 1, offered: 5 }));
    assert_eq!(depth(&a, w, &[1, 2, 3]), 2, "nothing applied past the gap");
    let h = HolderKey::new(w, 0, 0);
    let gapped = |a: &Applier| a.engine().keyspace(&ks()).unwrap().read().holder(&h).unwrap().gapped;
    assert!(!gapped(&a));
    a.accept_gap(p, 5);
    assert!(gapped(&a), "a removal may have been lost: the holder is flagged");
    assert!(a.partition(p).feeds.values().all(|f| f.gapped));
    assert_eq!(a.partition(p).counters.log_gaps, 1);
    assert_eq!(a.apply(p, 5, 11, Some(&b2)), Ok(Outcome::Applied));
    assert_eq!(depth(&a, w, &[1, 2, 3]), 3);
    // An all-cleared event resynchronises the feed.
    let b3 = encode_kv_events(
        &ks(),
        w,
        0,
        1,
        3,
        false,
        &[KvOp::Cleared { lane: 0 }, stored(None, &[(21, 4)].map(BlockHashes::from))],
    );
    assert_eq!(a.apply(p, 6, 12, Some(&b3)), Ok(Outcome::Applied));
    assert!(!gapped(&a));
}

/// A gap resynchronised by an all-cleared event for only some of the feed's lanes leaves the
/// other lanes' holders gapped: a removal for them may have been among the lost records.
#[test]
fn clearing_some_lanes_after_a_gap_leaves_the_others_gapped() {
    let w = 7u64;
    let p = partition_of(w, P);
    let mut a = applier();
    let lane = |l: u32, ext: u64, local: u64| KvOp::Stored {
        tier: Tier::Gpu,
        lane: l,
        parent_ext: None,
        blocks: [(ext, local)].map(BlockHashes::from).to_vec(),
    };
    let b1 = encode_kv_events(&ks(), w, 0, 1, 1, false, &[lane(0, 11, 1), lane(1, 12, 2)]);
    assert_eq!(a.apply(p, 0, 10, Some(&b1)), Ok(Outcome::Applied));
    let gapped = |a: &Applier, l: u32| {
        a.engine().keyspace(&ks()).unwrap().read().holder(&HolderKey::new(w, 0, l)).unwrap().gapped
    };
    // Seqs 2..3 lost; the batch clears lane 0 only.
    let b4 = encode_kv_events(&ks(), w, 0, 1, 4, false, &[KvOp::Cleared { lane: 0 }]);
    assert_eq!(a.apply(p, 1, 11, Some(&b4)), Ok(Outcome::Applied));
    assert!(gapped(&a, 1), "lane 1 was not resynchronised");
    assert!(a.partition(p).feeds.values().all(|f| f.gapped));
    // Clearing every lane resynchronises the feed.
    let b5 =
        encode_kv_events(&ks(), w, 0, 1, 5, false, &[KvOp::Cleared { lane: 0 }, KvOp::Cleared { lane: 1 }]);
    assert_eq!(a.apply(p, 2, 12, Some(&b5)), Ok(Outcome::Applied));
    assert!(!gapped(&a, 0) && !gapped(&a, 1));
    assert!(a.partition(p).feeds.values().all(|f| !f.gapped));
}

/// Records of an older epoch after a newer one are skipped, and the feed's holders flagged
/// gapped: a stream whose records are ignored no longer keeps them exact (a bridge whose clock
/// is behind its predecessor's, or two bridges for one worker). A newer epoch resynchronises.
#[test]
fn a_stale_epoch_flags_the_feed_gapped_until_a_newer_epoch() {
    let w = 7u64;
    let p = partition_of(w, P);
    let mut a = applier();
    let gapped = |a: &Applier| {
        a.engine().keyspace(&ks()).unwrap().read().holder(&HolderKey::new(w, 0, 0)).unwrap().gapped
    };
    let b = encode_kv_events(&ks(), w, 0, 5, 1, false, &[stored(None, &[(11, 1)].map(BlockHashes::from))]);
    assert_eq!(a.apply(p, 0, 10, Some(&b)), Ok(Outcome::Applied));
    assert!(!gapped(&a));
    let stale = encode_kv_events(
        &ks(),
        w,
        0,
        4,
        1,
        false,
        &[KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: vec![11] }],
    );
    assert_eq!(a.apply(p, 1, 11, Some(&stale)), Ok(Outcome::StaleEpoch));
    assert!(gapped(&a), "the removal was ignored: the holder may hold less than it is credited");
    assert_eq!(depth(&a, w, &[1]), 1);
    let newer =
        encode_kv_events(&ks(), w, 0, 6, 1, false, &[stored(None, &[(21, 2)].map(BlockHashes::from))]);
    assert_eq!(a.apply(p, 2, 12, Some(&newer)), Ok(Outcome::Applied));
    assert!(!gapped(&a));
    assert_eq!(depth(&a, w, &[1]), 0, "the new epoch cleared the old blocks");
}

/// Issue 14 item 4: one record stamped far in the future (a producer with a wrong clock) must
/// not expire every placement of its partition at once and freeze expiry afterwards.
#[test]
fn a_far_future_record_cannot_hijack_log_time() {
    let step = 10_000;
    let mut a =
        Applier::new(P, StateSettings { placement_ttl_ms: 5_000, max_log_time_step_ms: step, ..settings() });
    let w = 3u64;
    let p = partition_of(w, P);
    let tick = encode_tick(worker_for_partition(p, P));
    let place = |chain: &[u64]| encode_placement(&ks(), HolderKey::new(w, 0, 0), chain, &[], "g");
    let mut off = 0;
    let mut put = |a: &mut Applier, t: u64, v: &[u8]| {
        a.apply(p, off, t, Some(v)).unwrap();
        off += 1;
    };
    let t0 = 1_000_000u64;
    put(&mut a, t0, &place(&[1, 2]));
    put(&mut a, t0 + 1_000, &place(&[7]));
    // A tick a year ahead: log time moves by the step, not a year; it is counted.
    put(&mut a, t0 + 365 * 24 * 3_600_000, &tick);
    assert_eq!(a.partition(p).log_time, t0 + 1_000 + step);
    assert_eq!(a.partition(p).counters.log_time_clamped, 1);
    // Placements made then expire by their TTL, and so do later ones: expiry is not frozen.
    assert_eq!(depth(&a, w, &[1, 2]), 0, "5 s TTL, log time 11 s later");
    put(&mut a, t0 + 12_000, &place(&[3, 4]));
    assert_eq!(depth(&a, w, &[3, 4]), 2);
    put(&mut a, t0 + 16_000, &tick);
    assert_eq!(depth(&a, w, &[3, 4]), 2, "within its TTL of log time");
    put(&mut a, t0 + 20_000, &tick);
    assert_eq!(depth(&a, w, &[3, 4]), 0, "expired by TTL in log time after the bad record");
}

/// Workers announced by WorkerAdded are kept with their metadata (ListWorkers) until removed.
#[test]
fn announced_workers_are_state() {
    let w = 11u64;
    let p = partition_of(w, P);
    let mut a = applier();
    let before = a.partition_digest(p);
    let meta: std::collections::BTreeMap<String, String> =
        [("pod".to_string(), "vllm-0".to_string()), ("endpoint".into(), "http://10.0.0.5:8000".into())]
            .into();
    let added = encode_lifecycle(w, &Lifecycle::Added { metadata: meta.clone() });
    assert_eq!(a.apply(p, 0, 10, Some(&added)), Ok(Outcome::Applied));
    assert_eq!(a.partition(p).workers.get(&w), Some(&meta));
    assert_ne!(a.partition_digest(p), before, "announced workers are digested");
    assert_eq!(a.apply(p, 1, 11, Some(&encode_lifecycle(w, &Lifecycle::Removed))), Ok(Outcome::Applied));
    assert!(a.partition(p).workers.is_empty());
}

/// Tiers through the applier: a host copy outlives the GPU copy's removal and counts in the
/// worker's combined depth; a clear empties every tier of the lane; a record naming a tier
/// outside the enumeration is refused (`unknown_tier`) and changes nothing.
#[test]
fn tiers_are_independent_holdings_and_unknown_tiers_are_refused() {
    use prefixlog_proto::v1 as pb;
    use prost::Message;
    let w = 7u64;
    let p = partition_of(w, P);
    let mut a = applier();
    let mut log = Appender::new(p);
    let mut put = |a: &mut Applier, v: Vec<u8>| log.put(a, v);
    let host = KvOp::Stored {
        tier: Tier::Host,
        lane: 0,
        parent_ext: None,
        blocks: [(11, 1), (12, 2)].map(BlockHashes::from).to_vec(),
    };
    let ops = [stored(None, &[(11, 1), (12, 2)].map(BlockHashes::from)), host];
    assert_eq!(put(&mut a, encode_kv_events(&ks(), w, 0, 1, 1, false, &ops)), Outcome::Applied);
    let gpu_gone = [KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: vec![11, 12] }];
    assert_eq!(put(&mut a, encode_kv_events(&ks(), w, 0, 1, 2, false, &gpu_gone)), Outcome::Applied);
    let m = a.engine().match_chain(&ks(), &[1, 2], &MatchOptions::default()).unwrap();
    assert_eq!((m[0].depth, m[0].runs().len(), m[0].runs()[0].tier), (2, 1, Tier::Host), "{m:?}");
    let gpu_only = MatchOptions { tiers: vec![Tier::Gpu], ..Default::default() };
    assert!(a.engine().match_chain(&ks(), &[1, 2], &gpu_only).unwrap().is_empty());

    // A tier code from a newer writer: refused whole, the state untouched.
    let d = a.partition_digest(p);
    let mut rec = pb::Record::decode(&encode_kv_events(&ks(), w, 0, 1, 3, false, &gpu_gone)[..]).unwrap();
    if let Some(pb::record::Kind::KvEvents(b)) = &mut rec.kind {
        b.events[0].tier = 9;
    }
    assert_eq!(put(&mut a, rec.encode_to_vec()), Outcome::Bad(BadReason::UnknownTier));
    assert_eq!(a.partition_digest(p), d);

    let clear = [KvOp::Cleared { lane: 0 }];
    assert_eq!(put(&mut a, encode_kv_events(&ks(), w, 0, 1, 4, false, &clear)), Outcome::Applied);
    assert_eq!(depth(&a, w, &[1, 2]), 0, "a clear empties every tier");
}
