//! The checkpoint loop: a checkpoint every `interval` or `records`, retention after each, and
//! its metrics (duration, ingest pause, bytes, age of the newest, failures by reason, whether
//! the store is writable, stores moved aside as damaged, withheld).
//!
//! Once a record has failed to apply, the state may hold part of it: every checkpoint due from
//! then on (periodic and final) is withheld — nothing is written, the reason is logged and
//! `prefixlog_checkpoints_withheld_total` counts it — so a restart resumes from the last sound
//! checkpoint and reads that record again.
//!
//! A failed checkpoint never stops ingest or queries: it is counted (`reason="no_space"` for a
//! full disk, else `"error"`) and retried after a back-off; the store reopens itself before the
//! retry (RocksDB refuses every write after a failed one until then), so checkpoints resume
//! once space returns.
//!
//! Progress is judged by offsets, not by an applied-records counter sampled when the loop
//! starts: ingest may already have applied the tail by then, and a counter would then never
//! see it (the replica would sit idle with an uncheckpointed tail forever). Offsets also count
//! skipped records, which a checkpoint must cover too. One thread writes checkpoints, and a
//! clean stop joins it before the final checkpoint, so two writes never race for an id.

use parking_lot::Mutex;
use prefixlog_snapshot::{checkpoint, CheckpointMeta, CheckpointStore, StoreError};
use prefixlog_state::{Applier, LogIdentity};
use prometheus::core::{Collector, Desc};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::options::CheckpointPolicy;

/// `prefixlog_checkpoint_*`.
pub struct CheckpointMetrics {
    duration: Histogram,
    pause: Histogram,
    bytes: IntGauge,
    written: IntCounter,
    /// Failed checkpoints, by reason (`no_space`, `error`).
    failures: IntCounterVec,
    /// 1 while checkpoints can be written (0: read-only or unavailable, e.g. a full disk).
    store_writable: IntGauge,
    /// Damaged store directories moved aside (kept for forensics) and replaced by a fresh store.
    store_quarantined: IntCounter,
    withheld: IntCounter,
    /// Wall time of the newest checkpoint, unix ms (0: none yet).
    newest_unix_ms: Arc<AtomicU64>,
}

impl CheckpointMetrics {
    pub fn new(r: &Registry) -> prometheus::Result<Self> {
        let buckets = prometheus::exponential_buckets(0.001, 2.0, 18)?;
        let h =
            |n: &str, help: &str| Histogram::with_opts(HistogramOpts::new(n, help).buckets(buckets.clone()));
        let m = Self {
            duration: h(
                "prefixlog_checkpoint_duration_seconds",
                "Capture + encode + synced write of a checkpoint",
            )?,
            pause: h(
                "prefixlog_checkpoint_ingest_pause_seconds",
                "How long ingest paused for a checkpoint's capture",
            )?,
            bytes: IntGauge::new("prefixlog_checkpoint_bytes", "Encoded size of the newest checkpoint")?,
            written: IntCounter::new("prefixlog_checkpoints_written_total", "Checkpoints written")?,
            failures: IntCounterVec::new(
                Opts::new(
                    "prefixlog_checkpoint_failures_total",
                    "Checkpoints that failed and will be retried, by reason (no_space: the data disk is full)",
                ),
                &["reason"],
            )?,
            store_writable: IntGauge::new(
                "prefixlog_checkpoint_store_writable",
                "1 while the checkpoint store can be written (0: read-only or unavailable, e.g. a full disk)",
            )?,
            store_quarantined: IntCounter::new(
                "prefixlog_checkpoint_store_quarantined_total",
                "Damaged checkpoint stores moved aside (kept for forensics) and replaced by a fresh store",
            )?,
            withheld: IntCounter::new(
                "prefixlog_checkpoints_withheld_total",
                "Checkpoints not written because a record failed to apply (the state may hold part of it)",
            )?,
            newest_unix_ms: Arc::new(AtomicU64::new(0)),
        };
        for reason in ["no_space", "error"] {
            m.failures.with_label_values(&[reason]);
        }
        r.register(Box::new(m.duration.clone()))?;
        r.register(Box::new(m.pause.clone()))?;
        r.register(Box::new(m.bytes.clone()))?;
        r.register(Box::new(m.written.clone()))?;
        r.register(Box::new(m.failures.clone()))?;
        r.register(Box::new(m.withheld.clone()))?;
        r.register(Box::new(m.store_writable.clone()))?;
        r.register(Box::new(m.store_quarantined.clone()))?;
        r.register(Box::new(AgeCollector::new(m.newest_unix_ms.clone())))?;
        Ok(m)
    }

    /// Publishes the store's health (writable, stores moved aside so far, at start included).
    pub fn store_health(&self, store: &CheckpointStore) {
        let h = store.health();
        self.store_writable.set(i64::from(h.writable));
        let seen = self.store_quarantined.get();
        if h.quarantined > seen {
            self.store_quarantined.inc_by(h.quarantined - seen);
        }
    }

    /// Starts the age clock at a checkpoint found on disk.
    pub fn seen(&self, meta: &CheckpointMeta) {
        self.newest_unix_ms.fetch_max(meta.created_unix_ms, Ordering::Relaxed);
    }
}

/// `prefixlog_checkpoint_age_seconds`, computed at scrape time.
struct AgeCollector {
    newest_unix_ms: Arc<AtomicU64>,
    desc: Vec<Desc>,
}

impl AgeCollector {
    fn new(newest_unix_ms: Arc<AtomicU64>) -> Self {
        let desc = Self::gauge(0.0).desc().into_iter().cloned().collect();
        Self { newest_unix_ms, desc }
    }

