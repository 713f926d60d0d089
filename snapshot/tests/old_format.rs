//! A checkpoint in the format main wrote before the serde codec (format 5, hand-laid metas and
//! partition state), stored as an export under `tests/fixtures/`: it must keep restoring to the
//! digests recorded beside it, and evolve like a replica that never stopped.
//!
//! The fixture was generated once, by the code that wrote that format (`encode_export` of the
//! head below, on main before format 6); this build writes format 6, so it cannot regenerate it,
//! and must not: its point is to be the old bytes. It is read through `prefixlog_snapshot::upgrade`.

use prefixlog_engine::{partition_of, HolderKey, KeyspaceId};
use prefixlog_snapshot::{decode_export, encode_export, restore, Capture, CheckpointStore, FORMAT_VERSION};
use prefixlog_state::record::{encode_kv_events, encode_placement};
use prefixlog_state::{Applier, KvOp, LogIdentity, StateSettings, Tier};
use prefixlog_workload::{generate, FleetConfig, Step, TraceRequest};
use std::path::PathBuf;

const P: u32 = 4;
const CREATED_UNIX_MS: u64 = 1_765_000_000_000;
const FIXTURE: &str = "format5.export";
const DIGESTS: &str = "format5.digests";

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}
fn ks() -> KeyspaceId {
    KeyspaceId::new("m", 16, 1)
}
fn settings() -> StateSettings {
    StateSettings {
        holder_capacity: 60,
        placement_ttl_ms: 2_000,
        max_blocks_per_record: 4096,
        expiry_interval_ms: 100,
        digest_interval: 7,
        ..Default::default()
    }
}
fn identity() -> LogIdentity {
    LogIdentity {
        cluster_id: "c1".into(),
        topic: "t".into(),
        partitions: P,
        owned: vec![0, 1, 2, 3],
        settings: settings(),
    }
}

/// (partition, timestamp, value) in log order: stores, removals and placements of a fleet.
fn log() -> Vec<(u32, u64, Vec<u8>)> {
    let trace: Vec<TraceRequest> = (0..300u64)
        .map(|i| TraceRequest { timestamp_ms: i, hash_ids: vec![0, 1 + i % 13, 30 + i % 29, 90 + i] })
        .collect();
    let steps =
        generate(&trace, &FleetConfig { workers: 6, capacity_blocks: 40, stretch: 2, copies: 1, seed: 5 });
    let mut seq = [0u64; 6];
    let mut out = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        let t = 1_000 + i as u64 * 11;
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

fn recorded_digests() -> Vec<u64> {
    let text = std::fs::read_to_string(fixtures().join(DIGESTS)).unwrap();
    text.lines().map(|l| l.parse().unwrap()).collect()
}

#[test]
fn a_format_5_checkpoint_from_main_restores_to_its_digests() {
    let log = log();
    let (head, tail) = log.split_at(log.len() / 2);
    let bytes = std::fs::read(fixtures().join(FIXTURE)).unwrap();
    let loaded = decode_export(&bytes).unwrap();
    assert_eq!(loaded.meta.format, 5);
    assert_eq!(loaded.meta.created_unix_ms, CREATED_UNIX_MS);
    assert!(loaded.meta.holder_blocks() > 0, "the fixture holds blocks");
    let mut restored = restore(&loaded).unwrap();
    assert_eq!(restored.settings(), &settings());
    assert_eq!(digests(&restored), recorded_digests(), "the digests recorded when it was written");
    // The same state as a replica that applied the head itself, now and after the tail.
    let mut live = Applier::new(P, settings());
    apply_all(&mut live, head);
    assert_eq!(digests(&restored), digests(&live));
    assert_eq!(restored.all_digest_points(), live.all_digest_points(), "digest points kept");
    assert!(live.all_digest_points().iter().map(Vec::len).sum::<usize>() > 10, "points to keep");
    apply_all(&mut live, tail);
    apply_all(&mut restored, tail);
    assert_eq!(digests(&restored), digests(&live), "and evolves like the live state");
}

/// Passed on as stored: an import keeps format 5 (its meta re-encoded by the upgrade module
/// under the importing store's id), and its export reads back the same; a new checkpoint of
/// the restored state is this build's format and restores alike.
#[test]
fn a_format_5_checkpoint_imports_as_stored_and_checkpoints_anew_in_format_6() {
    let bytes = std::fs::read(fixtures().join(FIXTURE)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = CheckpointStore::open(dir.path()).unwrap();
    let imported = store.import(&bytes).unwrap();
    assert_eq!(imported.format, 5);
    let again = decode_export(&store.export(imported.id).unwrap()).unwrap();
    let first = decode_export(&bytes).unwrap();
    assert_eq!(again.meta, prefixlog_snapshot::CheckpointMeta { id: imported.id, ..first.meta.clone() });
    assert_eq!(again.partitions, first.partitions);
    assert_eq!(again.points, first.points);
    let restored = restore(&store.load(imported.id).unwrap()).unwrap();
    assert_eq!(digests(&restored), recorded_digests());

    let anew = store.write(&identity(), &Capture::of(&restored), CREATED_UNIX_MS).unwrap();
    assert_eq!(anew.format, FORMAT_VERSION);
    let reloaded = store.load(anew.id).unwrap();
    assert_eq!(reloaded.points, first.points);
    assert_eq!(digests(&restore(&reloaded).unwrap()), recorded_digests());
    let exported = encode_export(&identity(), &Capture::of(&restored), CREATED_UNIX_MS);
    assert_eq!(decode_export(&exported).unwrap().meta.format, FORMAT_VERSION);
}
