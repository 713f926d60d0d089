//! Checkpoint round trips, corruption, identity checks, partition-filtered exports, retention,
//! and readers beside a live writer, without Kafka.

use prefixlog_engine::{partition_of, EngineConfig, HolderKey, KeyspaceId, MatchOptions};
use prefixlog_snapshot::{
    checkpoint, codec, decode_export, export_partitions, newest_usable, restore, upgrade, Capture,
    CheckpointStore, ExportSink, Retention, Streamed, FORMAT_VERSION,
};
use prefixlog_state::record::{encode_kv_events, encode_placement};
use prefixlog_state::BlockHashes;
use prefixlog_state::{Applier, KvOp, LogIdentity, PartitionState, StateSettings, Tier};
use prefixlog_workload::{generate, FleetConfig, Step, TraceRequest};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const P: u32 = 4;
const ALL: [u32; 4] = [0, 1, 2, 3];

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}
fn settings() -> StateSettings {
    StateSettings {
        holder_capacity: 60,
        placement_ttl_ms: 2_000,
        max_blocks_per_record: 4096,
        expiry_interval_ms: 100,
        ..Default::default()
    }
}
fn ecfg() -> EngineConfig {
    settings().engine_config(P)
}
fn applier() -> Applier {
    Applier::new(P, settings())
}
fn identity() -> LogIdentity {
    LogIdentity {
        cluster_id: "c1".into(),
        topic: "t".into(),
        partitions: P,
        owned: ALL.to_vec(),
        settings: settings(),
    }
}

/// (partition, timestamp, value) in log order.
fn log() -> Vec<(u32, u64, Vec<u8>)> {
    let trace: Vec<TraceRequest> = (0..400u64)
        .map(|i| TraceRequest { timestamp_ms: i, hash_ids: vec![0, 1 + i % 17, 40 + i % 31, 100 + i] })
        .collect();
    let steps =
        generate(&trace, &FleetConfig { workers: 7, capacity_blocks: 50, stretch: 2, copies: 1, seed: 9 });
    let mut seq = [0u64; 7];
    let mut out = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let t = 1_000 + i as u64 * 13;
        let (w, v) = match s {
            Step::Stored { worker, parent_ext, blocks } => {
                seq[*worker as usize] += 1;
                let e = KvOp::Stored {
                    tier: Tier::Gpu,
                    lane: 0,
                    parent_ext: *parent_ext,
                    blocks: blocks.clone(),
                };
                (
                    *worker as u64,
                    encode_kv_events(&ks(), *worker as u64, 0, 1, seq[*worker as usize], false, &[e]),
                )
            }
            Step::Removed { worker, exts } => {
                seq[*worker as usize] += 1;
                let e = KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: exts.clone() };
                (
                    *worker as u64,
                    encode_kv_events(&ks(), *worker as u64, 0, 1, seq[*worker as usize], false, &[e]),
                )
            }
            Step::Match { locals } => {
                let w = 50 + i as u64 % 3;
                (w, encode_placement(&ks(), HolderKey::new(w, 0, 0), locals, &[], "g"))
            }
        };
        out.push((partition_of(w, P), t, v));
    }
    out
}

fn apply_all(a: &mut Applier, log: &[(u32, u64, Vec<u8>)]) {
    for (p, t, v) in log {
        let off = a.partition(*p).next_offset;
        a.apply(*p, off, *t, Some(v)).unwrap();
    }
}

fn digests(a: &Applier) -> Vec<u64> {
    (0..P).map(|p| a.partition_digest(p)).collect()
}

