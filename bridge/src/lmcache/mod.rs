//! The LMCache bridge: LMCache's Kafka cache-event stream (its coordinator's
//! `KafkaCacheEventSink`, LMCache 0.5.6) read as it is and written to the log as KV-event
//! records, so replicas index each LMCache instance's chunks on its own worker.
//!
//! Why a translating bridge and not a second log source in the replica: one log keeps one
//! order, so checkpoints, digests, audits and anti-entropy stay as they are, and the records
//! are ordinary KV-event batches every replica already applies. The translation is
//! deterministic ([`translate`]): `epoch` is LMCache's incarnation and `seq` its batch seq, so
//! a restarted bridge, which reads the topic from its start again, republishes the same
//! records and the replicas drop them as duplicates; it publishes each instance's records of
//! its newest incarnation only ([`newest_incarnations`]), as an older epoch would mark the
//! instance gapped.
//!
//! Modules: [`wire`] (the JSON envelope, validated as LMCache's consumer validates it),
//! [`gate`] (LMCache's seq dedup and incarnation fencing), [`chunks`] (an instance's chunks:
//! hash verification, ranks, parents, credits), [`translate`] (batches → records),
//! [`metrics`], [`run`] (the Kafka consumer loop).
//!
//! What a gateway asks: keyspace `(model_name, chunk_size, 1)` with the prompt's token ids
//! (and the request's `cache_salt`, a key of the first chunk as for vLLM), on tiers `host`
//! (LMCache L1: dram, devdax), `disk` (L1 gds) and `external` (L2). The chunks are LMCache's
//! own, verified: a chunk is credited only when its blake3 chunk hash is reproduced from its
//! token ids and a credited parent's hash. `docs/compat/lmcache.md` has the mapping and the
//! differences from LMCache's coordinator.

pub mod chunks;
pub mod gate;
pub mod metrics;
pub mod run;
pub mod translate;
pub mod wire;

pub use metrics::{LmMetrics, Refusal};
pub use translate::{
    is_current, newest_incarnations, tier_of, Config, FeedRecord, Output, Translator, META_LMCACHE_INSTANCE,
};
