//! The replica's checkpoint life cycle: open the store, restore at start (or say loudly why
//! not), and take checkpoints periodically while serving.

use crate::serve::Args;
use parking_lot::Mutex;
use prefixlog_engine::{Engine, EngineConfig};
use prefixlog_ingest::{probe_log, Applier, ApplyConfig, ReplicaConfig, ReplicaStatus};
use prefixlog_snapshot::{checkpoint, newest_usable, restore, CheckpointStore, LogIdentity, Retention};
use std::sync::atomic::Ordering;
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
pub fn spawn_loop(c: Checkpoints, a: &Args, applier: Arc<Mutex<Applier>>, status: Arc<ReplicaStatus>) {
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
            let mut last_applied = status.records_applied.load(Ordering::Relaxed);
            loop {
                std::thread::sleep(Duration::from_millis(100));
                let applied = status.records_applied.load(Ordering::Relaxed);
                let due_time = !every.is_zero() && last.elapsed() >= every && applied > last_applied;
                let due_records = every_records > 0 && applied - last_applied >= every_records;
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
                        match c.store.apply_retention(&retention) {
                            Ok(d) if !d.is_empty() => tracing::info!(deleted = ?d, "old checkpoints deleted"),
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "retention failed"),
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "checkpoint failed; will retry"),
                }
                last = Instant::now();
                last_applied = applied;
            }
        })
        .expect("spawn checkpoint thread");
}