#[test]
fn restored_replica_matches_now_and_after_the_tail() {
    let log = log();
    let (head, tail) = log.split_at(log.len() / 2);
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let live = parking_lot::Mutex::new(applier());
    apply_all(&mut live.lock(), head);
    let (meta, _pause) = checkpoint(&live, &store, &identity()).unwrap();
    assert!(meta.holder_blocks() > 0);
    let loaded = store.load(meta.id).unwrap();
    let mut restored = restore(&loaded).unwrap();
    assert_eq!(restored.settings(), &settings(), "restore applies the checkpoint's settings");
    let mut live = live.into_inner();
    assert_eq!(digests(&restored), digests(&live));
    for (a, b) in restored.partitions().iter().zip(live.partitions()) {
        assert_eq!(a, b);
    }
    // Future behaviour (capacity eviction, placement expiry, feed seqs) is identical too.
    apply_all(&mut live, tail);
    apply_all(&mut restored, tail);
    assert_eq!(digests(&restored), digests(&live));
    let q: Vec<u64> =
        prefixlog_workload::expand_request(&TraceRequest { timestamp_ms: 0, hash_ids: vec![0, 5, 45] }, 0, 2)
            .iter()
            .map(|b| b.local)
            .collect();
    let o = MatchOptions { intervals: true, ..Default::default() };
    assert_eq!(restored.engine().match_chain(&ks(), &q, &o), live.engine().match_chain(&ks(), &q, &o));
}

#[test]
fn corrupt_or_truncated_newest_falls_back_to_older() {
    let log = log();
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let a = parking_lot::Mutex::new(applier());
    apply_all(&mut a.lock(), &log[..100]);
    let (m1, _) = checkpoint(&a, &store, &identity()).unwrap();
    apply_all(&mut a.lock(), &log[100..200]);
    let (m2, _) = checkpoint(&a, &store, &identity()).unwrap();
    for truncate in [false, true] {
        store.corrupt_for_test(m2.id, truncate).unwrap();
        let (loaded, skipped) = newest_usable(&store, &identity(), &ALL);
        assert_eq!(loaded.expect("older checkpoint").meta.id, m1.id);
        assert!(skipped[0].contains("failed verification"), "{skipped:?}");
    }
}

#[test]
fn checkpoint_of_another_log_or_other_settings_or_partitions_is_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let a = parking_lot::Mutex::new(applier());
    apply_all(&mut a.lock(), &log()[..50]);
    checkpoint(&a, &store, &identity()).unwrap();
    let other = LogIdentity { cluster_id: "c2".into(), ..identity() };
    let (l, why) = newest_usable(&store, &other, &ALL);
    assert!(l.is_none() && why[0].contains("cluster"), "{why:?}");
    let ttl = LogIdentity { settings: StateSettings { placement_ttl_ms: 1, ..settings() }, ..identity() };
    let (l, why) = newest_usable(&store, &ttl, &ALL);
    assert!(l.is_none() && why[0].contains("placement_ttl_ms 1 vs 2000"), "{why:?}");
    let (l, _) = newest_usable(&store, &identity(), &ALL);
    assert!(l.is_some());
    // A shard's checkpoint stands for its own partitions only.
    let shard = LogIdentity { owned: vec![1, 3], ..identity() };
    let dir2 = tempfile::tempdir().unwrap();
    let store2 = CheckpointStore::open(dir2.path()).unwrap();
    store2.write(&shard, &prefixlog_snapshot::Capture::of(&a.lock()), 0).unwrap();
    assert!(newest_usable(&store2, &identity(), &[1]).0.is_some());
    let (l, why) = newest_usable(&store2, &identity(), &[0, 1]);
    assert!(l.is_none() && why[0].contains("does not cover partitions [0]"), "{why:?}");
}

#[test]
fn a_partition_filtered_export_restores_exactly_those_partitions() {
    let log = log();
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let live = parking_lot::Mutex::new(applier());
    apply_all(&mut live.lock(), &log);
    let (meta, _) = checkpoint(&live, &store, &identity()).unwrap();
    let live = live.into_inner();
    for p in ALL {
        let part =
            restore(&decode_export(&export_partitions(&store, meta.id, &[p]).unwrap()).unwrap()).unwrap();
        assert_eq!(part.partition_digest(p), live.partition_digest(p), "partition {p}");
        assert_eq!(part.partition(p), live.partition(p));
        for q in ALL.iter().filter(|&&q| q != p) {
            assert_eq!(part.engine().partition_digest(*q), 0, "partition {q} left out");
        }
    }
    let err = export_partitions(&store, meta.id, &[9]).expect_err("an uncovered partition is refused");
    assert!(err.to_string().contains("does not cover"), "{err}");
}

