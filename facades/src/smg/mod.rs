//! SMG's remote radix index, `radix_index.RadixIndex` (docs/compat/smg.md): what SMG's gateway
//! (`--kv-indexer-url`) and its event bridge (`radix-index-bridge`) speak.
//!
//! Holders are strings; each maps to one prefixlog worker (`dp_rank 0`, lane 0) through
//! [`crate::names`] with [`crate::names::SMG_SEED`], the full name (`#lane` suffix included):
//! SMG keeps epochs and sequence numbers per holder, prefixlog per feed, so one worker per holder
//! keeps them apart. Keyspaces map onto prefixlog keyspaces in [`keyspace`].
//!
//! - [`keyspace`]: `(model, symbol_kind, block_size, hash_scheme)` → a prefixlog keyspace.
//! - [`update`]: validation of an `Update` and the records its events become (pure).
//! - [`writer`]: holder identity and metadata, the epoch and sequence gate, publishing, acks.
//! - [`publish`]: the `Publish` stream (one ack per update, in order).
//! - [`subscribe`]: the `Subscribe` stream (one `Match` per `Query`, bounded in flight).
//! - [`state`]: `Pull`, `Digests`, `PullHolders` from the replica's engine state.
//! - [`service`]: the gRPC service and [`SmgExtension`], which hosts it on the query port.

pub mod keyspace;
pub mod publish;
pub mod service;
pub mod state;
pub mod subscribe;
pub mod update;
pub mod writer;

pub use service::{SmgExtension, SmgService};

/// The schema, generated from `proto/proto/compat/smg/radix_index.proto`.
pub mod pb {
    #![allow(clippy::all)]
    tonic::include_proto!("radix_index");
}

/// The `protocol` label of this facade's metrics.
pub const PROTOCOL: &str = "smg";
/// The gRPC service name (health, reflection).
pub const SERVICE_NAME: &str = "radix_index.RadixIndex";
/// The lane every SMG holder is filed under (one prefixlog worker per holder).
pub const LANE: u32 = 0;
/// Longest holder name, in bytes (as `serve --max-name-bytes` bounds names on the log).
pub const MAX_HOLDER_BYTES: usize = 256;
/// Most blocks (stored, removed) of one update, and most hashes of one query: upstream's
/// query limit, and the log's default `max_blocks_per_record`.
pub const MAX_UPDATE_BLOCKS: usize = 16_384;
/// Most events of one update.
pub const MAX_EVENTS: usize = 1_024;
/// Holders this process keeps writing state for (a stream naming ever new holders must not
/// grow its memory without end).
pub const MAX_HOLDERS: usize = 65_536;
/// Queries of one `Subscribe` stream being answered at once; one more is answered at once with
/// an empty `Match` (counted, reason `subscribe_overloaded`): SMG's gateway waits 2 ms and
/// routes on load without an answer anyway.
pub const MAX_QUERIES_IN_FLIGHT: usize = 64;
/// Answers (acks, matches) buffered for a slow reader; past it they are dropped and counted,
/// as upstream drops them (both are advisory, and late answers are dropped by the gateway).
pub const OUT_BUFFER: usize = 1_024;
/// Largest message decoded; a larger one ends its stream with RESOURCE_EXHAUSTED.
pub const MAX_MESSAGE_BYTES: usize = 8 << 20;
/// `Publish` and `Subscribe` streams open at once on a replica; one more is refused with
/// RESOURCE_EXHAUSTED (counted, reason `streams_full`). Idle streams count: one that never
/// sends holds its place until its client or connection goes (keepalive finds dead ones).
pub const MAX_STREAMS: usize = 256;

/// A status read from a client stream, in the codes this facade promises: tonic reads a
/// message over [`MAX_MESSAGE_BYTES`] as OUT_OF_RANGE, the gRPC convention says
/// RESOURCE_EXHAUSTED.
pub fn inbound_status(s: tonic::Status) -> tonic::Status {
    if s.code() == tonic::Code::OutOfRange && s.message().contains("message length too large") {
        return tonic::Status::resource_exhausted(s.message().to_string());
    }
    s
}
