//! [`ReplicaStatus`]: a running replica's progress and health, written by its ingest and
//! watermark threads (`prefixlog-node`) and read without locks on the query path (offsets, lag,
//! continuity, read-your-writes waits) and at scrape time (metrics). It is the serving side's:
//! it keeps wall-clock time, wakes waiters through a tokio `watch` and times applies in a
//! Prometheus histogram, none of which the deterministic core (`prefixlog-state`) may hold.
//!
//! Besides progress it holds what makes a replica unable to prove its state: a discontinuous or
//! rewound partition, a record whose apply failed ([`ApplyFailure`]), a hole in the log
//! ([`LogHole`]: offsets the broker skips, e.g. a transactional producer's markers), a partition
//! count the broker reports other than the one the replica was started for, and how long ago
//! the broker last answered.

use parking_lot::Mutex;
use prefixlog_state::{ApplyFailure, DeadLetterCounts, HoleCause, LogHole, NextOffset};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Live progress of one partition.
#[derive(Default)]
pub struct PartitionStatus {
    pub next_offset: AtomicI64,
    pub low_watermark: AtomicI64,
    pub high_watermark: AtomicI64,
    pub log_time: AtomicU64,
    /// The log does not continue this partition's state (halted, or gap accepted and not yet
    /// cleared by a replacement).
    pub discontinuous: AtomicBool,
    /// Discontinuities found since start.
    pub discontinuities: AtomicU64,
    /// Whether the watermark thread has read this partition's watermarks yet.
    pub watermarks_known: AtomicBool,
    /// The log ended before this partition's state at the last watermark read (topic recreated
    /// or truncated). Decided against the next offset sampled *before* the broker round trip,
    /// so records applied meanwhile never make a stale watermark look like a rewind.
    pub rewound: AtomicBool,
    /// Records of this partition whose apply failed since start (each halts the partition).
    pub apply_failures: AtomicU64,
    /// The failure the partition is halted at, if any.
    failure: Mutex<Option<ApplyFailure>>,
    /// The hole the partition is halted before, if any.
    hole: Mutex<Option<LogHole>>,
    /// Holes found since start, by [`HoleCause`].
    holes: [AtomicU64; 3],
}

/// Progress of the whole replica, readable without locks.
pub struct ReplicaStatus {
    /// Indexed by partition (every partition of the log; only owned ones move).
    pub partitions: Vec<PartitionStatus>,
    owned: Vec<u32>,
    /// False while the broker cannot be reached (the replica keeps serving its state).
    pub broker_ok: AtomicBool,
    /// When this status was created: the origin of [`Self::broker_contact_ms`].
    started: Instant,
    /// Milliseconds after `started` of the last complete watermark round (every owned
    /// partition answered); 0 at start, which follows a successful probe of the log.
    broker_contact_ms: AtomicU64,
    /// The topic's partition count as the broker last reported it (0: not read yet).
    partitions_observed: AtomicU32,
    pub records_applied: AtomicU64,
    pub records_skipped: AtomicU64,
    /// Decode + apply time of one record on the ingest thread (registered by the node).
    pub apply_latency: prometheus::Histogram,
    /// Copies of refused records to the dead-letter topic (zero without one).
    pub dead_letter: std::sync::Arc<DeadLetterCounts>,
    progress: watch::Sender<u64>,
    /// Why the ingest thread stopped on a bug (a panic outside applying a record), if it did:
    /// the state no longer follows the log, so the replica is not ready.
    ingest_failure: Mutex<Option<String>>,
}

