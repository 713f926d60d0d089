//! What a checkpoint's meta records (the types only): how [`crate::meta`] writes and reads it
//! in this build's format, and [`crate::upgrade`] in older ones.

use prefixlog_engine::KeyspaceId;
use prefixlog_state::LogIdentity;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyspaceEntry {
    pub id: KeyspaceId,
    pub chunks: u32,
    pub bytes: u64,
    pub checksum: u64,
    pub holder_blocks: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMeta {
    pub id: u64,
    pub format: u32,
    /// Wall-clock creation time: metadata for operators only, never applied state.
    pub created_unix_ms: u64,
    pub identity: LogIdentity,
    /// Next offset to apply, per partition of the log (only covered ones are meaningful).
    pub offsets: Vec<i64>,
    /// Log time applied up to, per partition of the log.
    pub log_times: Vec<u64>,
    pub partitions_len: u64,
    pub partitions_checksum: u64,
    pub keyspaces: Vec<KeyspaceEntry>,
    /// Each partition's digest (holders, feeds, workers) at `offsets`, taken with the state:
    /// what a replay of the log must reproduce (`audit verify`), without rebuilding the state.
    pub digests: Vec<u64>,
    /// Each partition's fingerprint of the record before its offset
    /// ([`prefixlog_state::partition_state::record_mark`], 0 = unknown); empty before format 4.
    pub marks: Vec<u64>,
}
