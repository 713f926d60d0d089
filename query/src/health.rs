//! Readiness: a replica serves queries once it has caught up with the log, and says so through
//! the standard gRPC health service (`grpc.health.v1`) and the admin port's `/readyz`.
//!
//! Caught up = total lag (records behind the high watermarks) ≤ `ready_lag`, once the
//! watermarks are known. `ReplicaStatus` starts with every high watermark at 0 (lag 0 before
//! the first broker round trip), so a replica is not declared ready until some watermark is
//! positive or `watermark_grace` has passed (an empty log stays NOT_SERVING that long). Broker
//! loss does not flip readiness: a replica that cannot reach Kafka keeps answering from its
//! state (its `applied` offsets in each response show how old it is).

use prefixlog_ingest::ReplicaStatus;
use std::sync::atomic::Ordering;
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
}

impl Readiness {
    pub fn new(status: Arc<ReplicaStatus>, ready_lag: i64, watermark_grace: Duration) -> Self {
        Self { status, ready_lag, started: Instant::now(), watermark_grace }
    }

    /// (ready, human-readable reason).
    pub fn check(&self) -> (bool, String) {
        let known = self.status.partitions.iter().any(|p| p.high_watermark.load(Ordering::Acquire) > 0)
            || self.started.elapsed() >= self.watermark_grace;
        let lag = self.status.lag();
        if !known {
            return (false, "high watermarks not known yet".into());
        }
        (lag <= self.ready_lag, format!("lag {lag} records (ready at ≤ {})", self.ready_lag))
    }

    /// Keeps the health service's status for "" and [`SERVICE_NAME`] current, forever.
    pub async fn drive(self: Arc<Self>, reporter: HealthReporter, every: Duration) {
        let mut last = None;
        loop {
            let ready = self.check().0;
            if last != Some(ready) {
                let s = if ready { ServingStatus::Serving } else { ServingStatus::NotServing };
                reporter.set_service_status("", s).await;
                reporter.set_service_status(SERVICE_NAME, s).await;
                tracing::info!(ready, reason = %self.check().1, "readiness changed");
                last = Some(ready);
            }
            tokio::time::sleep(every).await;
        }
    }
}