impl ReplicaStatus {
    pub fn new(partitions: u32, owned: &[u32]) -> Self {
        let buckets = prometheus::exponential_buckets(1e-6, 2.0, 22).expect("valid buckets");
        let apply_latency = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "prefixlog_apply_latency_seconds",
                "Decode + apply time of one log record on the ingest thread",
            )
            .buckets(buckets),
        )
        .expect("valid histogram");
        Self {
            partitions: (0..partitions).map(|_| PartitionStatus::default()).collect(),
            owned: owned.to_vec(),
            broker_ok: AtomicBool::new(true),
            started: Instant::now(),
            broker_contact_ms: AtomicU64::new(0),
            partitions_observed: AtomicU32::new(0),
            records_applied: AtomicU64::new(0),
            records_skipped: AtomicU64::new(0),
            apply_latency,
            dead_letter: std::sync::Arc::default(),
            progress: watch::channel(0).0,
            ingest_failure: Mutex::new(None),
        }
    }

    /// Why the ingest thread stopped on a bug, if it did ([`Self::record_ingest_failure`]).
    pub fn ingest_failure(&self) -> Option<String> {
        self.ingest_failure.lock().clone()
    }

    /// The ingest thread stopped on a bug (a panic outside applying a record): from now on the
    /// replica is not ready, and says why.
    pub fn record_ingest_failure(&self, why: String) {
        self.ingest_failure.lock().get_or_insert(why);
    }

    /// Applying a record failed: its partition is halted at it (not ready, counted).
    pub fn record_apply_failure(&self, failure: ApplyFailure) {
        let s = self.part(failure.partition);
        s.apply_failures.fetch_add(1, Ordering::Relaxed);
        *s.failure.lock() = Some(failure);
        self.notify();
    }

    /// The owned partitions halted at a record whose apply failed, ascending.
    pub fn apply_failures(&self) -> Vec<ApplyFailure> {
        self.owned.iter().filter_map(|&p| self.part(p).failure.lock().clone()).collect()
    }

    /// The partition is halted before a hole in its log (cause not known yet).
    pub fn record_hole(&self, hole: LogHole) {
        *self.part(hole.partition).hole.lock() = Some(hole);
    }

    /// A hole's cause is known: counted, and kept with the hole if the partition still stands
    /// before it.
    pub fn hole_explained(&self, hole: LogHole, cause: HoleCause) {
        let s = self.part(hole.partition);
        s.holes[cause.index()].fetch_add(1, Ordering::Relaxed);
        let mut current = s.hole.lock();
        if let Some(h) = current.as_mut().filter(|h| (h.start, h.end) == (hole.start, hole.end)) {
            h.cause = Some(cause);
        }
    }

    /// The partition no longer stands before a hole (its state was replaced, or the log stopped
    /// continuing it for another reason). The count stays.
    pub fn clear_hole(&self, p: u32) {
        *self.part(p).hole.lock() = None;
    }

    /// The hole partition `p` is halted before, if any.
    pub fn hole(&self, p: u32) -> Option<LogHole> {
        *self.part(p).hole.lock()
    }

    /// Holes found in partition `p`'s log since start, by cause.
    pub fn holes_found(&self, p: u32, cause: HoleCause) -> u64 {
        self.part(p).holes[cause.index()].load(Ordering::Relaxed)
    }

    /// The partitions of the log this replica was started for.
    pub fn partition_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    /// The topic's partition count as the broker last reported it (`None` before the first
    /// read).
    pub fn partitions_observed(&self) -> Option<u32> {
        Some(self.partitions_observed.load(Ordering::Acquire)).filter(|&n| n > 0)
    }

    /// The broker reported the topic with `n` partitions.
    pub fn observe_partitions(&self, n: u32) {
        self.partitions_observed.store(n, Ordering::Release);
    }

    /// `Some((configured, observed))` while the broker reports another partition count than
    /// the one this replica was started for.
    pub fn partition_count_changed(&self) -> Option<(u32, u32)> {
        self.partitions_observed()
            .filter(|&n| n != self.partition_count())
            .map(|n| (self.partition_count(), n))
    }

    /// The broker answered a complete watermark round just now.
    pub fn broker_answered(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.broker_contact_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// How long ago the broker last answered a complete watermark round (the start of the
    /// replica, after its start-up probe, counts as an answer).
    pub fn since_broker_contact(&self) -> Duration {
        let last = Duration::from_millis(self.broker_contact_ms.load(Ordering::Acquire));
        self.started.elapsed().saturating_sub(last)
    }

    /// The owned partitions, ascending.
    pub fn owned(&self) -> &[u32] {
        &self.owned
    }

    pub fn part(&self, p: u32) -> &PartitionStatus {
        &self.partitions[p as usize]
    }

    /// Next offset to apply, per owned partition.
    pub fn offsets(&self) -> Vec<NextOffset> {
        self.owned
            .iter()
            .map(|&p| NextOffset::new(p, self.part(p).next_offset.load(Ordering::Acquire)))
            .collect()
    }

    /// Records behind the high watermark, summed over owned partitions.
    pub fn lag(&self) -> i64 {
        self.owned.iter().map(|&p| self.partition_lag(p)).sum()
    }

    /// Records behind the last polled high watermark. Never negative: the watermark is polled
    /// while records are applied, so "next offset past the watermark" is usually just a stale
    /// poll. A real rewind is decided by the watermark thread and reported by
    /// [`Self::rewound`] (and its own gauge), not hidden in or inferred from this number.
    pub fn partition_lag(&self, p: u32) -> i64 {
        let s = self.part(p);
        (s.high_watermark.load(Ordering::Acquire) - s.next_offset.load(Ordering::Acquire)).max(0)
    }

    /// Owned partitions whose log ends before their state (topic recreated or truncated).
    pub fn rewound(&self) -> Vec<u32> {
        self.owned.iter().copied().filter(|&p| self.part(p).rewound.load(Ordering::Acquire)).collect()
    }

    /// Owned partitions the log does not continue right now.
    pub fn discontinuous(&self) -> Vec<u32> {
        self.owned.iter().copied().filter(|&p| self.part(p).discontinuous.load(Ordering::Acquire)).collect()
    }

    /// Owned partitions whose watermarks have not been read from the broker yet (their lag is
    /// unknown, not zero).
    pub fn watermarks_unknown(&self) -> Vec<u32> {
        self.owned
            .iter()
            .copied()
            .filter(|&p| !self.part(p).watermarks_known.load(Ordering::Acquire))
            .collect()
    }

    /// True when every record below each `(partition, next offset)` is applied. Partitions
    /// this replica does not own are ignored (another shard answers for them).
    pub fn reached(&self, token: &[NextOffset]) -> bool {
        token.iter().all(|&NextOffset { partition: p, offset: o }| {
            self.owned.binary_search(&p).is_err() || self.part(p).next_offset.load(Ordering::Acquire) >= o
        })
    }

    /// Waits until [`Self::reached`] or the timeout; returns whether it was reached.
    pub async fn wait_for(&self, token: &[NextOffset], timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.progress.subscribe();
        loop {
            if self.reached(token) {
                return true;
            }
            if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                return self.reached(token);
            }
        }
    }

    pub fn notify(&self) {
        self.progress.send_modify(|g| *g += 1);
    }

    /// Publishes the applier's progress for one partition.
    pub fn publish(&self, p: u32, next_offset: i64, log_time: u64) {
        let s = self.part(p);
        s.next_offset.store(next_offset, Ordering::Release);
        s.log_time.store(log_time, Ordering::Release);
        self.notify();
    }

    pub fn mark_discontinuous(&self, p: u32, on: bool) {
        let s = self.part(p);
        if on {
            s.discontinuities.fetch_add(1, Ordering::Relaxed);
        }
        s.discontinuous.store(on, Ordering::Release);
        self.notify();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_count_change_is_reported_against_the_configured_count() {
        let s = ReplicaStatus::new(4, &[0, 1, 2, 3]);
        assert_eq!((s.partitions_observed(), s.partition_count_changed()), (None, None));
        s.observe_partitions(4);
        assert_eq!((s.partitions_observed(), s.partition_count_changed()), (Some(4), None));
        s.observe_partitions(6);
        assert_eq!(s.partition_count_changed(), Some((4, 6)));
        s.observe_partitions(4);
        assert_eq!(s.partition_count_changed(), None, "back to the configured count");
    }

    #[test]
    fn apply_failures_and_holes_are_kept_per_partition_and_counted() {
        let s = ReplicaStatus::new(3, &[0, 2]);
        assert!(s.apply_failures().is_empty());
        s.record_apply_failure(ApplyFailure { partition: 2, offset: 7, message: "boom".into() });
        assert_eq!(
            s.apply_failures().iter().map(|f| (f.partition, f.offset)).collect::<Vec<_>>(),
            vec![(2, 7)]
        );
        assert_eq!(s.partitions[2].apply_failures.load(Ordering::Relaxed), 1);
        let hole = LogHole { partition: 0, start: 5, end: 6, cause: None };
        s.record_hole(hole);
        assert_eq!(s.holes_found(0, HoleCause::NoRecords), 0, "counted once explained");
        s.hole_explained(hole, HoleCause::NoRecords);
        assert_eq!(s.holes_found(0, HoleCause::NoRecords), 1);
        assert_eq!(s.hole(0).unwrap().cause, Some(HoleCause::NoRecords));
        assert!(s.hole(0).unwrap().to_string().contains("5..6"), "{}", s.hole(0).unwrap());
        // Explained after the partition moved on: counted, not brought back.
        s.clear_hole(0);
        s.hole_explained(hole, HoleCause::AbortedRecords);
        assert_eq!((s.hole(0), s.holes_found(0, HoleCause::AbortedRecords)), (None, 1));
    }
}
