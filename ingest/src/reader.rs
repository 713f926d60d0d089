//! The one log reader: a manually assigned consumer that delivers each partition's records in
//! offset order and checks that they continue exactly where the reader's state ends.
//!
//! The replica's ingest loop, bounded replays (audits, repairs, benchmarks) and nothing else
//! read the log, all through [`LogReader`]. It never resets an offset silently: the consumer
//! runs with `auto.offset.reset=error`, and
//! - a record whose offset is above the expected one (records missing in between) or
//! - an out-of-range error (the expected offset is no longer in the log: retention deleted it,
//!   or the topic was recreated or truncated)
//!
//! becomes a [`Discontinuity`] for that partition, which is then halted (no longer fetched)
//! until the owner resumes it at an offset it has a state for ([`LogReader::resume_at`]).
//! Records below the expected offset are re-deliveries after a seek and are skipped. The topic
//! is non-compacted and non-transactional by design (README "The log"), so offsets are dense
//! and any hole is data loss.
//!
//! Not every broker answers a fetch beyond the log's end with an out-of-range error (tansu
//! answers with no records), so every [`END_CHECK_EVERY`] the reader also compares each
//! running partition's expected offset with the high watermark the fetch responses carried,
//! and confirms a partition beyond it with the broker's own watermarks before it calls it a
//! discontinuity.
//!
//! Each consumer is assigned exactly once, when it is opened: a halt pauses the partition, and
//! a resume opens a new consumer at every running partition's expected offset (at the next
//! poll, so resumes in a row cost one). librdkafka 2.12 aborts the process when a partition is
//! removed from an assignment again while its previous removal is still stopping the fetcher
//! (confluentinc/librdkafka#5573, `rd_kafka_assignment_partition_stopped: Assertion
//! rktp->rktp_started failed`): two re-assignments in a row did that.

use crate::leader_watch::{LeaderHunt, LeaderWatch};
use crate::log_spec::{close_in_background, ClientRole, LogSpec};
use prefixlog_ids::NextOffset;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::fmt;
use std::time::{Duration, Instant};

/// The reader's consumer: its context follows broker failures ([`crate::leader_watch`]).
type ReaderConsumer = BaseConsumer<LeaderWatch>;

/// How often `poll` compares the expected offsets with the fetched high watermarks (a lock per
/// partition, no broker round trip; the broker is asked only when one is beyond its log).
pub const END_CHECK_EVERY: Duration = Duration::from_millis(250);

/// What the reader found instead of the expected offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// The next record of the partition has this (higher) offset: the records in between are
    /// gone.
    Offset(i64),
    /// The expected offset is below the log's first offset (retention deleted it).
    LogStart(i64),
    /// The expected offset is beyond the log's end (the topic was recreated or truncated);
    /// the log now spans `start..end`.
    LogEnd { start: i64, end: i64 },
}

/// A partition whose log does not continue where its state ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Discontinuity {
    pub partition: u32,
    /// The next offset the state needs.
    pub expected: i64,
    pub found: Found,
}

impl Discontinuity {
    /// The first offset reading can continue at if the gap is accepted.
    pub fn resume_offset(&self) -> i64 {
        match self.found {
            Found::Offset(o) | Found::LogStart(o) | Found::LogEnd { start: o, .. } => o,
        }
    }
}

impl fmt::Display for Discontinuity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (p, e) = (self.partition, self.expected);
        match self.found {
            Found::Offset(o) => write!(f, "partition {p}: expected offset {e}, the next record is at {o}"),
            Found::LogStart(o) => write!(f, "partition {p}: expected offset {e}, the log now starts at {o}"),
            Found::LogEnd { end, .. } => {
                write!(
                    f,
                    "partition {p}: expected offset {e}, the log ends at {end} (recreated or truncated)"
                )
            }
        }
    }
}

/// One record of the log.
pub struct LogRecord<'a> {
    msg: BorrowedMessage<'a>,
}

impl LogRecord<'_> {
    pub fn partition(&self) -> u32 {
        self.msg.partition() as u32
    }

    pub fn offset(&self) -> i64 {
        self.msg.offset()
    }

    /// The record's timestamp in ms (0 when it has none).
    pub fn timestamp_ms(&self) -> u64 {
        self.msg.timestamp().to_millis().unwrap_or(0).max(0) as u64
    }

    pub fn key(&self) -> Option<&[u8]> {
        self.msg.key()
    }

    pub fn payload(&self) -> Option<&[u8]> {
        self.msg.payload()
    }

    /// The record's headers, in order (values lossily as UTF-8: prefixlog's are text).
    pub fn headers(&self) -> Vec<(String, String)> {
        use rdkafka::message::Headers;
        self.msg.headers().map_or_else(Vec::new, |h| {
            h.iter()
                .map(|h| {
                    (h.key.to_string(), String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
                })
                .collect()
        })
    }
}

