//! Why a checkpoint value does not decode, in any format: the one error the current codec
//! ([`crate::codec`]) and the readers of older formats ([`crate::upgrade`]) share.

/// Why a checkpoint value (a meta, a partition state, a dump) does not decode.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Format 6 on: the postcard decoder refused the value (its own typed error: the input
    /// ended, a varint or a bool or a string is malformed, ...).
    #[error("corrupt checkpoint value: {0}")]
    Malformed(#[from] postcard::Error),
    #[error("corrupt checkpoint value: truncated at byte {at} (need {need} more)")]
    Truncated { at: usize, need: usize },
    #[error("corrupt checkpoint value: string is not UTF-8")]
    NotUtf8,
    #[error("corrupt checkpoint value: length {0} exceeds the value")]
    LengthExceedsValue(usize),
    #[error("corrupt checkpoint value: {0} trailing bytes")]
    TrailingBytes(usize),
    #[error("corrupt checkpoint value: unknown bad-record reason {0}")]
    UnknownBadReason(usize),
    #[error("corrupt checkpoint value: covered partitions out of range or unsorted")]
    CoveredPartitions,
    #[error("corrupt checkpoint value: {found} {what} for {partitions} partitions")]
    PerPartitionCount { what: &'static str, found: usize, partitions: u32 },
}
