//! Readiness: a replica serves queries once it has caught up with the log and can prove its
//! state, and says so through the standard gRPC health service (`grpc.health.v1`), the admin
//! port's `/readyz`, `Describe` and the `prefixlog_ready` metric.
//!
//! Ready = every owned partition's high watermark has been read from the broker at least once
//! (without it the lag is unknown, not zero: a replica whose broker has not answered yet cannot
//! prove it is caught up, so it waits however long that takes), the total lag is ≤
//! `ready_lag`, no owned partition is discontinuous (the log no longer continues its state: a
//! gap, a hole, an offset deleted by retention), rewound (the log ends before the state: a
//! recreated topic) or halted at a record whose apply failed, the topic has the partition count
//! the replica was started for, the ingest thread has not stopped on a bug, and the replica is
//! not stopping.
//!
//! Broker loss alone does not flip readiness: every replica loses the same broker at once, and
//! a fleet that all went not-ready would leave gateways nothing to ask. A replica that cannot
//! reach Kafka keeps answering from its state; once the broker has not answered for longer than
//! `stale_after`, answers without a consistency token say `stale = true` (as do those of a
//! replica that is not ready). The flag is kept in an atomic, refreshed by every readiness
//! check (the health driver runs one every 50 ms), so the query path pays one atomic load.

use crate::status::ReplicaStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The gRPC health service name of the query service.
pub const SERVICE_NAME: &str = "prefixlog.v1.PrefixIndex";

/// How long the broker may go unanswered before answers without a token say `stale` (the
/// default of `serve --stale-after`).
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);

pub struct Readiness {
    status: Arc<ReplicaStatus>,
    ready_lag: i64,
    stale_after: Duration,
    stopping: AtomicBool,
    /// Whether answers without a token are flagged stale; true until a check finds otherwise.
    stale: AtomicBool,
    /// The last check's verdict (false until a check says ready), for services that refuse to
    /// answer while not ready (the protocol facades): one atomic load while ready
    /// ([`Readiness::is_ready`]).
    last_ready: AtomicBool,
    /// More gRPC health service names kept at the replica's readiness (the facades' services).
    extra_services: parking_lot::Mutex<Vec<String>>,
}

impl Readiness {
    pub fn new(status: Arc<ReplicaStatus>, ready_lag: i64, stale_after: Duration) -> Self {
        Self {
            status,
            ready_lag,
            stale_after,
            stopping: AtomicBool::new(false),
            stale: AtomicBool::new(true),
            last_ready: AtomicBool::new(false),
            extra_services: parking_lot::Mutex::default(),
        }
    }

    /// Whether the replica is ready: the last readiness check's verdict (the health driver runs
    /// one every 50 ms) when it was ready, else the verdict on the state now. A replica refusing
    /// to answer thus does so on its present state, not on one up to 50 ms old: with a small
    /// `ready_lag`, a check between a write's ack and its apply would otherwise refuse the
    /// writer's next request though the write is applied. The verdict now is paid only on the
    /// not-ready path, and it is not stored: only [`Self::check`] (the driver's) moves the
    /// cached verdict and the stale flag, so request threads never race it. A stopping replica
    /// is never ready, even on a check that began before the stop and stored its verdict after.
    pub fn is_ready(&self) -> bool {
        !self.is_stopping() && (self.last_ready.load(Ordering::Acquire) || self.ready().0)
    }

    /// Reports `name` in `grpc.health.v1` with the replica's readiness too (from the driver's
    /// next round on).
    pub fn add_health_service(&self, name: &str) {
        self.extra_services.lock().push(name.to_string());
    }

