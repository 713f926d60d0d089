//! Following a newly elected leader at once: the reader's side of a broker failover.
//!
//! When the broker leading a partition goes away, a publisher finds the new leader within a few
//! milliseconds of its election (it has records waiting, so librdkafka keeps asking), and its
//! writes are acked there. A consumer with nothing waiting learns of the election only from
//! librdkafka's own scan of leaderless partitions, once a second. A gateway that wrote and
//! then asks with the acked offsets as its token waits for every replica through that second:
//! a blind routing decision (issue 48, docs/operations.md "Broker failover").
//!
//! [`LeaderWatch`] is the reader's client context: it notes when librdkafka reports a broker
//! connection failed. From then on [`LeaderHunt`] looks the topic's leaders up every
//! [`HUNT_EVERY`] (a metadata request, which updates the consumer's own leader cache, so the
//! fetcher moves to the new leader with it) until [`HUNT_AFTER_FAILURE`] has passed since the
//! last failure and the last lookup found every partition led by a broker the cluster lists.
//! Outside failures it costs nothing.

use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::time::{Duration, Instant};

/// How often the leaders are looked up while hunting: a new leader is followed within this
/// (plus one round trip), below a gateway's usual 20 ms query deadline.
pub const HUNT_EVERY: Duration = Duration::from_millis(10);

/// How long after the last broker failure the hunt goes on, even when every partition seems
/// led: a broker that dropped its connections may still be listed (Kafka fences it only after
/// its session timeout) and lose its leadership a moment later.
pub const HUNT_AFTER_FAILURE: Duration = Duration::from_millis(500);

/// The longest one lookup may hold the reader's thread (a cluster that does not answer at all
/// gives nothing to read either).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(20);

/// The reader's client context: logs what librdkafka reports, as the default context does, and
/// keeps when a broker connection last failed.
#[derive(Default)]
pub struct LeaderWatch {
    last_failure: Mutex<Option<Instant>>,
}

impl LeaderWatch {
    /// When librdkafka last reported a failed broker connection.
    pub fn last_failure(&self) -> Option<Instant> {
        *self.last_failure.lock()
    }
}

/// The failures after which a partition's leader may have moved.
fn is_broker_failure(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerNotAvailable
            | RDKafkaErrorCode::LeaderNotAvailable
            | RDKafkaErrorCode::NotLeaderForPartition
    )
}

impl ClientContext for LeaderWatch {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", error = %error, "{reason}");
        if error.rdkafka_error_code().is_some_and(is_broker_failure) {
            *self.last_failure.lock() = Some(Instant::now());
        }
    }
}

impl ConsumerContext for LeaderWatch {}

/// Whether, and when, the reader looks the topic's leaders up (module doc).
#[derive(Debug)]
pub struct LeaderHunt {
    last_lookup: Option<Instant>,
    /// The last lookup found a partition without a leader the cluster lists.
    unled: bool,
    /// Lookups made, for the log line that ends a hunt.
    lookups: u64,
}

impl Default for LeaderHunt {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaderHunt {
    pub fn new() -> Self {
        Self { last_lookup: None, unled: false, lookups: 0 }
    }

    /// Whether the leaders are being hunted at `now`, given the last broker failure.
    pub fn hunting(&self, last_failure: Option<Instant>, now: Instant) -> bool {
        self.unled || last_failure.is_some_and(|f| now.saturating_duration_since(f) < HUNT_AFTER_FAILURE)
    }

    /// Whether a lookup is due at `now`, given the last broker failure.
    pub fn due(&self, last_failure: Option<Instant>, now: Instant) -> bool {
        self.hunting(last_failure, now)
            && self.last_lookup.is_none_or(|l| now.saturating_duration_since(l) >= HUNT_EVERY)
    }

    /// Looks `topic`'s leaders up: librdkafka takes the answer into the consumer's leader
    /// cache, which is the point. A failed lookup keeps the hunt going.
    pub fn look_up<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>, topic: &str, now: Instant) {
        if self.lookups == 0 {
            tracing::info!(
                topic,
                "a broker connection failed: looking the topic's leaders up every {HUNT_EVERY:?}"
            );
        }
        self.last_lookup = Some(now);
        self.lookups += 1;
        let unled = match consumer.fetch_metadata(Some(topic), LOOKUP_TIMEOUT) {
            Ok(md) => {
                let listed: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
                md.topics()
                    .iter()
                    .flat_map(|t| t.partitions())
                    .any(|p| p.leader() < 0 || !listed.contains(&p.leader()))
            }
            Err(_) => true,
        };
        self.unled = unled;
    }

    /// Ends a hunt (logs how many lookups it took); call when [`Self::hunting`] is false.
    pub fn settle(&mut self) {
        if self.lookups > 0 {
            tracing::info!(
                lookups = self.lookups,
                "every partition has a listed leader: leader lookups stopped"
            );
            self.lookups = 0;
            self.last_lookup = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hunts_only_after_a_broker_failure_and_at_most_every_hunt_every() {
        let t = Instant::now();
        let hunt = LeaderHunt::new();
        assert!(!hunt.due(None, t), "no failure, no lookup");
        assert!(hunt.due(Some(t), t));
        assert!(!hunt.due(Some(t), t + HUNT_AFTER_FAILURE), "a failure long past");
        let mut hunt = LeaderHunt { last_lookup: Some(t), unled: false, lookups: 1 };
        assert!(!hunt.due(Some(t), t + HUNT_EVERY / 2), "too soon after the last lookup");
        assert!(hunt.due(Some(t), t + HUNT_EVERY));
        hunt.unled = true;
        assert!(hunt.due(None, t + HUNT_AFTER_FAILURE * 2), "a partition without a listed leader");
    }

    #[test]
    fn broker_failures_are_noted_other_errors_not() {
        let watch = LeaderWatch::default();
        watch.error(KafkaError::Global(RDKafkaErrorCode::SSL), "handshake failed");
        assert!(watch.last_failure().is_none());
        watch.error(KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure), "Connection refused");
        assert!(watch.last_failure().is_some());
    }
}
