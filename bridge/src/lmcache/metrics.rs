//! The LMCache bridge's counters, as Prometheus families
//! `prefixlog_lmcache_bridge_<family>_total{outcome|reason}`.

use prometheus::{IntCounterVec, Opts, Registry};

/// Why a store entry credited nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// No token ids (the emitter's token-binding cache no longer held the chunk).
    NoTokens,
    /// Token ids not one chunk (`--chunk-size`) long.
    TokenCount,
    /// Token ids outside u32.
    Tokens,
    /// No `token_offset` (an emitter predating offsets).
    NoOffset,
    /// An offset that is not a multiple of the chunk size.
    Offset,
    /// A chunk hash that is not a 32-byte blake3 digest (another hash algorithm).
    HashLength,
    /// A first chunk whose tokens do not hash to its chunk hash.
    HashMismatch,
    /// No recent chunk one position earlier reproduces the chunk's hash with its tokens.
    UnknownParent,
    /// The chunk's parent is not credited on any tier (the replicas would refuse the store).
    ParentNotHeld,
    /// A `kv_rank` whose world size is 0 or above 64, or whose rank is outside it.
    KvRank,
    /// An L1 backend other than dram, devdax, gds (or too many backends).
    Backend,
    /// A shared backend (a pool several instances mount): not one instance's placement.
    Shared,
    /// The instance's table is at `--max-chunks`.
    TableFull,
    /// The instance uses more namespaces (model, salt, object group) than the bound.
    TooManyNamespaces,
}

impl Refusal {
    pub const ALL: [Refusal; 14] = [
        Refusal::NoTokens,
        Refusal::TokenCount,
        Refusal::Tokens,
        Refusal::NoOffset,
        Refusal::Offset,
        Refusal::HashLength,
        Refusal::HashMismatch,
        Refusal::UnknownParent,
        Refusal::ParentNotHeld,
        Refusal::KvRank,
        Refusal::Backend,
        Refusal::Shared,
        Refusal::TableFull,
        Refusal::TooManyNamespaces,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoTokens => "no_tokens",
            Refusal::TokenCount => "token_count",
            Refusal::Tokens => "tokens",
            Refusal::NoOffset => "no_offset",
            Refusal::Offset => "offset",
            Refusal::HashLength => "hash_length",
            Refusal::HashMismatch => "hash_mismatch",
            Refusal::UnknownParent => "unknown_parent",
            Refusal::ParentNotHeld => "parent_not_held",
            Refusal::KvRank => "kv_rank",
            Refusal::Backend => "backend",
            Refusal::Shared => "shared",
            Refusal::TableFull => "table_full",
            Refusal::TooManyNamespaces => "too_many_namespaces",
        }
    }
}

/// The counters (cheap to clone: the families are shared).
#[derive(Clone)]
pub struct LmMetrics {
    /// LMCache records read: `read`, `undecodable`.
    pub records: IntCounterVec,
    /// Batches by the gate's verdict: `admitted`, `duplicate`, `stale`, `too_many_instances`.
    pub batches: IntCounterVec,
    /// Admitted batches after a gap (the instance was cleared): `gap`; after a restart (L1
    /// fenced): `restart`.
    pub streams: IntCounterVec,
    /// Chunk credits: `stored`, `removed`, `carried_over`, `carry_over_dropped`.
    pub chunks: IntCounterVec,
    /// Store entries that credited nothing, by [`Refusal`].
    pub refused: IntCounterVec,
    /// prefixlog records: `published`, `publish_failed`.
    pub published: IntCounterVec,
}

fn family(name: &str, help: &str, label: &str) -> IntCounterVec {
    IntCounterVec::new(Opts::new(format!("prefixlog_lmcache_bridge_{name}_total"), help), &[label])
        .expect("a valid metric")
}

impl Default for LmMetrics {
    fn default() -> Self {
        Self {
            records: family("records", "LMCache Kafka records read, by outcome", "outcome"),
            batches: family("batches", "LMCache cache-event batches, by the gate's verdict", "outcome"),
            streams: family("stream_events", "Gaps (instance cleared) and restarts (L1 fenced)", "event"),
            chunks: family("chunks", "Chunk credits published, by outcome", "outcome"),
            refused: family("entries_refused", "Store entries that credited nothing, by reason", "reason"),
            published: family("records_published", "prefixlog records, by outcome", "outcome"),
        }
    }
}

impl LmMetrics {
    /// Registers every family on `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        for f in [&self.records, &self.batches, &self.streams, &self.chunks, &self.refused, &self.published] {
            registry.register(Box::new(f.clone()))?;
        }
        Ok(())
    }

    pub fn inc(f: &IntCounterVec, label: &str) {
        f.with_label_values(&[label]).inc();
    }

    pub fn add(f: &IntCounterVec, label: &str, n: u64) {
        f.with_label_values(&[label]).inc_by(n);
    }

    pub fn get(f: &IntCounterVec, label: &str) -> u64 {
        f.with_label_values(&[label]).get()
    }

    pub fn refuse(&self, r: Refusal) {
        Self::inc(&self.refused, r.as_str());
    }
}
