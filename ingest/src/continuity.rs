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

use crate::probe::LogProbe;
use std::fmt;

/// A partition whose log does not continue its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffsetProblem {
    /// The log now starts after the state ends.
    TailGone { partition: u32, state: i64, log_start: i64 },
    /// The log ends before the state does.
    LogEndsBefore { partition: u32, state: i64, log_end: i64 },
}

impl OffsetProblem {
    pub fn partition(&self) -> u32 {
        match *self {
            OffsetProblem::TailGone { partition, .. } | OffsetProblem::LogEndsBefore { partition, .. } => {
                partition
            }
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
        }
    }
}

/// The owned partitions whose log does not continue `state` (next offset per partition).
pub fn check_offsets(state: impl IntoIterator<Item = (u32, i64)>, probe: &LogProbe) -> Vec<OffsetProblem> {
    let mut out = Vec::new();
    for (partition, o) in state {
        let Some(w) = probe.watermarks.get(&partition) else { continue };
        if o < w.low {
            out.push(OffsetProblem::TailGone { partition, state: o, log_start: w.low });
        } else if o > w.high {
            out.push(OffsetProblem::LogEndsBefore { partition, state: o, log_end: w.high });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::Watermarks;

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
        let got = check_offsets([(0, 10), (1, 4), (2, 7)], &probe);
        assert_eq!(
            got,
            vec![
                OffsetProblem::TailGone { partition: 1, state: 4, log_start: 5 },
                OffsetProblem::LogEndsBefore { partition: 2, state: 7, log_end: 3 },
            ]
        );
        assert!(check_offsets([(1, 5), (2, 3)], &probe).is_empty());
        assert!(got[0].to_string().contains("deleted by retention"));
    }
}