/// The outcome of one [`LogReader::poll`].
pub enum Read<'a> {
    Record(LogRecord<'a>),
    /// Nothing arrived within the timeout.
    Idle,
    /// A partition's log does not continue its state; the partition is now halted.
    Discontinuity(Discontinuity),
    /// The broker could not be reached or answered with an error; reading goes on.
    BrokerError(KafkaError),
}

/// A consumer over some partitions of a log, with continuity checks.
pub struct LogReader {
    consumer: ReaderConsumer,
    /// What [`LogReader::reopen`] creates a consumer from.
    config: ClientConfig,
    topic: String,
    /// `topic` for librdkafka calls the rdkafka crate does not wrap.
    topic_c: CString,
    pos: Positions,
    /// A partition was resumed: the next poll reads from a new consumer.
    reopen: bool,
    /// When `poll` last compared the expected offsets with the fetched high watermarks.
    end_checked: Instant,
    /// Looking the leaders up after a broker failure ([`crate::leader_watch`]).
    hunt: LeaderHunt,
}

/// Where each partition stands. Kept apart from the consumer so that `poll` can update it while
/// a record borrowed from the consumer is alive.
struct Positions {
    /// Next offset expected per partition (index = partition); `None` when not read.
    expected: Vec<Option<i64>>,
    halted: Vec<bool>,
    found: VecDeque<Discontinuity>,
    /// An out-of-range error came that no partition's watermarks explained yet (a watermark
    /// query failed, or the log looked fine a moment later). librdkafka stopped fetching the
    /// partition it was about, so `poll` keeps locating, and reads from a new consumer when
    /// the watermarks still explain nothing: a partition never stalls on a lost error.
    unlocated: bool,
}

