//! Readiness: a replica serves queries once it has caught up with the log and can prove its
//! state, and says so through the standard gRPC health service (`grpc.health.v1`), the admin
//! port's `/readyz`, `Describe` and the `prefixlog_ready` metric.
//!
//! Ready = every owned partition's watermarks are known (or `watermark_grace` has passed), the
//! total lag is ≤ `ready_lag`, no owned partition is discontinuous (the log no longer
//! continues its state: a gap, an offset deleted by retention) or rewound (the log ends before
//! the state: a recreated topic), and the replica is not stopping. Broker loss alone does not
//! flip readiness: a replica that cannot reach Kafka keeps answering from its state (its
//! `applied` offsets in each response show how old it is).

use prefixlog_ingest::ReplicaStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// The gRPC health service name of the query service.
pub const SERVICE_NAME: &str = "prefixlog.v1.PrefixIndex";

pub struct Readiness {
    status: Arc<ReplicaStatus>,
    ready_lag: i64,
    started: Instant,
    watermark_grace: Duration,
    stopping: AtomicBool,
}

impl Readiness {
    pub fn new(status: Arc<ReplicaStatus>, ready_lag: i64, watermark_grace: Duration) -> Self {
        Self { status, ready_lag, started: Instant::now(), watermark_grace, stopping: AtomicBool::new(false) }
    }

    /// From now on never ready (a clean stop: health goes NOT_SERVING before ingest stops).
    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// (ready, human-readable reason).
    pub fn check(&self) -> (bool, String) {
        if self.stopping.load(Ordering::Acquire) {
            return (false, "stopping".into());
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
        if !self.status.watermarks_known() && self.started.elapsed() < self.watermark_grace {
            return (false, "high watermarks not known yet".into());
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
