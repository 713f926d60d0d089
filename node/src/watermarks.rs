//! The watermark thread of a running replica: what the broker says about the log, polled off
//! the ingest thread (its own client), so a slow or unreachable broker never delays applying
//! records already fetched.
//!
//! Every round reads each owned partition's watermarks (lag, rewinds) and, every
//! [`PARTITIONS_CHECK_EVERY`], the topic's partition count. A count other than the one the
//! replica was started for cannot be followed safely: `partition_of` depends on the count, so
//! a worker's records would move to another partition mid-stream. It is reported
//! ([`ReplicaStatus::partition_count_changed`]: not ready, a gauge, an error log) and nothing
//! else changes. A complete round is the broker's answer that [`ReplicaStatus::since_broker_contact`]
//! measures from (staleness of answers during an outage).

use prefixlog_ingest::probe::{topic_partitions, ProbeError};
use prefixlog_query::ReplicaStatus;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the topic's partition count is read (a metadata request): a change is reported
/// within this plus one metadata round trip.
pub const PARTITIONS_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Pause between two watermark rounds.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

/// Polls until `stop`.
pub(crate) fn poll(consumer: BaseConsumer, topic: &str, status: Arc<ReplicaStatus>, stop: Arc<AtomicBool>) {
    // Due at once: the first check follows the start-up probe by a round.
    let mut partitions_checked: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        let Some(ok) = watermark_round(&consumer, topic, &status, &stop) else { return };
        if partitions_checked.is_none_or(|t| t.elapsed() >= PARTITIONS_CHECK_EVERY) {
            check_partition_count(&consumer, topic, &status);
            partitions_checked = Some(Instant::now());
        }
        status.broker_ok.store(ok, Ordering::Release);
        if ok {
            status.broker_answered();
        }
        status.notify();
        std::thread::sleep(ROUND_PAUSE);
    }
}

/// Reads every owned partition's watermarks; `Some(every one answered)`, `None` when stopped.
fn watermark_round(
    consumer: &BaseConsumer,
    topic: &str,
    status: &ReplicaStatus,
    stop: &AtomicBool,
) -> Option<bool> {
    let mut ok = true;
    for &p in status.owned() {
        // Sampled before the round trip: every offset below it was fetched from the broker
        // earlier, so a watermark below it means the log really ends before the state.
        let applied_before = status.part(p).next_offset.load(Ordering::Acquire);
        match consumer.fetch_watermarks(topic, p as i32, Duration::from_secs(1)) {
            Ok((low, high)) => {
                let s = status.part(p);
                s.rewound.store(high < applied_before, Ordering::Release);
                s.low_watermark.store(low, Ordering::Release);
                s.high_watermark.store(high, Ordering::Release);
                s.watermarks_known.store(true, Ordering::Release);
            }
            Err(_) => ok = false,
        }
        if stop.load(Ordering::Acquire) {
            return None;
        }
    }
    Some(ok)
}

/// Reads the topic's partition count and reports a change (once per new count in the log).
fn check_partition_count(consumer: &BaseConsumer, topic: &str, status: &ReplicaStatus) {
    match topic_partitions(consumer, topic) {
        Ok(n) => {
            let before = status.partitions_observed();
            status.observe_partitions(n);
            if before == Some(n) {
                return;
            }
            match status.partition_count_changed() {
                Some((configured, observed)) => tracing::error!(
                    topic,
                    configured,
                    observed,
                    "the topic now has {observed} partitions; this replica was started for {configured}. \
                     Not following it: a worker's partition depends on the count, so its records would \
                     move to another partition mid-stream. Not ready until the count is {configured} \
                     again (docs/operations.md, runbook \"partition count changed\")"
                ),
                None if before.is_some() => {
                    tracing::warn!(
                        topic,
                        partitions = n,
                        "the topic has the configured partition count again"
                    )
                }
                None => {}
            }
        }
        // A deleted topic shows up as missing partitions' watermarks and a rewind; the count is
        // read again at the next check.
        Err(ProbeError::NoTopic(_)) => tracing::debug!(topic, "topic not in the broker's metadata"),
        Err(e) => tracing::debug!(topic, error = %e, "reading the topic's partition count failed"),
    }
}