/// Issue 14 item 6: `checkpoints list` next to a replica checkpointing every 2 s failed
/// intermittently (a read-only open stat'ed a rotated WAL file). Readers are secondaries now.
#[test]
fn readers_beside_a_live_writer_never_fail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoints");
    let store = Arc::new(CheckpointStore::open(&path).unwrap());
    let live = Arc::new(parking_lot::Mutex::new(applier()));
    apply_all(&mut live.lock(), &log()[..200]);
    checkpoint(&live, &store, &identity()).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, live, done) = (store.clone(), live.clone(), done.clone());
        std::thread::spawn(move || {
            let retention = Retention { keep_last: 2, ..Default::default() };
            let mut written = 0;
            while !done.load(Ordering::Acquire) {
                checkpoint(&live, &store, &identity()).unwrap();
                store.apply_retention(&retention).unwrap();
                written += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            written
        })
    };
    let mut failures = Vec::new();
    for i in 0..200 {
        let read = || -> Result<u64, String> {
            let r = CheckpointStore::open_reader(&path).map_err(|e| e.to_string())?;
            let id = *r.ids().first().ok_or("no checkpoint")?;
            r.meta(id).map_err(|e| e.to_string())?;
            if i % 10 == 0 {
                r.load(id).map_err(|e| e.to_string())?;
            }
            Ok(id)
        };
        if let Err(e) = read() {
            failures.push(e);
        }
    }
    done.store(true, Ordering::Release);
    let written = writer.join().unwrap();
    assert!(written >= 2, "the writer wrote {written} checkpoints meanwhile");
    assert!(
        failures.is_empty(),
        "{} of 200 reads failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(3)]
    );
}

#[test]
fn retention_keeps_last_k_and_a_thinned_series() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    // Records 30 min apart: allow log time to step that far.
    let mut a = Applier::new(P, StateSettings { max_log_time_step_ms: 3_600_000, ..settings() });
    // Checkpoints at log times 0.5h, 1h, ..., 6h (every 30 min).
    for i in 1..=12u64 {
        let p = 0;
        let w = prefixlog_state::record::worker_for_partition(p, P);
        let off = a.partition(p).next_offset;
        a.apply(p, off, i * 1_800_000, Some(&prefixlog_state::record::encode_tick(w))).unwrap();
        store.write(&identity(), &prefixlog_snapshot::Capture::of(&a), 0).unwrap();
    }
    let r = Retention { keep_last: 2, thin_interval_ms: 3_600_000, window_ms: 3 * 3_600_000 };
    store.apply_retention(&r).unwrap();
    let mut kept = store.ids();
    kept.sort();
    // Last 2 (ids 11, 12) plus the oldest per hour within 3 h of the newest (6 h): hours 3,4,5,6
    // → ids 6 (3.0h), 8 (4.0h), 10 (5.0h), 12 (6.0h).
    assert_eq!(kept, vec![6, 8, 10, 11, 12]);
}

#[test]
fn decoding_garbage_never_panics() {
    use rand::{Rng, SeedableRng};
    let mut a = applier();
    apply_all(&mut a, &log()[..150]);
    let ks = a.engine().keyspace(&ks()).unwrap();
    let mut good = Vec::new();
    ks.read().write_image(&mut good).unwrap();
    let back = prefixlog_engine::Keyspace::read_image(&good, ecfg()).unwrap();
    assert_eq!(back.dump(), ks.read().dump());
    let parts = codec::encode_partition_value(a.partitions(), &points(&a));
    let old = upgrade::partitions::encode_partitions(a.partitions());
    // Everything but the record marks, which a checkpoint keeps in its meta.
    let unmarked: Vec<_> =
        a.partitions().iter().cloned().map(|p| PartitionState { last_mark: 0, ..p }).collect();
    assert_eq!(
        codec::decode_partition_value(&parts, FORMAT_VERSION).unwrap(),
        (unmarked.clone(), points(&a))
    );
    assert_eq!(upgrade::partitions::decode_partitions(&old).unwrap(), unmarked);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut refused = 0;
    for i in 0..2_000 {
        let mut v = [&good, &parts, &old][i % 3].clone();
        match (i / 3) % 3 {
            0 => v.truncate(rng.random_range(0..v.len())),
            1 => {
                for _ in 0..4 {
                    let j = rng.random_range(0..v.len());
                    v[j] = rng.random();
                }
            }
            _ => v = (0..rng.random_range(0..200)).map(|_| rng.random()).collect(),
        }
        let _ = codec::decode_partition_value(&v, FORMAT_VERSION);
        let _ = upgrade::partitions::decode_partitions(&v);
        refused += usize::from(prefixlog_engine::Keyspace::read_image(&v, ecfg()).is_err());
    }
    assert!(refused > 1_900, "damaged images are refused ({refused} of 2000)");
}

