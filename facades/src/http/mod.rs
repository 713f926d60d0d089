//! The HTTP indexer API of Dynamo's standalone KV indexer (`python -m dynamo.indexer`) or, behind
//! a flag, of Mooncake's conductor indexer, served on a port of its own
//! (docs/compat/dynamo-mooncake-http.md, "Served by prefixlog").
//!
//! The query side only: `POST /query`, `POST /query_by_hash`, `GET /workers`, `GET /health`,
//! what a router asks. Writes go through `prefixlog bridge`, so `/register`, `/unregister`,
//! `/dump` and peers are not served. The dialect is chosen when the server starts
//! ([`Dialect`]), never guessed per request: the two disagree on field names and shapes.
//!
//! - [`wire`]: Dynamo's JSON bodies, field for field from its server (Apache-2.0), and the
//!   mapping of per-holder depths to its score response (pure).
//! - [`mooncake`]: Mooncake's `/query` JSON, field for field from its design doc (Apache-2.0),
//!   and the mapping of per-holder depths to its per-tenant, per-instance answer (pure).
//! - [`workers`]: `GET /workers` in Dynamo's shape, from the workers' recorded metadata.
//! - [`reader`]: keyspace resolution, worker filtering (routing group, tenant, instance) and the
//!   query through `QueryService::answer`; its typed errors carry their HTTP status.
//! - [`limit`]: the bounds on requests in flight (429 over it) and time per request (504).
//! - [`server`]: the axum router (body limit, bounds, metrics) and [`HttpIndexerExtension`],
//!   which serves it on its own port for the lifetime of a replica.

pub mod limit;
pub mod mooncake;
pub mod reader;
pub mod server;
pub mod wire;
pub mod workers;

pub use server::HttpIndexerExtension;

/// The `protocol` label of this facade's metrics in the Dynamo dialect.
pub const PROTOCOL: &str = "dynamo-http";
/// The `protocol` label of this facade's metrics in the Mooncake dialect.
pub const PROTOCOL_MOONCAKE: &str = "mooncake-http";
/// Largest request body (upstream's limit on `/query`): larger ones are 413 before parsing.
pub const MAX_BODY_BYTES: usize = 8 << 20;
/// The keyspace scheme `/query_by_hash` answers from: Dynamo's position-free XXH3 block hashes
/// (seed 1337), the same hash as SMG's `content_hash` (docs/compat/README.md, "Hash schemes").
pub const HASH_SCHEME_DYNAMO_BLOCK: u32 = 2;
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
