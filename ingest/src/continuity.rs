//! Does the log still continue where a state ends? The start-up half of "the log's continuity
//! is checked, never assumed" (the run-time half is in [`crate::reader`]).
//!
//! A state (a checkpoint, or the empty state at offset 0) covers every record of a partition
//! below its next offset `o`. The log can continue it only if it still holds offset `o`:
//! `low ≤ o ≤ high`. Otherwise:
//! - `o < low`: the records from `o` on were deleted (retention ran past the checkpoint, or
//!   the checkpoint is older than the log): replaying from `low` would skip them;
//! - `o > high`: the log ends before the state does (the topic was deleted and recreated, or
//!   truncated): its offsets no longer mean what the state says.
//!
//! Offsets alone cannot tell a recreated topic that has grown past `o` again (publishers and
//! ticks refill it) from the log the state came from. So a state also keeps the fingerprint of
//! the record at `o - 1` ([`record_mark`]: its timestamp and bytes), and [`check_marks`] reads
//! that record back: another record there means another log.
//!
//! At run time the reader may find a hole inside the log (offsets it is not given a record
//! for: a transactional producer's markers or aborted records); [`explain_hole`] reads it again
//! to say which.

use crate::log_spec::LogSpec;
use crate::reader::{Found, LogReader, Read};
use prefixlog_ids::NextOffset;
use prefixlog_state::log::LogProbe;
use prefixlog_state::partition_state::record_mark;
use prefixlog_state::{HoleCause, LogHole};
use rdkafka::error::KafkaError;
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// Reading back the records a state's fingerprints name failed.
#[derive(Debug, thiserror::Error)]
pub enum MarkCheckError {
    #[error("reading the log to check that the state was applied from it: {0}")]
    Kafka(#[from] KafkaError),
    #[error(
        "the records before the state of partitions {partitions:?} could not be read within {waited:?} \
         (needed to check that the state was applied from this log)"
    )]
    Timeout { partitions: Vec<u32>, waited: Duration },
}

/// A partition whose log does not continue its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetProblem {
    /// The log now starts after the state ends.
    TailGone { partition: u32, state: i64, log_start: i64 },
    /// The log ends before the state does.
    LogEndsBefore { partition: u32, state: i64, log_end: i64 },
    /// The record before the state's offset is not the one the state applied: another log
    /// under the same name (recreated, and grown past the state since).
    Replaced { partition: u32, state: i64 },
}

impl OffsetProblem {
    pub fn partition(&self) -> u32 {
        match *self {
            OffsetProblem::TailGone { partition, .. }
            | OffsetProblem::LogEndsBefore { partition, .. }
            | OffsetProblem::Replaced { partition, .. } => partition,
        }
    }

    /// Where reading can resume if an operator accepts the gap: the log's first offset.
    pub fn resume_at(&self, probe: &LogProbe) -> i64 {
        probe.low(self.partition())
    }
}

impl fmt::Display for OffsetProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            OffsetProblem::TailGone { partition, state, log_start } => write!(
                f,
                "partition {partition}: the state ends at offset {state} but the log now starts at \
                 {log_start} (records {state}..{log_start} were deleted by retention)"
            ),
            OffsetProblem::LogEndsBefore { partition, state, log_end } => write!(
                f,
                "partition {partition}: the state ends at offset {state} but the log ends at {log_end} \
                 (the topic was recreated or truncated)"
            ),
            OffsetProblem::Replaced { partition, state } => write!(
                f,
                "partition {partition}: the record at offset {} is not the one the state applied (the \
                 topic was recreated and has grown past the state since)",
                state - 1
            ),
        }
    }
}

/// The owned partitions whose log does not continue `state` (next offset per partition).
pub fn check_offsets(state: impl IntoIterator<Item = NextOffset>, probe: &LogProbe) -> Vec<OffsetProblem> {
    let mut out = Vec::new();
    for NextOffset { partition, offset: o } in state {
        let Some(w) = probe.watermarks.get(&partition) else { continue };
        if o < w.low {
            out.push(OffsetProblem::TailGone { partition, state: o, log_start: w.low });
        } else if o > w.high {
            out.push(OffsetProblem::LogEndsBefore { partition, state: o, log_end: w.high });
        }
    }
    out
}

