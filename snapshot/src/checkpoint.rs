//! Taking checkpoints from a running replica, and restoring a replica from one.
//!
//! Capture holds the applier's mutex (so ingest pauses at a record boundary and the offsets
//! match the state exactly) and only *read* locks on the keyspaces: queries keep running
//! during a capture, because no writer is queued on a keyspace lock while ingest is parked on
//! the applier mutex. Encoding and the RocksDB write happen after both are released.

use crate::store::{CheckpointMeta, CheckpointStore, Loaded, LogIdentity, StoreError};
use parking_lot::Mutex;
use prefixlog_engine::{Engine, EngineConfig, Keyspace, KeyspaceDump};
use prefixlog_ingest::apply::PartitionState;
use prefixlog_ingest::{Applier, ApplyConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A consistent copy of a replica's state.
pub struct Capture {
    pub partitions: Vec<PartitionState>,
    pub keyspaces: Vec<KeyspaceDump>,
    /// How long ingest was paused.
    pub ingest_pause: Duration,
}

pub fn capture(applier: &Mutex<Applier>) -> Capture {
    let t = Instant::now();
    let a = applier.lock();
    let partitions = a.partitions().to_vec();
    let keyspaces = a.engine().keyspaces().iter().map(|k| k.read().dump()).collect();
    drop(a);
    Capture { partitions, keyspaces, ingest_pause: t.elapsed() }
}

/// Captures and writes a checkpoint.
pub fn checkpoint(
    applier: &Mutex<Applier>,
    store: &CheckpointStore,
    identity: &LogIdentity,
) -> Result<(CheckpointMeta, Duration), StoreError> {
    let c = capture(applier);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let meta = store.write(identity, &c.partitions, &c.keyspaces, now)?;
    Ok((meta, c.ingest_pause))
}

/// Builds an applier (and its engine) from a loaded checkpoint.
pub fn restore(loaded: &Loaded, engine_cfg: EngineConfig, apply_cfg: ApplyConfig) -> Result<Applier, String> {
    let engine = Engine::new(engine_cfg.clone());
    for d in &loaded.keyspaces {
        engine.install(
            Keyspace::rebuild(d, engine_cfg.clone()).map_err(|e| format!("keyspace {}: {e}", d.id))?,
        );
    }
    let mut applier = Applier::new(Arc::new(engine), apply_cfg);
    if loaded.partitions.len() != applier.partitions().len() {
        return Err(format!(
            "checkpoint has {} partitions, replica is configured for {}",
            loaded.partitions.len(),
            applier.partitions().len()
        ));
    }
    applier.restore_partitions(loaded.partitions.clone());
    Ok(applier)
}

/// Why a checkpoint cannot be applied to the log as it is now, if it cannot.
pub fn incompatibility(meta: &CheckpointMeta, log: &LogIdentity, high_watermarks: &[i64]) -> Option<String> {
    if meta.identity.topic != log.topic {
        return Some(format!("it is of topic {:?}, this replica reads {:?}", meta.identity.topic, log.topic));
    }
    if meta.identity.partitions != log.partitions {
        return Some(format!(
            "it has {} partitions, the topic has {}",
            meta.identity.partitions, log.partitions
        ));
    }
    if meta.identity.cluster_id != log.cluster_id {
        return Some(format!(
            "it is of Kafka cluster {:?}, the broker is cluster {:?} (a recreated cluster, or a previous run of the embedded broker)",
            meta.identity.cluster_id, log.cluster_id
        ));
    }
    for (p, (&o, &h)) in meta.offsets.iter().zip(high_watermarks).enumerate() {
        if o > h {
            return Some(format!(
                "its partition {p} is at offset {o} but the log ends at {h} (the topic was recreated or truncated)"
            ));
        }
    }
    None
}

/// The newest checkpoint that belongs to this log and verifies, plus why newer ones were
/// passed over (for the start-up log).
pub fn newest_usable(
    store: &CheckpointStore,
    log: &LogIdentity,
    high_watermarks: &[i64],
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
        if let Some(why) = incompatibility(&meta, log, high_watermarks) {
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