    fn gauge(v: f64) -> prometheus::Gauge {
        let g = prometheus::Gauge::new(
            "prefixlog_checkpoint_age_seconds",
            "Seconds since the newest checkpoint was written (absent before the first)",
        )
        .expect("valid metric");
        g.set(v);
        g
    }
}

impl Collector for AgeCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.desc.iter().collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let newest = self.newest_unix_ms.load(Ordering::Relaxed);
        if newest == 0 {
            return Vec::new();
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Self::gauge(now.saturating_sub(newest) as f64 / 1e3).collect()
    }
}

/// Takes one checkpoint and applies retention; records its metrics.
pub fn take(
    applier: &Mutex<Applier>,
    store: &CheckpointStore,
    identity: &LogIdentity,
    policy: &CheckpointPolicy,
    m: &CheckpointMetrics,
) -> Result<CheckpointMeta, StoreError> {
    let t = Instant::now();
    let r = checkpoint(applier, store, identity);
    m.store_health(store);
    let (meta, pause) = match r {
        Ok(x) => x,
        Err(StoreError::Withheld(f)) => {
            m.withheld.inc();
            tracing::error!(
                partition = f.partition,
                offset = f.offset,
                error = %f.message,
                "checkpoint withheld: a record failed to apply and the state may hold part of it; a \
                 restart resumes from the last checkpoint written"
            );
            return Err(StoreError::Withheld(f));
        }
        Err(e) => {
            let reason = if e.is_no_space() { "no_space" } else { "error" };
            m.failures.with_label_values(&[reason]).inc();
            return Err(e);
        }
    };
    m.duration.observe(t.elapsed().as_secs_f64());
    m.pause.observe(pause.as_secs_f64());
    m.bytes.set((meta.partitions_len + meta.keyspaces.iter().map(|k| k.bytes).sum::<u64>()) as i64);
    m.written.inc();
    m.seen(&meta);
    tracing::info!(
        checkpoint = meta.id,
        holder_blocks = meta.holder_blocks(),
        log_records = meta.covered().map(|(_, o, _)| o).sum::<i64>(),
        ingest_pause_ms = pause.as_secs_f64() * 1e3,
        total_ms = t.elapsed().as_secs_f64() * 1e3,
        "checkpoint written"
    );
    match store.apply_retention(&policy.retention) {
        Ok(d) if !d.is_empty() => tracing::info!(deleted = ?d, "old checkpoints deleted"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "checkpoint retention failed"),
    }
    m.store_health(store);
    Ok(meta)
}

/// Records applied or skipped between two offset vectors.
pub fn records_between(from: &[i64], to: &[i64]) -> u64 {
    from.iter().zip(to).map(|(f, t)| (t - f).max(0) as u64).sum()
}

/// The running loop.
pub struct Checkpointer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<i64>>>,
}

pub struct LoopContext {
    pub applier: Arc<Mutex<Applier>>,
    pub store: Arc<CheckpointStore>,
    pub identity: LogIdentity,
    pub policy: CheckpointPolicy,
    pub metrics: Arc<CheckpointMetrics>,
}

impl Checkpointer {
    /// `covered`: next offsets of the state already on disk.
    pub fn spawn(ctx: LoopContext, covered: Vec<i64>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("prefixlog-checkpoints".into())
            .spawn(move || run(ctx, covered, &s))
            .expect("spawn checkpoint thread");
        Self { stop, thread: Some(thread) }
    }

    /// Stops the loop; returns the offsets the newest checkpoint covers.
    pub fn stop(mut self) -> Vec<i64> {
        self.stop.store(true, Ordering::Release);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn run(ctx: LoopContext, mut covered: Vec<i64>, stop: &AtomicBool) -> Vec<i64> {
    let (every, every_records) = (ctx.policy.interval, ctx.policy.records);
    // After a failure, wait before the next try: every try captures the whole state under the
    // applier lock, and a lasting error (a full disk) must not pause ingest every 100 ms.
    let backoff = if every.is_zero() { Duration::from_secs(30) } else { every.min(Duration::from_secs(30)) };
    let mut last = Instant::now();
    let mut retry_at: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        if retry_at.is_some_and(|t| Instant::now() < t) {
            continue;
        }
        let now = ctx.applier.lock().offsets();
        let behind = records_between(&covered, &now);
        let due_time = !every.is_zero() && last.elapsed() >= every && behind > 0;
        let due_records = every_records > 0 && behind >= every_records;
        if !(due_time || due_records) {
            continue;
        }
        match take(&ctx.applier, &ctx.store, &ctx.identity, &ctx.policy, &ctx.metrics) {
            Ok(meta) => {
                covered = meta.offsets;
                retry_at = None;
            }
            // Logged and counted by `take`; due again after the next interval.
            Err(StoreError::Withheld(_)) => {}
            Err(e) => {
                let what = if e.is_no_space() { "the data disk is full; " } else { "" };
                tracing::error!(
                    error = %e, retry_in = ?backoff,
                    "checkpoint failed: {what}ingest and queries go on; will retry"
                );
                retry_at = Some(Instant::now() + backoff);
            }
        }
        last = Instant::now();
    }
    covered
}

#[cfg(test)]
mod tests {
    use super::records_between;

    #[test]
    fn progress_is_counted_per_partition_and_never_negative() {
        assert_eq!(records_between(&[0, 5, 9], &[0, 5, 9]), 0);
        assert_eq!(records_between(&[0, 5, 9], &[1, 5, 12]), 4);
        assert_eq!(records_between(&[3], &[1]), 0);
    }
}
