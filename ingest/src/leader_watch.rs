//! Following a newly elected leader at once: the reader's side of a broker failover.
//!
//! When the broker leading a partition goes away, a publisher finds the new leader within a few
//! milliseconds of its election (it has records waiting, so librdkafka keeps asking), and its
//! writes are acked there. A consumer with nothing waiting may learn of the election only from
//! librdkafka's own scan of leaderless partitions, once a second. A gateway that wrote and then
//! asks with the acked offsets as its token waits for every replica meanwhile: a blind routing
//! decision (issue 48, docs/operations.md "When a partition's leader moves").
//!
//! [`LeaderWatch`] is the reader's client context: it notes each broker connection librdkafka
//! reports failed (a failed reconnect: a dropped connection alone is not reported), and which
//! broker it was. From then on [`LeaderHunt`] looks the topic's leaders up (a metadata request,
//! which updates the consumer's own leader cache, so the fetcher moves to the new leader with
//! it) every [`HUNT_EVERY`], and every [`HUNT_EVERY_LATER`] once a hunt has lasted
//! [`HUNT_FAST_FOR`], for as long as a partition the reader reads has no leader, a leader the
//! cluster does not list, or a leader that failed within [`FAILED_BROKER_FOR`] (Kafka keeps a
//! crashed broker listed, and leading, until it fences it), and for [`HUNT_AFTER_FAILURE`]
//! after any failure. Outside failures it sends nothing.

use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the leaders are looked up at first: a new leader is followed within this (plus a
/// round trip), below a gateway's usual 20 ms query deadline.
pub const HUNT_EVERY: Duration = Duration::from_millis(10);

/// How long a hunt looks up every [`HUNT_EVERY`]; after that, every [`HUNT_EVERY_LATER`]. Long
/// enough for an election after a crash: the controller fences a crashed broker and moves its
/// partitions after its session timeout (9 s by default in KRaft).
pub const HUNT_FAST_FOR: Duration = Duration::from_secs(30);

/// How often a hunt that has lasted [`HUNT_FAST_FOR`] looks up.
pub const HUNT_EVERY_LATER: Duration = Duration::from_millis(100);

/// How long after any broker failure the hunt goes on, even when every partition read seems
/// well led.
pub const HUNT_AFTER_FAILURE: Duration = Duration::from_millis(500);

/// How long a broker that failed counts as failed while it still leads a partition read:
/// longer than librdkafka suppresses repeating the same connection error (30 s), so a dead
/// broker that keeps failing stays counted between its reports.
pub const FAILED_BROKER_FOR: Duration = Duration::from_secs(45);

/// The longest one lookup may hold the reader's thread (a cluster that does not answer at all
/// gives nothing to read either).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_millis(20);

/// The broker failures a reader has seen: when the last one was, and per broker id the last
/// time it failed. Shared by the contexts of a reader's successive consumers.
#[derive(Debug, Default)]
struct Failures {
    last: Option<Instant>,
    brokers: Vec<(i32, Instant)>,
}

/// The reader's client context: logs what librdkafka reports, at warn (as the probe's context
/// does; the default context logged at error), and keeps the broker failures.
#[derive(Clone, Default)]
pub struct LeaderWatch {
    failures: Arc<Mutex<Failures>>,
    /// Failures noted so far: what the reader checks on every poll, without a lock or a clock,
    /// to know that nothing happened since its hunt last ended.
    count: Arc<AtomicU64>,
}

impl LeaderWatch {
    /// A context for a reader's next consumer that remembers this one's failures.
    pub fn successor(&self) -> Self {
        self.clone()
    }

    /// Broker failures noted so far.
    pub fn failure_count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// When librdkafka last reported a failed broker connection.
    pub fn last_failure(&self) -> Option<Instant> {
        self.failures.lock().last
    }

    /// Whether broker `id` failed within [`FAILED_BROKER_FOR`] before `now`.
    pub fn failed_recently(&self, id: i32, now: Instant) -> bool {
        self.failures
            .lock()
            .brokers
            .iter()
            .any(|&(b, at)| b == id && now.saturating_duration_since(at) < FAILED_BROKER_FOR)
    }

    fn note_failure(&self, reason: &str) {
        let now = Instant::now();
        let mut f = self.failures.lock();
        f.last = Some(now);
        if let Some(id) = broker_id(reason) {
            f.brokers.retain(|&(b, _)| b != id);
            f.brokers.push((id, now));
        }
        self.count.fetch_add(1, Ordering::Release);
    }
}

/// The broker id librdkafka names at the start of a connection error:
/// `127.0.0.1:32817/1: Connect to ... failed` (a bootstrap address, `host:port/bootstrap`, has
/// none).
fn broker_id(reason: &str) -> Option<i32> {
    let (name, _) = reason.split_once(": ")?;
    name.rsplit_once('/')?.1.parse().ok()
}

impl ClientContext for LeaderWatch {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", error = %error, "{reason}");
        let code = error.rdkafka_error_code();
        if matches!(code, Some(RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown)) {
            self.note_failure(reason);
        }
    }
}

impl ConsumerContext for LeaderWatch {}