/// The partitions of `state` (partition, next offset, [`record_mark`] of the record before
/// it) whose record at `next offset - 1` is another one: the log was replaced. Not checked
/// (nothing to compare): an unknown mark (0: a checkpoint of an older format), offset 0, and a
/// record retention deleted (`o - 1 < low`); [`check_offsets`] covers offsets outside the log.
/// Reads at most one record per checked partition, within `timeout`.
pub fn check_marks(
    spec: &LogSpec,
    state: &[(u32, i64, u64)],
    probe: &LogProbe,
    timeout: Duration,
) -> Result<Vec<OffsetProblem>, MarkCheckError> {
    let mut want: BTreeMap<u32, (i64, u64)> = state
        .iter()
        .filter(|&&(p, o, mark)| mark != 0 && o > 0 && probe.low(p) < o && o <= probe.high(p))
        .map(|&(p, o, mark)| (p, (o, mark)))
        .collect();
    let mut out = Vec::new();
    if want.is_empty() {
        return Ok(out);
    }
    let (checked, started) = (want.len(), Instant::now());
    let mut reader = LogReader::open(spec, want.iter().map(|(&p, &(o, _))| NextOffset::new(p, o - 1)))?;
    let deadline = started + timeout;
    while !want.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(MarkCheckError::Timeout { partitions: want.into_keys().collect(), waited: timeout });
        }
        let (p, mark) = match reader.poll(left.min(Duration::from_millis(200))) {
            Read::Record(r) => (r.partition(), record_mark(r.timestamp_ms(), r.payload())),
            // Deleted by retention since the probe: nothing left to compare.
            Read::Discontinuity(d) => (d.partition, 0),
            Read::Idle | Read::BrokerError(_) => continue,
        };
        let Some((o, expected)) = want.remove(&p) else { continue };
        if mark != 0 && mark != expected {
            out.push(OffsetProblem::Replaced { partition: p, state: o });
        }
        let _ = reader.halt(p);
    }
    let secs = started.elapsed().as_secs_f64();
    tracing::info!(
        partitions = checked,
        secs,
        replaced = out.len(),
        "read back the record before each partition's offset"
    );
    Ok(out)
}

/// Why the log skips `hole`'s offsets: reads them again, this time given records of aborted
/// transactions too ([`LogReader::open_uncommitted`]), within `timeout`.
///
/// librdkafka never hands a control record (a transaction marker) to the application, in
/// either isolation level, and says nothing about a record's transaction. So a hole can be
/// explained, never proven harmless: records there under `read_uncommitted` are aborted
/// transactions ([`HoleCause::AbortedRecords`]); none is offsets no consumer is given, which on
/// a topic with `cleanup.policy=delete` are transaction markers ([`HoleCause::NoRecords`]).
pub fn explain_hole(spec: &LogSpec, hole: &LogHole, timeout: Duration) -> HoleCause {
    let mut reader = match LogReader::open_uncommitted(spec, [NextOffset::new(hole.partition, hole.start)]) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(partition = hole.partition, error = %e, "could not read a log hole again");
            return HoleCause::Unexplained;
        }
    };
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match reader.poll(Duration::from_millis(200)) {
            Read::Record(r) if r.offset() < hole.end => return HoleCause::AbortedRecords,
            Read::Record(_) => return HoleCause::NoRecords,
            Read::Discontinuity(d) => {
                return match d.found {
                    Found::Offset(o) if o < hole.end => HoleCause::AbortedRecords,
                    Found::Offset(_) => HoleCause::NoRecords,
                    // Retention deleted it since, or the topic was recreated: nothing to read.
                    Found::LogStart(_) | Found::LogEnd { .. } => HoleCause::Unexplained,
                };
            }
            Read::Idle | Read::BrokerError(_) => {}
        }
    }
    HoleCause::Unexplained
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_state::log::Watermarks;

    #[test]
    fn offsets_outside_the_retained_range_are_problems() {
        let probe = LogProbe {
            cluster_id: "c".into(),
            partitions: 3,
            watermarks: [(0, (0, 10)), (1, (5, 10)), (2, (0, 3))]
                .into_iter()
                .map(|(p, (low, high))| (p, Watermarks { low, high }))
                .collect(),
        };
        let got = check_offsets([(0, 10), (1, 4), (2, 7)].map(|(p, o)| NextOffset::new(p, o)), &probe);
        assert_eq!(
            got,
            vec![
                OffsetProblem::TailGone { partition: 1, state: 4, log_start: 5 },
                OffsetProblem::LogEndsBefore { partition: 2, state: 7, log_end: 3 },
            ]
        );
        assert!(check_offsets([NextOffset::new(1, 5), NextOffset::new(2, 3)], &probe).is_empty());
        assert!(got[0].to_string().contains("deleted by retention"));
    }
}
