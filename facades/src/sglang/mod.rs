//! SGLang's external KV indexer, `kv_indexer.v1.KVIndexer` (docs/compat/sglang.md).
//!
//! One configured keyspace per replica (the protocol names neither model nor block size):
//! `(model, block_size, hash scheme 4)`, scheme 4 = SGLang's page hash, whose values serve as
//! both `ext` and `local` (a page hash already names its whole prefix).
//!
//! - [`batch`]: validation of `ApplyExternalKvBatch` and the mapping of its actions to KV ops
//!   (pure; what is skipped and why).
//! - [`writer`]: worker identity and metadata, feed epoch and sequence, publishing.
//! - [`fleet`]: `ConfigureExpectedWorkers`: the listed workers announced, the others removed.
//! - [`reader`]: the three query RPCs, answered through `QueryService::answer`.
//! - [`service`]: the gRPC service (statuses, metrics) and [`SglangExtension`], which hosts it
//!   on the query port.

pub mod batch;
pub mod fleet;
pub mod reader;
pub mod service;
pub mod writer;

pub use service::{SglangExtension, SglangService};

/// The schema, generated from `proto/proto/compat/sglang/kv_indexer.proto`.
pub mod pb {
    #![allow(clippy::all)]
    tonic::include_proto!("kv_indexer.v1");
}

use prefixlog_engine::KeyspaceId;

/// The `protocol` label of this facade's metrics.
pub const PROTOCOL: &str = "sglang";
/// The hash scheme id of SGLang page hashes (docs/compat/README.md, "Hash schemes").
pub const HASH_SCHEME_SGLANG: u32 = 4;
/// The lane SGLang's blocks are filed under, on every tier.
pub const SGLANG_LANE: u32 = 0;
/// SGLang's tiers and the storage tiers they are filed on, in preference order.
pub const SGLANG_TIERS: [(pb::TierType, prefixlog_engine::Tier); 3] = [
    (pb::TierType::TierHbm, prefixlog_engine::Tier::Gpu),
    (pb::TierType::TierDram, prefixlog_engine::Tier::Host),
    (pb::TierType::TierSsd, prefixlog_engine::Tier::Disk),
];
/// Limits of one `ApplyExternalKvBatch` (upstream's).
pub const MAX_ACTIONS: usize = 256;
pub const MAX_BATCH_HASHES: usize = 16_384;
/// Longest `worker_id`, in bytes (as `serve --max-name-bytes` bounds names on the log).
pub const MAX_WORKER_ID_BYTES: usize = 256;
/// Workers this process keeps writing state for: a stream of requests each naming a new worker
/// must not grow its memory without end (the log's own limits refuse them later, per partition).
pub const MAX_WORKERS: usize = 65_536;

/// Most workers one request may list.
pub const MAX_EXPECTED_WORKERS: usize = 65_536;
/// Most hashes of one `MatchExternalKv` / `GetExternalKvHitCounts` request (upstream's).
pub const MAX_MATCH_HASHES: usize = 16_384;
/// Concurrent `MatchExternalKvPrefix` calls; one more is RESOURCE_EXHAUSTED at once
/// (upstream's `KV_INDEXER_PREFIX_QUERY_MAX_INFLIGHT`; sgl-router treats it as "overloaded").
pub const MAX_PREFIX_INFLIGHT: usize = 32;
/// Largest request decoded (upstream's): larger ones are refused before any work.
pub const MAX_MESSAGE_BYTES: usize = 8 << 20;
/// Distinct hashes whose hit counts a facade keeps (`count_as_hit`); past it new hashes are
/// not counted (counted as skipped, reason `hit_counts_full`).
pub const MAX_HIT_COUNTED: usize = 1 << 20;

/// What the facade serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SglangConfig {
    /// The model of the one keyspace this facade writes and answers.
    pub model: String,
    /// Tokens per page of the workers (the keyspace's block size).
    pub block_size: u32,
}

impl SglangConfig {
    pub fn keyspace(&self) -> KeyspaceId {
        KeyspaceId::new(self.model.clone(), self.block_size, HASH_SCHEME_SGLANG)
    }
}