/// What one lookup says of the partitions a reader reads.
#[derive(Debug, PartialEq, Eq)]
enum Unled {
    /// A partition read has no leader, one the cluster does not list, or one that failed
    /// recently.
    Some,
    /// The answer lacks a partition read.
    Unknown,
    /// Every partition read is well led.
    None,
}

/// Sorts one topic's `(partition, leader)` pairs from a metadata answer: `listed` are the
/// brokers it lists, `reads` the partitions read, `failed` the brokers that failed recently.
fn unled(leaders: &[(u32, i32)], listed: &[i32], reads: &[u32], failed: impl Fn(i32) -> bool) -> Unled {
    let mut missing = false;
    for p in reads {
        match leaders.iter().find(|(q, _)| q == p) {
            None => missing = true,
            Some(&(_, leader)) if leader < 0 || !listed.contains(&leader) || failed(leader) => {
                return Unled::Some
            }
            Some(_) => {}
        }
    }
    if missing {
        Unled::Unknown
    } else {
        Unled::None
    }
}

/// Whether, and when, the reader looks the topic's leaders up (module doc).
#[derive(Debug, Default)]
pub struct LeaderHunt {
    /// When this hunt began (`None`: no hunt).
    began: Option<Instant>,
    last_lookup: Option<Instant>,
    /// The last lookup found a partition read that is not well led.
    unled: bool,
    /// Lookups made in this hunt, for the log line that ends it.
    lookups: u64,
    /// [`LeaderWatch::failure_count`] when the last hunt ended (or none began): while it is
    /// unchanged and no hunt is on, [`Self::quiet`] holds.
    settled_at: u64,
}

impl LeaderHunt {
    pub fn new() -> Self {
        Self::default()
    }

    /// No hunt is on and no failure came since the last one ended: nothing to do (the check
    /// every poll makes, one atomic load).
    pub fn quiet(&self, failure_count: u64) -> bool {
        self.began.is_none() && !self.unled && failure_count == self.settled_at
    }

    /// Whether the leaders are being hunted at `now`, given the last broker failure.
    pub fn hunting(&self, last_failure: Option<Instant>, now: Instant) -> bool {
        self.unled || last_failure.is_some_and(|f| now.saturating_duration_since(f) < HUNT_AFTER_FAILURE)
    }

    /// The time between lookups at `now`: [`HUNT_EVERY`], then [`HUNT_EVERY_LATER`].
    pub fn interval(&self, now: Instant) -> Duration {
        match self.began {
            Some(b) if now.saturating_duration_since(b) >= HUNT_FAST_FOR => HUNT_EVERY_LATER,
            _ => HUNT_EVERY,
        }
    }

    /// Whether a lookup is due at `now`, given the last broker failure.
    pub fn due(&self, last_failure: Option<Instant>, now: Instant) -> bool {
        self.hunting(last_failure, now)
            && self.last_lookup.is_none_or(|l| now.saturating_duration_since(l) >= self.interval(now))
    }

    /// Looks `topic`'s leaders up: librdkafka takes the answer into the consumer's leader
    /// cache, which is the point. `reads`: the partitions the reader reads. A lookup that
    /// fails or answers without a partition read keeps the hunt going while the last failure is
    /// recent (within [`FAILED_BROKER_FOR`]): a healthy cluster slower than [`LOOKUP_TIMEOUT`]
    /// does not keep it up.
    pub fn look_up(
        &mut self,
        consumer: &BaseConsumer<LeaderWatch>,
        topic: &str,
        reads: &[u32],
        now: Instant,
    ) {
        let watch = consumer.context();
        let last_failure = watch.last_failure();
        self.begin(topic, last_failure, now);
        self.last_lookup = Some(now);
        self.lookups += 1;
        let recent = last_failure.is_some_and(|f| now.saturating_duration_since(f) < FAILED_BROKER_FOR);
        self.unled = match consumer.fetch_metadata(Some(topic), LOOKUP_TIMEOUT) {
            Ok(md) => md.topics().iter().any(|t| {
                let listed: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
                let leaders: Vec<(u32, i32)> =
                    t.partitions().iter().map(|p| (p.id() as u32, p.leader())).collect();
                match unled(&leaders, &listed, reads, |b| watch.failed_recently(b, now)) {
                    Unled::Some => true,
                    Unled::Unknown => recent,
                    Unled::None => t.error().is_some() && recent,
                }
            }),
            Err(_) => recent,
        };
    }

    /// Starts a hunt, or starts its fast lookups again when a failure came after they ended.
    fn begin(&mut self, topic: &str, last_failure: Option<Instant>, now: Instant) {
        match self.began {
            None => {
                tracing::info!(
                    topic,
                    "a broker connection failed: looking the topic's leaders up every {HUNT_EVERY:?}"
                );
                self.began = Some(now);
            }
            Some(b) => {
                if last_failure.is_some_and(|f| f > b + HUNT_FAST_FOR) {
                    self.began = last_failure;
                } else if self.interval(now) != self.interval(self.last_lookup.unwrap_or(now)) {
                    tracing::warn!(
                        topic,
                        "partitions read still without a reachable leader after {HUNT_FAST_FOR:?}: looking up every {HUNT_EVERY_LATER:?}"
                    );
                }
            }
        }
    }