/// An upgrade: a format-2 checkpoint (columnar dumps, as the previous release wrote) is still
/// restored, equal to the state it was taken of now and after the same tail; its export
/// carries format 2 to a peer and imports unchanged; new checkpoints are format 3 (images).
#[test]
fn format_2_checkpoints_still_restore_after_an_upgrade() {
    let log = log();
    let (head, tail) = log.split_at(log.len() / 2);
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let mut live = applier();
    apply_all(&mut live, head);
    let dumps: Vec<_> = live.engine().keyspaces().iter().map(|k| k.read().dump()).collect();
    let old = store.write_format2_for_test(&identity(), live.partitions(), &digests(&live), &dumps).unwrap();
    assert_eq!(store.meta(old.id).unwrap().format, 2);
    let (loaded, skipped) = newest_usable(&store, &identity(), &ALL);
    let loaded = loaded.expect("the format-2 checkpoint is usable");
    assert!(skipped.is_empty(), "{skipped:?}");
    assert!(matches!(loaded.keyspaces[0].state, prefixlog_snapshot::StoredKeyspace::Dump(_)));
    let mut restored = restore(&loaded).unwrap();
    assert_eq!(digests(&restored), digests(&live));
    apply_all(&mut restored, tail);
    apply_all(&mut live, tail);
    assert_eq!(digests(&restored), digests(&live), "and evolves alike");

    let peer_dir = tempfile::tempdir().unwrap();
    let peer = CheckpointStore::open(peer_dir.path()).unwrap();
    let imported = peer.import(&store.export(old.id).unwrap()).unwrap();
    assert_eq!(imported.format, 2, "an import keeps the format it was written in");
    assert_eq!(digests(&restore(&peer.load(imported.id).unwrap()).unwrap()), old.digests);

    let new = checkpoint(&parking_lot::Mutex::new(live), &store, &identity()).unwrap().0;
    assert_eq!(new.format, prefixlog_snapshot::FORMAT_VERSION);
    let loaded = store.load(new.id).unwrap();
    assert!(matches!(loaded.keyspaces[0].state, prefixlog_snapshot::StoredKeyspace::Image(_)));
}

fn points(a: &Applier) -> Vec<Vec<prefixlog_state::DigestPoint>> {
    a.all_digest_points()
}

