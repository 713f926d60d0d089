//! The checkpoint encoding of metas and partition state (format 6 on): serde derives on the
//! types, encoded with postcard (varints, no per-field framing), behind the meta's format
//! version. Keyspaces are engine images (`prefixlog_engine::persist::image`), which the engine
//! lays out and reads itself; formats 2 to 5 are read by [`crate::upgrade`].
//!
//! Why postcard and not bincode: bincode 2 is flagged unmaintained (RUSTSEC-2025-0141) and
//! bincode 1 allocates whatever length a corrupt input declares; postcard reads only the bytes
//! it is given, and gives no size hint for a sequence that declares more items than bytes
//! remain (each item takes at least one), so a corrupt length never preallocates past the
//! input (`tests/corrupt_values.rs` measures it). Checksums catch corruption before decoding
//! anyway; a decode of damaged bytes is an `Err`, never a panic.

pub use crate::decode_error::DecodeError;
use crate::format::FORMAT_VERSION;
use prefixlog_state::{DigestPoint, PartitionState};
use serde::{Deserialize, Serialize};

/// `value` in postcard. Infallible for the types this crate stores (every sequence has a
/// known length; postcard only refuses sequences of unknown length).
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).expect("checkpoint values have known lengths")
}

/// A value that is the whole of `buf` (trailing bytes are an error).
pub(crate) fn decode<'a, T: Deserialize<'a>>(buf: &'a [u8]) -> Result<T, DecodeError> {
    let (value, rest) = postcard::take_from_bytes(buf)?;
    match rest.len() {
        0 => Ok(value),
        n => Err(DecodeError::TrailingBytes(n)),
    }
}

/// The partition value from format 6 on: every partition's applier state (the record marks
/// live in the meta), then every partition's recorded digest points (not applied state: how
/// far back anti-entropy can compare, kept so that a restart does not forget it).
#[derive(Serialize)]
struct PartitionValueRef<'a> {
    partitions: &'a [PartitionState],
    points: &'a [Vec<DigestPoint>],
}

/// [`PartitionValueRef`], decoded (the same layout: a slice and a `Vec` serialize alike).
#[derive(Deserialize)]
struct PartitionValue {
    partitions: Vec<PartitionState>,
    points: Vec<Vec<DigestPoint>>,
}

/// Encodes every partition's state and digest points in this build's format.
pub fn encode_partition_value(partitions: &[PartitionState], points: &[Vec<DigestPoint>]) -> Vec<u8> {
    encode(&PartitionValueRef { partitions, points })
}

/// Decodes a partition value of checkpoint format `format`: partition states, and the digest
/// points (none before format 5).
pub fn decode_partition_value(
    buf: &[u8],
    format: u32,
) -> Result<(Vec<PartitionState>, Vec<Vec<DigestPoint>>), DecodeError> {
    if format < FORMAT_VERSION {
        return crate::upgrade::partitions::decode_partition_value(buf, format);
    }
    let value: PartitionValue = decode(buf)?;
    Ok((value.partitions, value.points))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partition_value_round_trips_and_refuses_damage() {
        let mut p = PartitionState { next_offset: -1, log_time: u64::MAX, ..Default::default() };
        p.counters.bad.insert(prefixlog_state::BadReason::TooManyHolders, 3);
        p.workers.insert(7, [("k".to_string(), "v".to_string())].into());
        let points = vec![vec![DigestPoint { next_offset: 5, log_time: 6, digest: 7 }]];
        let bytes = encode_partition_value(std::slice::from_ref(&p), &points);
        assert_eq!(decode_partition_value(&bytes, FORMAT_VERSION), Ok((vec![p], points)));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode_partition_value(&longer, FORMAT_VERSION), Err(DecodeError::TrailingBytes(1)));
        assert_eq!(
            decode_partition_value(&bytes[..bytes.len() - 1], FORMAT_VERSION),
            Err(DecodeError::Malformed(postcard::Error::DeserializeUnexpectedEnd))
        );
    }
}