    /// Ends a hunt (logs how many lookups it took); call when [`Self::hunting`] is false.
    /// `failure_count`: [`LeaderWatch::failure_count`], read before `hunting` was asked.
    pub fn settle(&mut self, failure_count: u64) {
        self.settled_at = failure_count;
        if let Some(began) = self.began.take() {
            tracing::info!(
                lookups = self.lookups,
                secs = began.elapsed().as_secs_f64(),
                "every partition read has a reachable leader: leader lookups stopped"
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
    fn hunts_only_after_a_broker_failure_and_at_most_every_interval() {
        let t = Instant::now();
        let hunt = LeaderHunt::new();
        assert!(hunt.quiet(0));
        assert!(!hunt.quiet(1), "a failure came");
        assert!(!hunt.due(None, t), "no failure, no lookup");
        assert!(hunt.due(Some(t), t));
        assert!(!hunt.due(Some(t), t + HUNT_AFTER_FAILURE), "a failure long past");
        let mut hunt =
            LeaderHunt { began: Some(t), last_lookup: Some(t), unled: false, lookups: 1, settled_at: 0 };
        assert!(!hunt.due(Some(t), t + HUNT_EVERY / 2), "too soon after the last lookup");
        assert!(hunt.due(Some(t), t + HUNT_EVERY));
        hunt.unled = true;
        let late = t + HUNT_FAST_FOR * 3;
        hunt.last_lookup = Some(late);
        assert!(!hunt.due(None, late + HUNT_EVERY), "a long hunt looks up less often");
        assert!(hunt.due(None, late + HUNT_EVERY_LATER), "a partition without a reachable leader");
        hunt.unled = false;
        hunt.settle(3);
        assert!(hunt.quiet(3), "settled after the third failure");
    }

    #[test]
    fn broker_failures_are_noted_with_the_broker_other_errors_not() {
        let watch = LeaderWatch::default();
        watch.error(KafkaError::Global(RDKafkaErrorCode::SSL), "127.0.0.1:1/1: handshake failed");
        assert!(watch.last_failure().is_none());
        assert_eq!(watch.failure_count(), 0);
        watch.error(
            KafkaError::Global(RDKafkaErrorCode::BrokerTransportFailure),
            "127.0.0.1:32817/3: Connect to ipv4#127.0.0.1:32817 failed: Connection refused",
        );
        let now = Instant::now();
        assert!(watch.last_failure().is_some());
        assert_eq!(watch.successor().failure_count(), 1, "counted, and shared with a successor");
        assert!(watch.failed_recently(3, now));
        assert!(!watch.failed_recently(1, now));
        assert!(!watch.failed_recently(3, now + FAILED_BROKER_FOR));
        assert!(watch.successor().failed_recently(3, now), "a reopened consumer remembers");
    }

    #[test]
    fn a_partition_read_is_unled_without_a_listed_healthy_leader() {
        let reads = [0, 1];
        let healthy = |_: i32| false;
        let leaders = [(0, 1), (1, 2), (2, -1)];
        assert_eq!(unled(&leaders, &[1, 2], &reads, healthy), Unled::None, "partition 2 is not read");
        assert_eq!(unled(&leaders, &[1], &reads, healthy), Unled::Some, "broker 2 unlisted");
        assert_eq!(unled(&[(0, 1), (1, -1)], &[1, 2], &reads, healthy), Unled::Some, "no leader");
        assert_eq!(unled(&leaders, &[1, 2], &reads, |b| b == 1), Unled::Some, "broker 1 failed");
        assert_eq!(unled(&[(0, 1)], &[1, 2], &reads, healthy), Unled::Unknown, "partition 1 missing");
    }

    #[test]
    fn a_failure_after_the_fast_lookups_starts_them_again() {
        let t = Instant::now();
        let mut hunt = LeaderHunt {
            began: Some(t),
            last_lookup: Some(t + HUNT_FAST_FOR),
            unled: true,
            lookups: 9,
            settled_at: 0,
        };
        let later = t + HUNT_FAST_FOR * 2;
        assert_eq!(hunt.interval(later), HUNT_EVERY_LATER);
        hunt.begin("t", Some(later), later);
        assert_eq!(hunt.interval(later), HUNT_EVERY, "a new failure: fast again");
        hunt.begin("t", Some(t), later + HUNT_FAST_FOR);
        assert_eq!(hunt.interval(later + HUNT_FAST_FOR), HUNT_EVERY_LATER, "an old failure does not");
    }

    #[test]
    fn the_broker_id_is_read_from_librdkafka_s_reason() {
        assert_eq!(broker_id("127.0.0.1:32817/1: Connect to ipv4#127.0.0.1:32817 failed"), Some(1));
        assert_eq!(broker_id("b-2.kafka:9096/2: Disconnected"), Some(2));
        assert_eq!(broker_id("127.0.0.1:45159/bootstrap: Connect failed"), None);
        assert_eq!(broker_id("1/1 brokers are down"), None);
    }
}
