//! The log as the layers above the Kafka edge see it: its range, and applying it to an
//! [`Applier`] up to a fixed target. Audits (the state at a past point) and repairs (a
//! partition rebuilt off to the side) work through [`LogSource`], and swap a rebuilt partition
//! into a running replica through [`LiveState`], so neither links a Kafka client:
//! `prefixlog_ingest::LogSpec` and `prefixlog_node::IngestThread` implement them over Kafka, and
//! tests can implement them in memory.
//!
//! Also what reading the log can run into, as plain data the Kafka edge reports and the serving
//! side keeps (its `ReplicaStatus`): a hole in a partition's offsets ([`LogHole`], with its
//! [`HoleCause`] once a second read explains it) and the fate of dead-letter copies of refused
//! records ([`DeadLetterCounts`]).

use crate::apply::Applier;
use crate::settings::StateSettings;
use parking_lot::Mutex;
use prefixlog_engine::LogTime;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Where applying the log stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Until {
    /// Next offsets per partition: every record below them applied, none at or above.
    /// Partitions not named are left as they are.
    Offsets(BTreeMap<u32, i64>),
    /// Log time: per owned partition, every record before the first one stamped after it (or
    /// up to the log's end as probed when it starts).
    Time(LogTime),
}

/// The first retained offset and the end (next offset to be written) of a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermarks {
    pub low: i64,
    pub high: i64,
}

/// What the log's keeper says about it right now: cluster id, partition count, and the
/// retained range of every owned partition.
#[derive(Clone, Debug)]
pub struct LogProbe {
    pub cluster_id: String,
    /// Partitions of the topic as the broker reports them.
    pub partitions: u32,
    /// Per owned partition.
    pub watermarks: BTreeMap<u32, Watermarks>,
}

impl LogProbe {
    pub fn low(&self, p: u32) -> i64 {
        self.watermarks.get(&p).map_or(0, |w| w.low)
    }

    pub fn high(&self, p: u32) -> i64 {
        self.watermarks.get(&p).map_or(0, |w| w.high)
    }

    /// Whether every owned partition still starts at offset 0.
    pub fn from_start(&self) -> bool {
        self.watermarks.values().all(|w| w.low == 0)
    }
}

/// Knobs of [`LogSource::apply`] that do not change its result.
pub struct ApplyLogOptions<'a> {
    /// Give up when no record arrives for this long.
    pub idle_timeout: Duration,
    /// Called with (records applied so far, records to apply in all) as it goes.
    pub progress: Option<&'a mut dyn FnMut(u64, u64)>,
    /// The log's range as the caller has just probed it (one round trip per partition saved);
    /// probed when `None`.
    pub probe: Option<&'a LogProbe>,
    /// Called with the state just before each record is applied, and that record (partition,
    /// offset, log time, value): audits judge placements against the index they met
    /// (`prefixlog audit loss`) in the same pass as the replay.
    pub before_apply: Option<&'a mut BeforeApply<'a>>,
}

/// The observer of [`ApplyLogOptions::before_apply`].
pub type BeforeApply<'a> = dyn FnMut(&Applier, u32, i64, LogTime, Option<&[u8]>) + 'a;

impl Default for ApplyLogOptions<'_> {
    fn default() -> Self {
        Self { idle_timeout: Duration::from_secs(30), progress: None, probe: None, before_apply: None }
    }
}

/// An error of the log's keeper (the Kafka edge's typed error, kept whole as the source: its
/// message says what failed, and `downcast_ref` recovers it where a caller must tell cases
/// apart).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct LogError(pub Box<dyn std::error::Error + Send + Sync + 'static>);

impl LogError {
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(e))
    }
}