/// Checkpoints keep every partition's digest points (format 5 on), so anti-entropy compares as
/// far back after a restart as before it (and a peer bootstrapped from the checkpoint too);
/// format-4 checkpoints (no points) still restore, with none.
#[test]
fn digest_points_survive_a_checkpoint_and_format_4_still_restores() {
    let log = log();
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let mut live = Applier::new(P, StateSettings { digest_interval: 7, ..settings() });
    let id4 = {
        apply_all(&mut live, &log[..100]);
        let ids = identity();
        let id = LogIdentity { settings: *live.settings(), ..ids };
        store.write_format4_for_test(&id, &Capture::of(&live)).unwrap().id
    };
    apply_all(&mut live, &log[100..]);
    let ident = LogIdentity { settings: *live.settings(), ..identity() };
    let meta = store.write(&ident, &Capture::of(&live), 0).unwrap();
    assert_eq!(meta.format, prefixlog_snapshot::FORMAT_VERSION);
    assert!(points(&live).iter().map(Vec::len).sum::<usize>() > 40, "points to keep");
    let restored = restore(&store.load(meta.id).unwrap()).unwrap();
    assert_eq!(points(&restored), points(&live), "every point, in order");
    // Through an export (a peer's bootstrap), and a partition-filtered one.
    let moved = restore(&decode_export(&store.export(meta.id).unwrap()).unwrap()).unwrap();
    assert_eq!(points(&moved), points(&live));
    let one = restore(&decode_export(&export_partitions(&store, meta.id, &[2]).unwrap()).unwrap()).unwrap();
    assert_eq!(one.digest_points(2).collect::<Vec<_>>(), live.digest_points(2).collect::<Vec<_>>());
    assert_eq!(one.digest_points(1).count(), 0, "only the exported partition's");
    // The previous format: restores, without points; the state is the same.
    let old = store.load(id4).unwrap();
    assert_eq!(old.meta.format, 4);
    let mut from4 = restore(&old).unwrap();
    assert!(points(&from4).iter().all(Vec::is_empty));
    apply_all(&mut from4, &log[100..]);
    assert_eq!(digests(&from4), digests(&live), "and evolves like the live state");
}

/// What a peer's transfer sends ([`CheckpointStore::export_to`]): the export byte for byte, in
/// pieces of at most one stored chunk; a damaged chunk ends it with an error before its end.
#[test]
fn a_streamed_export_is_the_export_in_bounded_pieces_and_stops_at_damage() {
    struct Collect {
        total: u64,
        data: Vec<u8>,
        largest: usize,
        stop_after: Option<usize>,
        pieces: usize,
    }
    impl ExportSink for Collect {
        fn begin(&mut self, _id: u64, total: u64) -> bool {
            self.total = total;
            true
        }
        fn write(&mut self, piece: &[u8]) -> bool {
            self.largest = self.largest.max(piece.len());
            self.data.extend_from_slice(piece);
            self.pieces += 1;
            self.stop_after.is_none_or(|n| self.pieces < n)
        }
    }
    let sink = |stop_after| Collect { total: 0, data: Vec::new(), largest: 0, stop_after, pieces: 0 };
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    // A keyspace of several 4 MiB chunks.
    let mut a = applier();
    let ks = ks();
    for w in 0..48u64 {
        for r in 0..4u64 {
            let blocks: Vec<BlockHashes> = (0..1000)
                .map(|j| (w << 40 | r << 20 | j, w << 32 | r << 16 | j))
                .map(BlockHashes::from)
                .collect();
            let parent = (r > 0).then(|| w << 40 | (r - 1) << 20 | 999);
            let v = encode_kv_events(
                &ks,
                w,
                0,
                1,
                r + 1,
                false,
                &[KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: parent, blocks }],
            );
            let p = partition_of(w, P);
            let off = a.partition(p).next_offset;
            a.apply(p, off, 1_000, Some(&v)).unwrap();
        }
    }
    let ident = LogIdentity { settings: *a.settings(), ..identity() };
    let meta = store.write(&ident, &Capture::of(&a), 0).unwrap();
    assert!(meta.keyspaces[0].chunks >= 2, "{:?}", meta.keyspaces);
    let mut s = sink(None);
    assert_eq!(store.export_to(meta.id, &mut s).unwrap(), Streamed::Complete { bytes: s.total });
    assert_eq!(s.data, store.export(meta.id).unwrap());
    assert_eq!(s.total as usize, s.data.len());
    assert!(s.largest <= 4 << 20, "pieces of at most one stored chunk: {}", s.largest);
    // The receiver leaves: the stream stops.
    let mut s = sink(Some(3));
    assert_eq!(store.export_to(meta.id, &mut s).unwrap(), Streamed::Stopped);
    // A damaged chunk: an error, and the stream never reached its end.
    store.corrupt_for_test(meta.id, false).unwrap();
    let mut s = sink(None);
    let e = store.export_to(meta.id, &mut s).expect_err("damage is found on the way");
    assert!(e.to_string().contains("checksum"), "{e}");
    assert!((s.data.len() as u64) < s.total);
}
