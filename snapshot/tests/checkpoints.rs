//! Checkpoint round trips, corruption, identity checks and retention, without Kafka.

use prefixlog_engine::{partition_of, Engine, EngineConfig, HolderKey, KeyspaceId, MatchOptions};
use prefixlog_ingest::record::{encode_kv_events, encode_placement};
use prefixlog_ingest::{Applier, ApplyConfig, KvOp};
use prefixlog_snapshot::{
    checkpoint, codec, newest_usable, restore, CheckpointStore, LogIdentity, Retention,
};
use prefixlog_workload::{generate, FleetConfig, Step, TraceRequest};
use std::sync::Arc;

const P: u32 = 4;

fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}
fn ecfg() -> EngineConfig {
    EngineConfig { partitions: P, holder_capacity: 60, placement_ttl_ms: 2_000, ..Default::default() }
}
fn acfg() -> ApplyConfig {
    ApplyConfig { partitions: P, max_blocks_per_record: 4096, expiry_interval_ms: 100, ..Default::default() }
}
fn applier() -> Applier {
    Applier::new(Arc::new(Engine::new(ecfg())), acfg())
}
fn identity() -> LogIdentity {
    LogIdentity { cluster_id: "c1".into(), topic: "t".into(), partitions: P }
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
                let e = KvOp::Stored { lane: 0, parent_ext: *parent_ext, blocks: blocks.clone() };
                (
                    *worker as u64,
                    encode_kv_events(&ks(), *worker as u64, 0, 1, seq[*worker as usize], false, &[e]),
                )
            }
            Step::Removed { worker, exts } => {
                seq[*worker as usize] += 1;
                let e = KvOp::Removed { lane: 0, exts: exts.clone() };
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
        a.apply(*p, off, *t, Some(v));
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
    let mut restored = restore(&loaded, ecfg(), acfg()).unwrap();
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
            .map(|b| b.1)
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
    let hw = vec![i64::MAX; P as usize];
    for truncate in [false, true] {
        store.corrupt_for_test(m2.id, truncate).unwrap();
        let (loaded, skipped) = newest_usable(&store, &identity(), &hw);
        assert_eq!(loaded.expect("older checkpoint").meta.id, m1.id);
        assert!(skipped[0].contains("failed verification"), "{skipped:?}");
    }
}

#[test]
fn checkpoint_of_another_log_is_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let a = parking_lot::Mutex::new(applier());
    apply_all(&mut a.lock(), &log()[..50]);
    checkpoint(&a, &store, &identity()).unwrap();
    let hw = vec![i64::MAX; P as usize];
    let other = LogIdentity { cluster_id: "c2".into(), ..identity() };
    let (l, why) = newest_usable(&store, &other, &hw);
    assert!(l.is_none() && why[0].contains("cluster"), "{why:?}");
    let (l, why) = newest_usable(&store, &identity(), &[0; P as usize]);
    assert!(l.is_none() && why[0].contains("log ends at"), "{why:?}");
    let (l, _) = newest_usable(&store, &identity(), &hw);
    assert!(l.is_some());
}

#[test]
fn retention_keeps_last_k_and_a_thinned_series() {
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let mut a = applier();
    // Checkpoints at log times 0.5h, 1h, ..., 6h (every 30 min).
    for i in 1..=12u64 {
        let p = 0;
        let w = prefixlog_ingest::record::worker_for_partition(p, P);
        let off = a.partition(p).next_offset;
        a.apply(p, off, i * 1_800_000, Some(&prefixlog_ingest::record::encode_tick(w)));
        store.write(&identity(), a.partitions(), &[], 0).unwrap();
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
    let dump = a.engine().keyspace(&ks()).unwrap().read().dump();
    let good = codec::encode_keyspace(&dump);
    assert_eq!(codec::decode_keyspace(&good).unwrap(), dump);
    let parts = codec::encode_partitions(a.partitions());
    assert_eq!(codec::decode_partitions(&parts).unwrap(), a.partitions());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for i in 0..2_000 {
        let mut v = if i % 2 == 0 { good.clone() } else { parts.clone() };
        match i % 3 {
            0 => v.truncate(rng.random_range(0..v.len())),
            1 => {
                for _ in 0..4 {
                    let j = rng.random_range(0..v.len());
                    v[j] = rng.random();
                }
            }
            _ => v = (0..rng.random_range(0..200)).map(|_| rng.random()).collect(),
        }
        let _ = codec::decode_keyspace(&v);
        let _ = codec::decode_partitions(&v);
        if let Ok(d) = codec::decode_keyspace(&v) {
            let _ = prefixlog_engine::Keyspace::rebuild(&d, ecfg());
        }
    }
}