    /// From now on never ready (a clean stop: health goes NOT_SERVING before ingest stops).
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
        self.last_ready.store(false, Ordering::Release);
        self.stale.store(true, Ordering::Release);
    }

    /// Whether a clean stop has begun ([`Self::set_stopping`]).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Whether an answer without a consistency token is to say `stale`: as of the last check,
    /// the replica was not ready or its broker had not answered for longer than `stale_after`.
    pub fn answers_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// (ready, human-readable reason); refreshes [`Self::answers_stale`].
    pub fn check(&self) -> (bool, String) {
        let (ready, mut reason) = self.ready();
        let silent = self.status.since_broker_contact();
        let broker_lost = silent > self.stale_after;
        self.last_ready.store(ready, Ordering::Release);
        self.stale.store(!ready || broker_lost, Ordering::Release);
        if ready && broker_lost {
            reason.push_str(&format!(
                "; the broker has not answered for {}s: answers without a consistency token say stale \
                 (after {}s)",
                silent.as_secs(),
                self.stale_after.as_secs()
            ));
        }
        (ready, reason)
    }

    fn ready(&self) -> (bool, String) {
        if self.is_stopping() {
            return (false, "stopping".into());
        }
        if let Some(why) = self.status.ingest_failure() {
            return (false, format!("the ingest thread stopped on a bug ({why}); restart the replica"));
        }
        let failed = self.status.apply_failures();
        if !failed.is_empty() {
            let each: Vec<String> = failed.iter().map(ToString::to_string).collect();
            return (
                false,
                format!(
                    "{} (a bug): the partition is halted at that record, no checkpoint is written, the \
                     other partitions are served",
                    each.join("; ")
                ),
            );
        }
        if let Some((configured, observed)) = self.status.partition_count_changed() {
            return (
                false,
                format!(
                    "the topic now has {observed} partitions, this replica was started for {configured} \
                     (a worker's partition depends on the count; not followed)"
                ),
            );
        }
        let broken = self.status.discontinuous();
        if !broken.is_empty() {
            let holes: String =
                broken.iter().filter_map(|&p| self.status.hole(p)).map(|h| format!("; {h}")).collect();
            return (
                false,
                format!(
                    "the log does not continue the state of partitions {broken:?} (see the error log){holes}"
                ),
            );
        }
        let rewound = self.status.rewound();
        if !rewound.is_empty() {
            return (
                false,
                format!("the log ends before the state of partitions {rewound:?} (topic recreated?)"),
            );
        }
        let unknown = self.status.watermarks_unknown();
        if !unknown.is_empty() {
            return (
                false,
                format!(
                    "the high watermarks of partitions {unknown:?} have not been read from the broker yet"
                ),
            );
        }
        let lag = self.status.lag();
        (lag <= self.ready_lag, format!("lag {lag} records (ready at ≤ {})", self.ready_lag))
    }

    /// Keeps the health service's status for "" and [`SERVICE_NAME`] current, forever.
    pub async fn drive(self: Arc<Self>, reporter: HealthReporter, every: Duration) {
        let (mut last, mut last_stale, mut reported) = (None, None, 0);
        loop {
            let (ready, reason) = self.check();
            let extra = self.extra_services.lock().clone();
            if last != Some(ready) || extra.len() != reported {
                let s = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
                reporter.set_service_status("", s).await;
                reporter.set_service_status(SERVICE_NAME, s).await;
                for name in &extra {
                    reporter.set_service_status(name, s).await;
                }
                if last != Some(ready) {
                    tracing::info!(ready, %reason, "readiness changed");
                }
                (last, reported) = (Some(ready), extra.len());
            }
            // Staleness while ready is the broker-silence bound (not-ready answers are stale anyway,
            // and readiness changes are logged above): going stale is a warning, coming back is not.
            let stale = self.answers_stale();
            if ready && last_stale.is_some_and(|(was_ready, was)| was_ready && was != stale) {
                if stale {
                    tracing::warn!(%reason, "the broker has been silent too long: answers without a consistency token now say stale = true");
                } else {
                    tracing::info!(%reason, "answers without a consistency token say stale = false again");
                }
            }
            last_stale = Some((ready, stale));
            tokio::time::sleep(every).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lag of a partition whose watermarks were never read is unknown, not zero: such a
    /// replica is not ready however long it waits (a 2 s grace once made it ready at lag 0
    /// while its broker had not answered yet, and a client then moved to a shard that had not
    /// read the log's tail).
    #[test]
    fn ready_only_once_every_owned_watermark_was_read_the_lag_is_small_and_ingest_runs() {
        let status = Arc::new(ReplicaStatus::new(4, &[0, 2]));
        let r = Readiness::new(status.clone(), 5, DEFAULT_STALE_AFTER);
        let (ready, why) = r.check();
        assert!(!ready && why.contains("[0, 2]"), "{why}");
        let known = |p: usize, high: i64| {
            status.partitions[p].high_watermark.store(high, Ordering::Release);
            status.partitions[p].watermarks_known.store(true, Ordering::Release);
        };
        known(0, 3);
        known(1, 1_000); // not owned: neither its watermarks nor its lag count
        let (ready, why) = r.check();
        assert!(!ready && why.contains("[2]"), "{why}");
        known(2, 3);
        assert_eq!(r.check(), (false, "lag 6 records (ready at ≤ 5)".into()));
        status.partitions[2].next_offset.store(3, Ordering::Release);
        assert!(r.check().0, "{}", r.check().1);
        status.partitions[0].discontinuous.store(true, Ordering::Release);
        assert!(!r.check().0);
        status.partitions[0].discontinuous.store(false, Ordering::Release);
        assert!(r.check().0);
        assert!(!r.answers_stale(), "ready, broker answering: fresh");
        status.observe_partitions(6);
        let (ready, why) = r.check();
        assert!(!ready && why.contains("now has 6 partitions") && why.contains("for 4"), "{why}");
        assert!(r.answers_stale(), "not ready: stale");
        status.observe_partitions(4);
        assert!(r.check().0);
        let failure = |offset| prefixlog_state::ApplyFailure { partition: 2, offset, message: "boom".into() };
        status.record_apply_failure(failure(17));
        let (ready, why) = r.check();
        assert!(!ready && why.contains("partition 2's record at offset 17") && why.contains("boom"), "{why}");
        assert!(r.answers_stale());
        status.record_ingest_failure("the two copies of keyspace m diverged".into());
        let (ready, why) = r.check();
        assert!(!ready && why.contains("stopped on a bug") && why.contains("diverged"), "{why}");
        r.set_stopping();
        assert_eq!(r.check(), (false, "stopping".into()));
    }

    /// A verdict of "not ready" is not trusted from the cache: a replica that has caught up since
    /// the last check answers at once (with `ready_lag` 0, every write makes the lag 1 until
    /// it is applied, and a check in between would otherwise refuse the writer's next request).
    /// A cached "ready" is kept until the next check.
    #[test]
    fn not_ready_is_checked_again_ready_is_cached() {
        let status = Arc::new(ReplicaStatus::new(1, &[0]));
        status.partitions[0].watermarks_known.store(true, Ordering::Release);
        status.partitions[0].high_watermark.store(1, Ordering::Release);
        let r = Readiness::new(status.clone(), 0, DEFAULT_STALE_AFTER);
        assert!(!r.check().0 && !r.is_ready(), "lag 1");
        status.partitions[0].next_offset.store(1, Ordering::Release);
        assert!(r.is_ready(), "caught up since the last check");
        status.partitions[0].high_watermark.store(2, Ordering::Release);
        assert!(!r.is_ready(), "the verdict now is not stored: the cache still says not ready");
        status.partitions[0].next_offset.store(2, Ordering::Release);
        assert!(r.check().0);
        status.partitions[0].high_watermark.store(3, Ordering::Release);
        assert!(r.is_ready(), "ready as of the last check, until the next one");
        assert!(!r.check().0 && !r.is_ready());
        r.set_stopping();
        assert!(!r.is_ready(), "stopping: never ready, cached or not");
    }

    /// A ready replica whose broker has not answered for longer than `stale_after` stays ready
    /// (the whole fleet shares the broker) but flags token-less answers stale and says why.
    #[test]
    fn a_silent_broker_makes_answers_stale_not_the_replica_unready() {
        let status = Arc::new(ReplicaStatus::new(1, &[0]));
        status.partitions[0].watermarks_known.store(true, Ordering::Release);
        let patient = Readiness::new(status.clone(), 0, Duration::from_secs(3600));
        assert!(patient.answers_stale(), "stale until a check says otherwise");
        assert!(patient.check().0 && !patient.answers_stale());
        std::thread::sleep(Duration::from_millis(5));
        let strict = Readiness::new(status.clone(), 0, Duration::ZERO);
        let (ready, why) = strict.check();
        assert!(ready && strict.answers_stale() && why.contains("has not answered"), "{why}");
        assert!(patient.check().0 && !patient.answers_stale(), "within its bound");
    }
}
