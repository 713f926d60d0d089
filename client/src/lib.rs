//! prefixlog's gateway client: ask the index under a hard deadline, across every shard, and
//! fail open. It links only the wire schemas (`prefixlog-proto`), the shared ids
//! (`prefixlog-ids`) and tonic: no server, engine, librdkafka or ZeroMQ, so a gateway can
//! depend on it alone. Writes (placements) go through Kafka with `prefixlog_ingest::Publisher`;
//! its `Landed` tokens feed [`MatchQuery::after`].
//!
//! Module map:
//! - [`client`]: [`IndexClient`], the fail-open gateway client over every shard;
//!   [`MatchQuery`], [`Prompt`], [`Answer`], [`MatchOutcome`].
//! - [`mux`]: [`StreamMux`], many queries over one long-lived `MatchStream` per replica
//!   (per-query deadlines, answers routed by request id, reconnect).
//! - [`shards`]: the client's shard map (static, or discovered with `Describe`) and the exact
//!   merge of shard answers.
//! - [`seeds`]: discovery seeds resolved to every address behind them (headless Services).
//! - [`replicas`]: one shard's replicas: health probing, least-lagged choice, failover.

pub mod client;
pub mod mux;
pub mod replicas;
pub mod seeds;
pub mod shards;

pub use client::{Answer, DiscoveryError, IndexClient, MatchOutcome, MatchQuery, Prompt, Unavailable};
pub use mux::{MuxError, StreamMux};
pub use prefixlog_ids::{token_of, KeyspaceId, Landed, NextOffset, Tier};

/// Re-exported so gateways build TLS configs and raw calls with the exact version this crate
/// was built with.
pub use tonic;
