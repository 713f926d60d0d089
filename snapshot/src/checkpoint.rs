//! Taking checkpoints of a running replica ([`checkpoint`]: a capture written to the store),
//! restoring a replica from one, and choosing which; partition-filtered exports.

use crate::capture::{capture_sound, Capture};
use crate::error::StoreError;
use crate::export::{encode_export, KeyspaceRestoreError, Loaded, LoadedKeyspace};
use crate::meta::CheckpointMeta;
use crate::store::CheckpointStore;
use parking_lot::Mutex;
use prefixlog_engine::{Engine, EngineConfig, Keyspace, KeyspaceId};
use prefixlog_state::{check_compatible, Applier, Incompatible, LogIdentity};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("checkpoint {id}: keyspace {keyspace}: {source}")]
    Rebuild {
        id: u64,
        keyspace: KeyspaceId,
        #[source]
        source: KeyspaceRestoreError,
    },
    #[error("checkpoint {id} cannot stand for this replica's state: {why}")]
    Incompatible { id: u64, why: Incompatible },
}

/// Wall-clock time for the operator-facing `created` field (never applied state).
fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Captures and writes a checkpoint; writes nothing ([`StoreError::Withheld`]) of a state that
/// holds part of a record whose apply failed.
pub fn checkpoint(
    applier: &Mutex<Applier>,
    store: &CheckpointStore,
    identity: &LogIdentity,
) -> Result<(CheckpointMeta, Duration), StoreError> {
    let c = capture_sound(applier)?;
    let meta = store.write(identity, &c, now_ms())?;
    Ok((meta, c.ingest_pause))
}

/// Builds an applier (and its engine) from a loaded checkpoint, with the settings it was
/// applied with.
pub fn restore(loaded: &Loaded) -> Result<Applier, RestoreError> {
    let id = &loaded.meta.identity;
    let engine_cfg = id.settings.engine_config(id.partitions);
    let engine = Engine::new(engine_cfg.clone());
    for ks in restore_keyspaces(loaded, &engine_cfg)? {
        engine.install(ks);
    }
    let mut applier = Applier::with_engine(Arc::new(engine), id.settings);
    applier.restore_partitions(loaded.partitions.clone());
    applier.restore_digest_points(loaded.points.clone());
    Ok(applier)
}

/// Every keyspace of `loaded` rebuilt, in its order, on as many threads as the machine has
/// cores (each keyspace is independent; a large image also decodes its two halves at once).
/// The first error in keyspace order wins, whatever thread finished first.
fn restore_keyspaces(loaded: &Loaded, cfg: &EngineConfig) -> Result<Vec<Keyspace>, RestoreError> {
    let rebuild = |k: &LoadedKeyspace| {
        k.restore(cfg.clone()).map_err(|source| RestoreError::Rebuild {
            id: loaded.meta.id,
            keyspace: k.id.clone(),
            source,
        })
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(loaded.keyspaces.len());
    if threads <= 1 {
        return loaded.keyspaces.iter().map(rebuild).collect();
    }
    let mut slots: Vec<Option<Result<Keyspace, RestoreError>>> = Vec::new();
    slots.resize_with(loaded.keyspaces.len(), || None);
    std::thread::scope(|scope| {
        let rebuild = &rebuild;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mine = loaded.keyspaces.iter().enumerate().skip(t).step_by(threads);
                    mine.map(|(i, k)| (i, rebuild(k))).collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for (i, r) in h.join().expect("a keyspace restore thread panicked") {
                slots[i] = Some(r);
            }
        }
    });
    slots.into_iter().map(|r| r.expect("every keyspace restored")).collect()
}

/// Restores `loaded` for a replica of `ours` that needs `need` partitions, after the one
/// compatibility rule; partitions outside `need` are left out.
pub fn restore_for(loaded: &Loaded, ours: &LogIdentity, need: &[u32]) -> Result<Applier, RestoreError> {
    check_compatible(ours, &loaded.meta.identity, need)
        .map_err(|why| RestoreError::Incompatible { id: loaded.meta.id, why })?;
    let full = restore(loaded)?;
    Ok(if need == loaded.meta.identity.owned.as_slice() { full } else { full.extract(need) })
}

/// The newest checkpoint that can stand for `ours` (partitions `need`) and verifies, plus why
/// newer ones were passed over (for the start-up log).
pub fn newest_usable(
    store: &CheckpointStore,
    ours: &LogIdentity,
    need: &[u32],
) -> (Option<Loaded>, Vec<String>) {
    let mut skipped = Vec::new();
    for id in store.ids() {
        let meta = match store.meta(id) {
            Ok(m) => m,
            Err(e) => {
                skipped.push(format!("checkpoint {id}: unreadable: {e}"));
                continue;
            }
        };
        if let Err(why) = check_compatible(ours, &meta.identity, need) {
            skipped.push(format!("checkpoint {id} not applied: {why}"));
            continue;
        }
        match store.load(id) {
            Ok(l) => return (Some(l), skipped),
            Err(e) => skipped.push(format!("checkpoint {id} failed verification ({e}); trying an older one")),
        }
    }
    (None, skipped)
}

/// An export of checkpoint `id` holding only `partitions` (each must be covered by it): their
/// holders, feeds and offsets. For a new shard's replica, or a partition recovered by a peer.
pub fn export_partitions(
    store: &CheckpointStore,
    id: u64,
    partitions: &[u32],
) -> Result<Vec<u8>, RestoreError> {
    let loaded = store.load(id)?;
    let covered = &loaded.meta.identity.owned;
    let missing: Vec<u32> =
        partitions.iter().copied().filter(|p| covered.binary_search(p).is_err()).collect();
    if !missing.is_empty() {
        let why = Incompatible::MissingPartitions { missing, covered: covered.clone() };
        return Err(RestoreError::Incompatible { id, why });
    }
    if partitions.is_empty() || partitions == covered.as_slice() {
        return Ok(store.export(id)?);
    }
    let part = restore(&loaded)?.extract(partitions);
    let identity = LogIdentity { owned: partitions.to_vec(), ..loaded.meta.identity.clone() };
    Ok(encode_export(&identity, &Capture::of(&part), loaded.meta.created_unix_ms))
}
