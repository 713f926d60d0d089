//! Readiness: a replica serves queries once it has caught up with the log and can prove its
//! state, and says so through the standard gRPC health service (`grpc.health.v1`), the admin
//! port's `/readyz`, `Describe` and the `prefixlog_ready` metric.
//!
//! Ready = every owned partition's high watermark has been read from the broker at least once
//! (without it the lag is unknown, not zero: a replica whose broker has not answered yet cannot
//! prove it is caught up, so it waits however long that takes), the total lag is ≤
//! `ready_lag`, no owned partition is discontinuous (the log no longer continues its state: a
//! gap, an offset deleted by retention) or rewound (the log ends before the state: a recreated
//! topic), the ingest thread has not stopped on a bug, and the replica is not stopping. Broker
//! loss alone does not flip readiness: a replica that cannot reach Kafka keeps answering from
//! its state (its `applied` offsets in each response show how old it is).

use prefixlog_ingest::ReplicaStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The gRPC health service name of the query service.
pub const SERVICE_NAME: &str = "prefixlog.v1.PrefixIndex";

pub struct Readiness {
    status: Arc<ReplicaStatus>,
    ready_lag: i64,
    stopping: AtomicBool,
}

impl Readiness {
    pub fn new(status: Arc<ReplicaStatus>, ready_lag: i64) -> Self {
        Self { status, ready_lag, stopping: AtomicBool::new(false) }
    }

    /// From now on never ready (a clean stop: health goes NOT_SERVING before ingest stops).
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Whether a clean stop has begun ([`Self::set_stopping`]).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// (ready, human-readable reason).
    pub fn check(&self) -> (bool, String) {
        if self.is_stopping() {
            return (false, "stopping".into());
        }
        if let Some(why) = self.status.ingest_failure() {
            return (false, format!("the ingest thread stopped on a bug ({why}); restart the replica"));
        }
        let broken = self.status.discontinuous();
        if !broken.is_empty() {
            return (
                false,
                format!("the log does not continue the state of partitions {broken:?} (see the error log)"),
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
        let mut last = None;
        loop {
            let (ready, reason) = self.check();
            if last != Some(ready) {
                let s = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
                reporter.set_service_status("", s).await;
                reporter.set_service_status(SERVICE_NAME, s).await;
                tracing::info!(ready, %reason, "readiness changed");
                last = Some(ready);
            }
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
        let r = Readiness::new(status.clone(), 5);
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
        status.record_ingest_failure("the two copies of keyspace m diverged".into());
        let (ready, why) = r.check();
        assert!(!ready && why.contains("stopped on a bug") && why.contains("diverged"), "{why}");
        r.set_stopping();
        assert_eq!(r.check(), (false, "stopping".into()));
    }
}
