//! prefixlog's query side: the gRPC service replicas run, and what a running replica reports
//! of itself ([`ReplicaStatus`]). The client gateways use is its own crate, `prefixlog-client`
//! (no server or librdkafka), which this one does not depend on: gateways, tests and
//! benchmarks import it directly.
//!
//! A query's path: gateway → `prefixlog_client::IndexClient` (endpoint choice, deadline,
//! fail-open) → gRPC → [`service::QueryService`] (validation, canonical hashing,
//! read-your-writes wait) → `prefixlog_engine::Engine` (read lock of one keyspace). Writes never
//! take this path: they go through Kafka (`prefixlog_ingest::Publisher`, whose `Landed` feeds
//! `prefixlog_client::MatchQuery::after`).
//!
//! Module map:
//! - [`service`]: [`service::QueryService`] (Match, Describe, ListWorkers answered),
//!   [`service::QueryConfig`] limits, [`service::ReplicaInfo`].
//! - [`grpc`]: the `PrefixIndex` gRPC trait implemented by calls of [`service::QueryService`]
//!   and [`stream`].
//! - [`stream`]: `MatchStream` served: bounded concurrency per stream, in-band errors and
//!   unordered answers for the requests that opt in.
//! - [`error`]: [`QueryError`], why a query was refused, and its one conversion to a gRPC status.
//! - [`validate`]: request validation and bounded error messages.
//! - [`tiers`]: a request's storage tier order and weights, and an answer's per-tier parts.
//! - [`server`]: starts the gRPC port (service + Echo + health + reflection) and admin port;
//!   [`ServerError`], why it did not start.
//! - [`extension`]: [`extension::Extension`], services other crates host on the query port
//!   (the protocol facades), built from the same [`service::QueryService`] and registry.
//! - [`health`]: [`health::Readiness`] (caught up = lag ≤ threshold) driving `grpc.health.v1`.
//! - [`listen`]: the HTTP/1 ports' accept loop: header and idle timeout, connections in all
//!   and per peer address capped.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz` over HTTP/1; [`admin::AdminPort`] binds it
//!   before the replica serves (start-up progress), and serves the bridge too.
//! - [`exposition`]: checks of a `/metrics` text against Prometheus' naming conventions (and
//!   `promtool check metrics`), for the tests of the replica's and the bridge's exposition.
//! - [`metrics`]: query latency, outcomes and matched depth; progress, continuity and state size
//!   collected at scrape time, into the replica's registry.
//! - [`status`]: [`ReplicaStatus`], a running replica's progress and health (offsets, lag,
//!   discontinuities, apply failures, log holes, broker contact, read-your-writes waits).
//!   Written by the replica's ingest and watermark threads (`prefixlog-node`), read by the
//!   query path and at scrape time; never part of applied state.

pub mod admin;
pub mod error;
pub mod exposition;
pub mod extension;
pub mod grpc;
pub mod health;
pub mod listen;
pub mod metrics;
pub mod server;
pub mod service;
pub mod status;
pub mod stream;
pub mod tiers;
pub mod validate;

pub use error::QueryError;
pub use extension::{Extension, ExtensionContext, ExtensionError, Extensions};
pub use server::{start, RunningServer, Served, ServerConfig, ServerError, TlsFiles};
pub use service::{default_replica_id, QueryConfig, QueryService, ReplicaInfo};
pub use status::ReplicaStatus;

/// Re-exported so tests, benchmarks and gateways use the exact versions this crate was built
/// with (health checks, raw gRPC calls).
pub use {prost, tokio_stream, tonic, tonic_health, tonic_reflection};