impl Positions {
    /// Assigns every partition that is read and not halted, at its expected offset: once per
    /// consumer (module doc).
    fn assign(&self, consumer: &ReaderConsumer, topic: &str) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (p, e) in self.expected.iter().enumerate() {
            if let (Some(o), false) = (e, self.halted[p]) {
                tpl.add_partition_offset(topic, p as i32, Offset::Offset(*o))?;
            }
        }
        consumer.assign(&tpl)
    }

    fn halt(&mut self, consumer: &ReaderConsumer, topic: &str, d: Discontinuity) -> Discontinuity {
        if let Err(e) = self.stop(consumer, topic, d.partition) {
            tracing::warn!(partition = d.partition, error = %e, "could not stop fetching a discontinuous partition");
        }
        d
    }

    /// Stops fetching one partition. A pause, not a new assignment (module doc; re-assigning
    /// would also drop every other partition's prefetched records: a bounded replay halts each
    /// partition at its end). Records of it already queued are skipped by `poll`.
    fn stop(&mut self, consumer: &ReaderConsumer, topic: &str, partition: u32) -> Result<(), KafkaError> {
        self.halted[partition as usize] = true;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition as i32);
        consumer.pause(&tpl)
    }

    /// Whether a running partition expects an offset beyond the high watermark of the last
    /// fetch response for it (none yet: not known, not beyond). Its records up to the expected
    /// offset were fetched, so in a log that still holds them the watermark is at least there.
    fn beyond_fetched_end(&self, consumer: &ReaderConsumer, topic: &CStr) -> bool {
        self.expected.iter().enumerate().any(|(p, e)| match (e, self.halted[p]) {
            (Some(exp), false) => fetched_high_watermark(consumer, topic, p as i32).is_some_and(|h| *exp > h),
            _ => false,
        })
    }

    /// An out-of-range error does not say which partition, and a fetched high watermark is a
    /// cached one: compare every read partition's expected offset with the watermarks the
    /// broker reports now. Halts and queues each one found; returns the first.
    /// (After an out-of-range error librdkafka already stopped fetching it:
    /// `auto.offset.reset=error`.)
    fn locate_out_of_range(
        &mut self,
        consumer: &ReaderConsumer,
        topic: &str,
    ) -> Result<Option<Discontinuity>, KafkaError> {
        // Every partition is asked even when one query fails, and every one found is halted:
        // a failed query must not leave the others unattributed.
        let (mut found, mut failed) = (Vec::new(), None);
        for (p, e) in self.expected.iter().enumerate() {
            let (Some(exp), false) = (*e, self.halted[p]) else { continue };
            let (low, high) = match consumer.fetch_watermarks(topic, p as i32, Duration::from_secs(5)) {
                Ok(w) => w,
                Err(e) => {
                    failed.get_or_insert(e);
                    continue;
                }
            };
            if exp < low {
                found.push(Discontinuity { partition: p as u32, expected: exp, found: Found::LogStart(low) });
            } else if exp > high {
                let found_at = Found::LogEnd { start: low, end: high };
                found.push(Discontinuity { partition: p as u32, expected: exp, found: found_at });
            }
        }
        for d in &found {
            if let Err(e) = self.stop(consumer, topic, d.partition) {
                tracing::warn!(partition = d.partition, error = %e, "could not stop fetching a discontinuous partition");
            }
        }
        if !found.is_empty() {
            self.unlocated = false;
        }
        self.found.extend(found);
        match (self.found.pop_front(), failed) {
            (Some(d), _) => Ok(Some(d)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }
}

/// The high watermark of `partition` that the last fetch response for it carried: librdkafka's
/// cache, no broker round trip (the rdkafka crate wraps only the round-trip query). `None`
/// before the first response.
fn fetched_high_watermark(consumer: &ReaderConsumer, topic: &CStr, partition: i32) -> Option<i64> {
    let (mut low, mut high) = (-1_i64, -1_i64);
    // SAFETY: the client handle lives as long as `consumer`, `topic` is NUL-terminated, and the
    // out-pointers are locals; the call only reads the partition's cached offsets under its lock.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}

impl LogReader {
    /// Starts reading `start` (a next offset per partition) of `spec`'s topic, to follow
    /// the log (a replica's reader).
    pub fn open(spec: &LogSpec, start: impl IntoIterator<Item = NextOffset>) -> Result<Self, KafkaError> {
        Self::open_as(spec, start, ClientRole::Reader)
    }

    /// [`Self::open`] for a stretch of history with a known end (replays, audits): smaller
    /// fetches, so less is read past the end ([`ClientRole::Replayer`]).
    pub fn open_bounded(
        spec: &LogSpec,
        start: impl IntoIterator<Item = NextOffset>,
    ) -> Result<Self, KafkaError> {
        Self::open_as(spec, start, ClientRole::Replayer)
    }

    /// [`Self::open_bounded`], also given records of open and aborted transactions
    /// ([`ClientRole::UncommittedReader`]): explaining a hole in the log.
    pub fn open_uncommitted(
        spec: &LogSpec,
        start: impl IntoIterator<Item = NextOffset>,
    ) -> Result<Self, KafkaError> {
        Self::open_as(spec, start, ClientRole::UncommittedReader)
    }

    fn open_as(
        spec: &LogSpec,
        start: impl IntoIterator<Item = NextOffset>,
        role: ClientRole,
    ) -> Result<Self, KafkaError> {
        // Kafka topic names are [a-zA-Z0-9._-]; refused here before librdkafka sees one with NUL.
        let topic_c = CString::new(spec.topic.as_str()).map_err(|_| {
            KafkaError::ClientCreation(format!("topic name {:?} holds a NUL byte", spec.topic))
        })?;
        let config = spec.client_config(role);
        let consumer: ReaderConsumer = config.create_with_context(LeaderWatch::default())?;
        let mut expected = vec![None; spec.partitions as usize];
        for NextOffset { partition, offset } in start {
            if let Some(e) = expected.get_mut(partition as usize) {
                *e = Some(offset);
            }
        }
        let halted = vec![false; expected.len()];
        let pos = Positions { expected, halted, found: VecDeque::new(), unlocated: false };
        pos.assign(&consumer, &spec.topic)?;
        let (topic, end_checked) = (spec.topic.clone(), Instant::now());
        let hunt = LeaderHunt::new();
        Ok(Self { consumer, config, topic, topic_c, pos, reopen: false, end_checked, hunt })
    }

    /// Replaces the consumer by one assigned at every running partition's expected offset;
    /// records the old one fetched and did not deliver are fetched again by the new one. The
    /// old one is closed in the background ([`close_in_background`]: a close waits until
    /// librdkafka has left, about 0.1 s, which the records behind it need not wait for).
    fn reopen(&mut self) -> Result<(), KafkaError> {
        let watch = self.consumer.context().successor();
        let consumer: ReaderConsumer = self.config.create_with_context(watch)?;
        self.pos.assign(&consumer, &self.topic)?;
        let old = std::mem::replace(&mut self.consumer, consumer);
        close_in_background(old, "log-reader");
        self.reopen = false;
        Ok(())
    }

    /// The next offset this reader expects for `partition`.
    pub fn expected(&self, partition: u32) -> Option<i64> {
        self.pos.expected.get(partition as usize).copied().flatten()
    }

    pub fn is_halted(&self, partition: u32) -> bool {
        self.pos.halted.get(partition as usize).copied().unwrap_or(false)
    }

    /// Stops fetching `partition` (its state cannot take the log's next records).
    pub fn halt(&mut self, partition: u32) -> Result<(), KafkaError> {
        match self.pos.halted.get(partition as usize) {
            Some(false) => self.pos.stop(&self.consumer, &self.topic, partition),
            _ => Ok(()),
        }
    }

    /// Reads `partition` again from `offset`, where its (replaced or accepted) state now ends,
    /// from the next poll on. That poll opens a new consumer (module doc): rare, and resumes in
    /// a row share it. A partition this reader does not read is left alone.
    pub fn resume_at(&mut self, partition: u32, offset: i64) {
        if let Some(e) = self.pos.expected.get_mut(partition as usize) {
            *e = Some(offset);
            self.pos.halted[partition as usize] = false;
            self.pos.found.retain(|d| d.partition != partition);
            self.reopen = true;
        }
    }

    /// After a broker failure, looks the leaders up when a lookup is due, and returns how long
    /// this poll may wait for a record: no longer than until the next lookup.
    fn follow_leaders(&mut self, timeout: Duration) -> Duration {
        let failures = self.consumer.context().failure_count();
        if self.hunt.quiet(failures) {
            return timeout; // every poll of a healthy cluster: no clock, no lock
        }
        let now = Instant::now();
        let last_failure = self.consumer.context().last_failure();
        if self.hunt.due(last_failure, now) {
            let pos = &self.pos;
            let reads: Vec<u32> = (0..pos.expected.len())
                .filter(|&p| pos.expected[p].is_some() && pos.halted.get(p) == Some(&false))
                .map(|p| p as u32)
                .collect();
            self.hunt.look_up(&self.consumer, &self.topic, &reads, now);
        } else if !self.hunt.hunting(last_failure, now) {
            self.hunt.settle(failures);
        }
        let interval = self.hunt.interval(now);
        if self.hunt.due(last_failure, now + interval) {
            timeout.min(interval)
        } else {
            timeout
        }
    }

    /// The next record, discontinuity or error within `timeout`.
    pub fn poll(&mut self, timeout: Duration) -> Read<'_> {
        if let Some(d) = self.pos.found.pop_front() {
            return Read::Discontinuity(d);
        }
        if self.reopen {
            if let Err(e) = self.reopen() {
                // Creating a consumer contacts no broker: only resources can fail it. Retried
                // on the next poll.
                std::thread::sleep(timeout.min(Duration::from_millis(100)));
                return Read::BrokerError(e);
            }
        }
        if self.end_checked.elapsed() >= END_CHECK_EVERY {
            self.end_checked = Instant::now();
            if self.pos.unlocated || self.pos.beyond_fetched_end(&self.consumer, &self.topic_c) {
                // Confirmed against the broker's watermarks, not the cached ones: a new leader
                // may report a lower high watermark for a moment (Kafka answers
                // OFFSET_NOT_AVAILABLE then, a broker error here, and the next check retries).
                match self.pos.locate_out_of_range(&self.consumer, &self.topic) {
                    Ok(Some(d)) => return Read::Discontinuity(d),
                    Ok(None) if self.pos.unlocated => {
                        // The log explains nothing now: fetch every partition again from where
                        // it stands (an offset still out of range errs again and is located then).
                        tracing::warn!(
                            "an out-of-range error no watermark explains: reading from a new consumer"
                        );
                        self.pos.unlocated = false;
                        self.reopen = true;
                        return Read::Idle;
                    }
                    Ok(None) => {}
                    Err(e) => return Read::BrokerError(e),
                }
            }
        }
        let timeout = self.follow_leaders(timeout);
        let deadline = Instant::now() + timeout;
        let (consumer, topic, pos) = (&self.consumer, self.topic.as_str(), &mut self.pos);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match consumer.poll(left) {
                None => return Read::Idle,
                Some(Ok(msg)) => {
                    let p = msg.partition() as usize;
                    let Some(Some(exp)) = pos.expected.get(p).copied() else { continue };
                    if pos.halted[p] || msg.offset() < exp {
                        // A halted partition's in-flight records, or a re-delivery after a
                        // seek back: not for us.
                        continue;
                    }
                    if msg.offset() > exp {
                        let found = Found::Offset(msg.offset());
                        let d = Discontinuity { partition: p as u32, expected: exp, found };
                        return Read::Discontinuity(pos.halt(consumer, topic, d));
                    }
                    pos.expected[p] = Some(exp + 1);
                    return Read::Record(LogRecord { msg });
                }
                Some(Err(KafkaError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset))) => {
                    pos.unlocated = true;
                    return match pos.locate_out_of_range(consumer, topic) {
                        Ok(Some(d)) => Read::Discontinuity(d),
                        Ok(None) => Read::BrokerError(KafkaError::MessageConsumption(
                            RDKafkaErrorCode::AutoOffsetReset,
                        )),
                        Err(e) => Read::BrokerError(e),
                    };
                }
                Some(Err(e)) => return Read::BrokerError(e),
            }
        }
    }
}
