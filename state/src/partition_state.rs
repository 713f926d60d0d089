//! What the applier keeps per partition besides the engine's holders: the next offset, log
//! time, the feed table (dedupe, epochs, gaps), announced workers, counters and digest points.
//! All of it is applied state: checkpointed, digested, compared between replicas.

use crate::record::{BadReason, LaneMeta};
use prefixlog_engine::digest::mix64;
use prefixlog_engine::{KeyspaceId, LogTime};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The fingerprint of a record: its timestamp and value bytes (a record republished into a
/// recreated topic carries a new timestamp). Never 0, which means "not known".
pub fn record_mark(ts_ms: u64, value: Option<&[u8]>) -> u64 {
    let h = match value {
        Some(v) => xxh3_64_with_seed(v, ts_ms),
        None => mix64(ts_ms ^ 0x6e6f_2d76_616c_7565),
    };
    h.max(1)
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct FeedKey {
    pub keyspace: KeyspaceId,
    pub worker: u64,
    pub dp_rank: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Feed {
    pub epoch: u64,
    pub last_seq: Option<u64>,
    pub lanes: BTreeSet<u32>,
    pub gapped: bool,
    /// What the bridge announced about each lane (kind, window, block size), this epoch.
    pub lane_meta: BTreeMap<u32, LaneMeta>,
}

impl Feed {
    pub fn new(epoch: u64) -> Self {
        Self { epoch, last_seq: None, lanes: BTreeSet::new(), gapped: false, lane_meta: BTreeMap::new() }
    }
}

/// Counters of one partition (deterministic: part of the applied state).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionCounters {
    pub applied: u64,
    pub duplicates: u64,
    pub stale_epochs: u64,
    pub gaps: u64,
    pub epochs: u64,
    pub missing_parents: u64,
    /// Stores refused whole (an ext repeated within the store, or the parent among them).
    pub invalid_stores: u64,
    /// Records whose timestamp moved log time by more than the settings allow (cut).
    pub log_time_clamped: u64,
    /// Gaps in the log itself that an operator accepted (`--accept-log-gaps`).
    pub log_gaps: u64,
    pub bad: BTreeMap<BadReason, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionState {
    /// The next offset to apply.
    pub next_offset: i64,
    /// Log time: record timestamps, never moving back, at most a settings-bounded step per record.
    pub log_time: LogTime,
    pub feeds: BTreeMap<FeedKey, Feed>,
    /// Workers announced by `WorkerAdded` (and not removed since), with their metadata.
    pub workers: BTreeMap<u64, BTreeMap<String, String>>,
    pub counters: PartitionCounters,
    /// The last placement-expiry bucket (log time / expiry interval) handled.
    pub expiry_bucket: u64,
    /// Fingerprint of the record at `next_offset - 1` ([`record_mark`];
    /// 0 = not known): what tells this log from a recreated one that has since grown past the
    /// state's offsets. Not digested (replicas at the same offsets of one log agree on it by
    /// construction); checkpoints keep it in their meta (so it is not serialized here).
    #[serde(skip)]
    pub last_mark: u64,
}

/// A partition's digest after applying every record below `next_offset`. Also a time → offset
/// index entry (audits): the log time at that offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestPoint {
    pub next_offset: i64,
    pub log_time: LogTime,
    pub digest: u64,
}

fn mix_str(mut h: u64, s: &str) -> u64 {
    h = mix64(h ^ s.len() as u64);
    for b in s.bytes() {
        h = mix64(h ^ u64::from(b));
    }
    h
}

impl PartitionState {
    /// Digest of the feed table and the announced workers (the engine digests the holders).
    pub fn digest(&self) -> u64 {
        let mut d = 0u64;
        for (k, f) in &self.feeds {
            let mut h = mix64(k.worker ^ mix64(u64::from(k.dp_rank) ^ mix64(k.keyspace.model.len() as u64)));
            h = mix64(h ^ u64::from(k.keyspace.block_size) << 32 ^ u64::from(k.keyspace.scheme));
            for b in k.keyspace.model.bytes() {
                h = mix64(h ^ u64::from(b));
            }
            h = mix64(h ^ f.epoch ^ mix64(f.last_seq.map_or(u64::MAX, |s| s) ^ u64::from(f.gapped)));
            for m in f.lane_meta.values() {
                h = mix64(
                    h ^ u64::from(m.lane) << 40 ^ u64::from(m.sliding_window) << 8 ^ u64::from(m.block_size),
                );
                for b in m.kind.bytes() {
                    h = mix64(h ^ u64::from(b));
                }
            }
            d = d.wrapping_add(h);
        }
        for (w, meta) in &self.workers {
            let mut h = mix64(w ^ 0x776f_726b_6572);
            for (k, v) in meta {
                h = mix_str(mix_str(h, k), v);
            }
            d = d.wrapping_add(h);
        }
        d
    }

    /// Records skipped for any reason (duplicates, stale epochs, bad records).
    pub fn skipped(&self) -> u64 {
        let c = &self.counters;
        c.duplicates + c.stale_epochs + c.bad.values().sum::<u64>()
    }
}