/// A log that can be probed and applied up to a fixed target.
pub trait LogSource: Send + Sync {
    fn topic(&self) -> &str;
    /// The partition count the log's records are placed for.
    fn partitions(&self) -> u32;
    /// The partitions this process owns (its shard), ascending.
    fn owned(&self) -> &[u32];
    /// The settings records are applied with.
    fn settings(&self) -> StateSettings;
    /// The log's range now.
    fn probe(&self) -> Result<LogProbe, LogError>;
    /// Applies records from the applier's next offsets up to `until`, exactly: a target beyond
    /// the log's end, a state the log no longer continues, a discontinuity or a stall is an
    /// error, never a partial result. Returns the records applied.
    fn apply(&self, applier: &mut Applier, until: &Until, opts: ApplyLogOptions<'_>)
        -> Result<u64, LogError>;
    /// Reads, without applying them, the records [`LogSource::apply`] would apply to a state
    /// whose next offsets are `from` (partitions not in `from` are not read), calling
    /// `on_record` with each in partition offset order, with the same checks. Audits that must
    /// apply records in an order of their own (`prefixlog audit loss`) read them first. `probe`:
    /// the log's range as the caller has just probed it (probed when `None`). Returns the
    /// records read.
    fn read(
        &self,
        from: &BTreeMap<u32, i64>,
        until: &Until,
        probe: Option<&LogProbe>,
        on_record: &mut OnRecord<'_>,
    ) -> Result<u64, LogError>;
}

/// The observer of [`LogSource::read`]: each record's (partition, offset, log time, value).
pub type OnRecord<'a> = dyn FnMut(u32, i64, LogTime, Option<&[u8]>) + 'a;

/// The boxed future of [`LiveState::replace_partition`].
pub type Replacing<'a> = Pin<Box<dyn Future<Output = Result<(), LogError>> + Send + 'a>>;

/// A running replica's state as repairs and peers see it.
pub trait LiveState: Send + Sync {
    /// The applier the ingest thread writes (lock it briefly: ingest waits meanwhile).
    fn applier(&self) -> &Arc<Mutex<Applier>>;
    /// Replaces partition `partition` with `src`'s state between two records, then reads on
    /// from `src`'s next offset for it. Resolves once the swap is done.
    fn replace_partition(&self, partition: u32, src: Applier) -> Replacing<'_>;
}

/// The boxed future of [`LogAppend::append`].
pub type Appending<'a> = Pin<Box<dyn Future<Output = Result<prefixlog_ids::Landed, LogError>> + Send + 'a>>;

/// Appending encoded records to the log, keyed by worker (the protocol facades write through
/// it; `prefixlog_ingest::Publisher` over Kafka).
pub trait LogAppend: Send + Sync {
    /// Appends `record` (encoded with [`crate::record`]) to the partition of `worker`; resolves
    /// with where it landed (its consistency token is that offset + 1), or fails without
    /// having been acknowledged.
    fn append(&self, worker: u64, record: Vec<u8>) -> Appending<'_>;
}

/// Why the log skips a partition's offsets `start..end` inside its retained range (a
/// [`LogHole`]), as far as a second read of them can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoleCause {
    /// A read that includes uncommitted records finds records there: they belong to aborted
    /// transactions (a read_committed reader skips them). A transactional producer writes to
    /// the topic.
    AbortedRecords,
    /// No reader gets a record there: offsets taken by records no consumer is given —
    /// transaction markers (control records) of a transactional producer (or compaction).
    NoRecords,
    /// The second read did not get that far (broker unreachable, timeout).
    Unexplained,
}

impl HoleCause {
    pub const ALL: [HoleCause; 3] = [HoleCause::AbortedRecords, HoleCause::NoRecords, HoleCause::Unexplained];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            HoleCause::AbortedRecords => "aborted_records",
            HoleCause::NoRecords => "no_records",
            HoleCause::Unexplained => "unexplained",
        }
    }

    /// Its place in [`Self::ALL`]: an index for counts kept per cause.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Offsets `start..end` of a partition that the log skips: the reader expected `start` and
/// the next record it was given is at `end`. Permanent (a log never changes below its end): a
/// state that ends before `end` meets the same hole again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHole {
    pub partition: u32,
    pub start: i64,
    pub end: i64,
    /// `None` until the second read has run.
    pub cause: Option<HoleCause>,
}

impl std::fmt::Display for LogHole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (p, s, e) = (self.partition, self.start, self.end);
        write!(f, "partition {p} skips offsets {s}..{e} inside the log: ")?;
        f.write_str(match self.cause {
            Some(HoleCause::AbortedRecords) => {
                "records of aborted transactions are there (a transactional producer writes to the topic)"
            }
            Some(HoleCause::NoRecords) => {
                "no consumer is given a record there: transaction markers of a transactional producer \
                 (or compaction)"
            }
            Some(HoleCause::Unexplained) => "a second read to explain it did not get there",
            None => "being explained",
        })
    }
}

/// What became of the dead-letter copies of refused records, per replica (the replica's `/metrics` reads them at scrape time;
/// nothing here is global, so two replicas in one process count apart).
#[derive(Debug, Default)]
pub struct DeadLetterCounts {
    /// Delivered to the dead-letter topic.
    pub copied: AtomicU64,
    /// Dropped: the producer queue was full, or the broker did not take it.
    pub failed: AtomicU64,
}
