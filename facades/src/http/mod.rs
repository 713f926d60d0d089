//! The HTTP indexer API of Dynamo's standalone KV indexer (`python -m dynamo.indexer`) or, behind
//! a flag, of Mooncake's conductor indexer, served on a port of its own
//! (docs/compat/dynamo-mooncake-http.md, "Served by prefixlog"). The dialect is chosen when the
//! server starts ([`Dialect`]), never guessed per request: the two disagree on field names and
//! shapes.
//!
//! The Dynamo dialect answers every route of upstream's server as upstream does (checked
//! request for request against ai-dynamo-runtime 1.6.1 by `tests/upstream/test_dynamo_http.py`):
//! `/query`, `/query_by_hash`, `/workers`, `/register`, `/unregister`, `/dump`, the peer routes,
//! `/reopen_logs` and `/health`, with upstream's status codes, bodies and body rejections
//! (axum's `Json` extractor, as upstream's). The Mooncake dialect serves `/query`, `/workers`
//! and `/health`, and answers 501 to `/query_by_hash`.
//!
//! - [`wire`]: Dynamo's JSON bodies, field for field from its server (Apache-2.0), and the
//!   mapping of per-holder depths to its score response (pure).
//! - [`dynamo`]: Dynamo's `/query` and `/query_by_hash`: the indexer a `(model, routing
//!   group)` names, its keyspaces, the match and its tiers.
//! - [`registration`], [`register`], [`listeners`]: `/register` and `/unregister` written to
//!   the log, and the engine subscriptions the registrar replica runs for them, through
//!   [`feeds`]: the [`feeds::EngineFeeds`] the binary gives (the bridge's engine stream), so
//!   this crate links neither ZeroMQ nor Kafka.
//! - [`workers`]: `GET /workers` in Dynamo's shape, from the workers' recorded metadata.
//! - [`dump`]: `GET /dump`, the index as Dynamo's router events.
//! - [`mooncake`]: Mooncake's `/query` JSON, field for field from its design doc (Apache-2.0),
//!   and the mapping of per-holder depths to its per-tenant, per-instance answer (pure).
//! - [`reader`]: readiness, typed errors with their HTTP status, the match through
//!   `QueryService::answer`, Mooncake's `/query`.
//! - `json_body`: the body extractor of Dynamo's routes: axum's `Json` answers, parsed
//!   without its per-element path tracking on the common request.
//! - [`limit`]: the bounds on bodies (time 408, bytes at once 503, read before a place is
//!   taken), requests in flight (429 over it) and time per request (504).
//! - [`server`]: the axum router (body limits, bounds, metrics) and [`HttpIndexerExtension`],
//!   which serves it on its own port under `prefixlog_query::listen`'s connection bounds for the lifetime of a replica.

pub mod dump;
pub mod dynamo;
pub mod feeds;
mod json_body;
pub mod limit;
pub mod listeners;
pub mod mooncake;
pub mod reader;
pub mod register;
pub mod registration;
pub mod server;
pub mod wire;
pub mod workers;

pub use server::HttpIndexerExtension;

/// The metadata key of the worker's model (written by `prefixlog bridge`).
pub const META_MODEL: &str = "model";
/// The metadata key of the worker's block size in tokens (written by `prefixlog bridge`).
pub const META_BLOCK_SIZE: &str = "block_size";
/// The metadata key of the engine's ZeroMQ KV-event endpoints the bridge subscribes to, comma
/// separated, one per data-parallel rank (the bridge's `META_KV_EVENTS`).
pub const META_KV_EVENTS: &str = "kv_events_endpoint";

/// The `protocol` label of this facade's metrics in the Dynamo dialect.
pub const PROTOCOL: &str = "dynamo-http";
/// The `protocol` label of this facade's metrics in the Mooncake dialect.
pub const PROTOCOL_MOONCAKE: &str = "mooncake-http";
/// Largest request body of `/query` and `/query_by_hash` (upstream's limit on both): larger
/// ones are 413 before parsing. Upstream's other routes take axum's default, 2 MiB.
pub const MAX_BODY_BYTES: usize = 8 << 20;
/// Most blocks a prompt may have: every token or hash of a body costs at least two bytes of
/// JSON, so nothing upstream accepts is refused for its length.
pub const MAX_PROMPT_BLOCKS: usize = MAX_BODY_BYTES / 2;
/// The keyspace scheme `/query_by_hash` answers from: Dynamo's position-free XXH3 block hashes
/// (seed 1337), the same hash as SMG's `content_hash` (docs/compat/README.md, "Hash schemes").
pub const HASH_SCHEME_DYNAMO_BLOCK: u32 = prefixlog_engine::scheme::SCHEME_DYNAMO_BLOCK;
/// Workers without a `routing_group` metadata entry are in Dynamo's default group.
pub const DEFAULT_ROUTING_GROUP: &str = "default";
/// The worker metadata key a worker's routing group is read from.
pub const META_ROUTING_GROUP: &str = "routing_group";
/// The worker metadata key a worker's Mooncake tenant is read from (absent: [`DEFAULT_TENANT`]).
pub const META_TENANT: &str = "tenant_id";
/// The worker metadata key a worker's Mooncake instance id is read from (absent: the decimal
/// worker id).
pub const META_INSTANCE: &str = "instance_id";
/// Mooncake's default tenant, of requests and workers that name none.
pub const DEFAULT_TENANT: &str = "default";

/// Which upstream's JSON the server speaks, fixed when it starts (`--http-dialect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    /// Dynamo's standalone indexer (the default).
    #[default]
    Dynamo,
    /// Mooncake's conductor indexer (design doc consolidating RFC #1403).
    Mooncake,
}

impl Dialect {
    /// The `protocol` label of the facade metrics.
    pub fn protocol(self) -> &'static str {
        match self {
            Self::Dynamo => PROTOCOL,
            Self::Mooncake => PROTOCOL_MOONCAKE,
        }
    }
}

/// A dialect name that is neither `dynamo` nor `mooncake`.
#[derive(Debug, thiserror::Error)]
#[error("unknown HTTP indexer dialect {0:?} (expected dynamo or mooncake)")]
pub struct UnknownDialect(pub String);

impl std::str::FromStr for Dialect {
    type Err = UnknownDialect;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dynamo" => Ok(Self::Dynamo),
            "mooncake" => Ok(Self::Mooncake),
            other => Err(UnknownDialect(other.to_string())),
        }
    }
}
