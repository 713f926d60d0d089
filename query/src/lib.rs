//! prefixlog's query side: the gRPC service replicas run. The client gateways use is its own
//! crate, `prefixlog-client` (no server or librdkafka); its items are re-exported here.
//!
//! A query's path: gateway → [`IndexClient`] (endpoint choice, deadline, fail-open) →
//! gRPC → [`service::QueryService`] (validation, canonical hashing, read-your-writes wait) →
//! `prefixlog_engine::Engine` (read lock of one keyspace). Writes never take this path: they
//! go through Kafka (`prefixlog_ingest::Publisher`, whose `Landed` feeds [`MatchQuery::after`]).
//!
//! Module map:
//! - [`service`]: [`service::QueryService`] (Match, Describe, ListWorkers answered),
//!   [`service::QueryConfig`] limits, [`service::ReplicaInfo`].
//! - [`grpc`]: the `PrefixIndex` gRPC trait implemented by calls of [`service::QueryService`]
//!   and [`stream`].
//! - [`stream`]: `MatchStream` served: bounded concurrency per stream, in-band errors and
//!   unordered answers for the requests that opt in.
//! - [`validate`]: request validation and bounded error messages.
//! - [`tiers`]: a request's storage tier order and weights, and an answer's per-tier parts.
//! - [`server`]: starts the gRPC port (service + Echo + health + reflection) and admin port;
//!   [`ServerError`], why it did not start.
//! - [`extension`]: [`extension::Extension`], services other crates host on the query port
//!   (the protocol facades), built from the same [`service::QueryService`] and registry.
//! - [`health`]: [`health::Readiness`] (caught up = lag ≤ threshold) driving `grpc.health.v1`.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz` over HTTP/1; [`admin::AdminPort`] binds it
//!   before the replica serves (start-up progress), and serves the bridge too.
//! - [`exposition`]: checks of a `/metrics` text against Prometheus' naming conventions (and
//!   `promtool check metrics`), for the tests of the replica's and the bridge's exposition.
//! - [`metrics`]: query latency, outcomes and matched depth; progress, continuity and state size
//!   collected at scrape time, into the replica's registry.
//! - re-exported from `prefixlog-client`: [`IndexClient`] and its query types, [`StreamMux`].

pub mod admin;
pub mod exposition;
pub mod extension;
pub mod grpc;
pub mod health;
pub mod metrics;
pub mod server;
pub mod service;
pub mod stream;
pub mod tiers;
pub mod validate;

pub use extension::{Extension, ExtensionContext, ExtensionError, Extensions};
pub use prefixlog_client::{
    Answer, DiscoveryError, IndexClient, MatchOutcome, MatchQuery, MuxError, Prompt, StreamMux, Unavailable,
};
pub use server::{start, RunningServer, Served, ServerConfig, ServerError, TlsFiles};
pub use service::{default_replica_id, QueryConfig, QueryService, ReplicaInfo};

/// Re-exported so tests, benchmarks and gateways use the exact versions this crate was built
/// with (health checks, raw gRPC calls).
pub use {prost, tokio_stream, tonic, tonic_health, tonic_reflection};
