//! The query side of Dynamo's standalone KV indexer HTTP API (`python -m dynamo.indexer`),
//! served on a port of its own (docs/compat/dynamo-mooncake-http.md, "Implemented").
//!
//! Only `POST /query`, `POST /query_by_hash` and `GET /health`: what a router asks. Writes go
//! through `prefixlog bridge`, so `/register`, `/unregister`, `/dump` and peers are not served.
//!
//! - [`wire`]: the JSON bodies, field for field from Dynamo's server (Apache-2.0), and the
//!   mapping of per-holder depths to Dynamo's score response (pure).
//! - [`reader`]: keyspace resolution, routing-group filtering and the query through
//!   `QueryService::answer`; its typed errors carry their HTTP status.
//! - [`limit`]: the bounds on requests in flight (429 over it) and time per request (504).
//! - [`server`]: the axum router (body limit, bounds, metrics) and [`DynamoHttpExtension`], which
//!   serves it on its own port for the lifetime of a replica.

pub mod limit;
pub mod reader;
pub mod server;
pub mod wire;

pub use server::{DynamoHttpExtension, StartError};

/// The `protocol` label of this facade's metrics.
pub const PROTOCOL: &str = "dynamo-http";
/// Largest request body (upstream's limit on `/query`): larger ones are 413 before parsing.
pub const MAX_BODY_BYTES: usize = 8 << 20;
/// The keyspace scheme `/query_by_hash` answers from: Dynamo's position-free XXH3 block hashes
/// (seed 1337), the same hash as SMG's `content_hash` (docs/compat/README.md, "Hash schemes").
pub const HASH_SCHEME_DYNAMO_BLOCK: u32 = 2;
/// Workers without a `routing_group` metadata entry are in Dynamo's default group.
pub const DEFAULT_ROUTING_GROUP: &str = "default";
/// The worker metadata key a worker's routing group is read from.
pub const META_ROUTING_GROUP: &str = "routing_group";
