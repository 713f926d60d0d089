//! The replica's checkpoint life cycle: open the store, restore at start (or say loudly why
//! not), and take checkpoints periodically while serving.

use crate::serve::Args;
use parking_lot::Mutex;
use prefixlog_engine::{Engine, EngineConfig};
use prefixlog_ingest::{probe_log, Applier, ApplyConfig, ReplicaConfig};
use prefixlog_snapshot::{checkpoint, newest_usable, restore, CheckpointStore, LogIdentity, Retention};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Checkpoints {
    pub store: Arc<CheckpointStore>,
    pub identity: LogIdentity,
    pub high_watermarks: Vec<i64>,
    pub low_watermarks: Vec<i64>,
}

pub fn open(a: &Args, cfg: &ReplicaConfig) -> anyhow::Result<Option<Checkpoints>> {
    let Some(dir) = &a.data_dir else {
        tracing::warn!("no --data-dir: no checkpoints; every start replays the whole log");
        return Ok(None);
    };
    std::fs::create_dir_all(dir)?;
    let store = CheckpointStore::open(&dir.join("checkpoints"))
        .map_err(|e| anyhow::anyhow!("opening checkpoint store in {}: {e}", dir.display()))?;
    let probe = probe_log(cfg)?;
    let identity =
        LogIdentity { cluster_id: probe.cluster_id, topic: cfg.topic.clone(), partitions: probe.partitions };
    Ok(Some(Checkpoints {
        store: Arc::new(store),
        identity,
        high_watermarks: probe.high_watermarks,
        low_watermarks: probe.low_watermarks,
    }))
}

/// The newest usable checkpoint restored, or a fresh applier with the reasons logged.
pub fn restore_or_fresh(
    c: &Checkpoints,
    engine_cfg: EngineConfig,
    apply_cfg: ApplyConfig,
) -> anyhow::Result<Applier> {
    let t = Instant::now();
    let (loaded, skipped) = newest_usable(&c.store, &c.identity, &c.high_watermarks);
    for why in &skipped {
        tracing::warn!("{why}");
    }
    if let Some(l) = loaded {
        let applier = restore(&l, engine_cfg, apply_cfg)
            .map_err(|e| anyhow::anyhow!("restoring checkpoint {}: {e}", l.meta.id))?;
        let hb = l.meta.holder_blocks();
        let secs = t.elapsed().as_secs_f64();
        tracing::info!(
            checkpoint = l.meta.id,
            holder_blocks = hb,
            secs,
            holder_blocks_per_s = (hb as f64 / secs.max(1e-9)) as u64,
            "restored; replaying the tail from the checkpoint's offsets"
        );
        return Ok(applier);
    }
    if c.low_watermarks.iter().any(|&l| l > 0) {
        tracing::warn!(
            low_watermarks = ?c.low_watermarks,
            "no usable checkpoint and the topic no longer starts at offset 0 (retention dropped records): \
             replaying what is left will NOT reproduce the full state"
        );
    } else {
        tracing::info!("no usable checkpoint: replaying the log from the beginning");
    }
    Ok(Applier::new(Arc::new(Engine::new(engine_cfg)), apply_cfg))
}

/// Takes checkpoints every `checkpoint_interval` or `checkpoint_records` applied records.
///
/// `covered` is what the state already on disk covers (the restored checkpoint's offsets, or the
/// start of the log). Progress is judged by offsets, not by an applied-records counter sampled
/// when this thread starts: ingest may already have applied the tail by then, and a counter
/// would then never see it (the replica would sit idle with an uncheckpointed tail forever).
/// Offsets also count skipped records, which a checkpoint must cover too.
pub fn spawn_loop(c: Checkpoints, a: &Args, applier: Arc<Mutex<Applier>>, covered: Vec<i64>) {
    let (every, every_records) = (a.checkpoint_interval, a.checkpoint_records);
    let retention = Retention {
        keep_last: a.keep_checkpoints.max(1),
        thin_interval_ms: 3_600_000,
        window_ms: a.keep_hourly_for * 3_600_000,
    };
    std::thread::Builder::new()
        .name("prefixlog-checkpoints".into())
        .spawn(move || {
            let mut last = Instant::now();
            let mut covered = covered;
            // After a failed checkpoint, wait before the next try: every try captures the whole
            // state under the applier lock, and a lasting error (full disk) must not turn that
            // into a pause of ingest every 100 ms.
            let backoff =
                if every.is_zero() { Duration::from_secs(30) } else { every.min(Duration::from_secs(30)) };
            let mut retry_at: Option<Instant> = None;
            loop {
                std::thread::sleep(Duration::from_millis(100));
                if retry_at.is_some_and(|t| Instant::now() < t) {
                    continue;
                }
                let now = applier.lock().offsets();
                let behind = records_between(&covered, &now);
                let due_time = !every.is_zero() && last.elapsed() >= every && behind > 0;
                let due_records = every_records > 0 && behind >= every_records;
                if !(due_time || due_records) {
                    continue;
                }
                let t = Instant::now();
                match checkpoint(&applier, &c.store, &c.identity) {
                    Ok((meta, pause)) => {
                        tracing::info!(
                            checkpoint = meta.id,
                            holder_blocks = meta.holder_blocks(),
                            log_records = meta.offsets.iter().sum::<i64>(),
                            ingest_pause_ms = pause.as_secs_f64() * 1e3,
                            total_ms = t.elapsed().as_secs_f64() * 1e3,
                            "checkpoint written"
                        );
                        covered = meta.offsets.clone();
                        retry_at = None;
                        match c.store.apply_retention(&retention) {
                            Ok(d) if !d.is_empty() => tracing::info!(deleted = ?d, "old checkpoints deleted"),
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "retention failed"),
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, retry_in = ?backoff, "checkpoint failed; will retry");
                        retry_at = Some(Instant::now() + backoff);
                    }
                }
                last = Instant::now();
            }
        })
        .expect("spawn checkpoint thread");
}

/// Log records applied or skipped between two offset vectors.
fn records_between(from: &[i64], to: &[i64]) -> u64 {
    from.iter().zip(to).map(|(f, t)| (t - f).max(0) as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::records_between;

    #[test]
    fn progress_is_counted_per_partition_and_never_negative() {
        assert_eq!(records_between(&[0, 5, 9], &[0, 5, 9]), 0);
        assert_eq!(records_between(&[0, 5, 9], &[1, 5, 12]), 4);
        // A partition behind what is covered (cannot happen, but must not wrap around).
        assert_eq!(records_between(&[3], &[1]), 0);
    }
}
