//! prefixlog's schemas, generated at build time from `proto/*.proto` with prost (and tonic for
//! the service), compiled by the pure-Rust `protox` so no `protoc` is needed.
//!
//! Module map:
//! - [`v1`]: log records (`records.proto`: what bridges and gateways append to Kafka) and the
//!   query service (`query.proto`: `PrefixIndex`, and the `Echo` benchmark baseline).
//!   `peer.proto`: `ReplicaPeer`, replica to replica (digests, checkpoint transfer).
//! - [`codec`]: the gRPC codec every generated client and server uses (prost on the wire, one
//!   slice per message in memory).
//! - [`match_wire`]: `MatchResponse` encoded and decoded by hand for its score list (the same
//!   bytes as prost, checked against it), the codec's fast path for the largest hot message.
//! - [`FILE_DESCRIPTOR_SET`]: every schema, encoded, for gRPC server reflection.

pub mod codec;
pub mod match_wire;

/// Version 1 of the log schema.
pub mod v1 {
    #![allow(clippy::all)]
    tonic::include_proto!("prefixlog.v1");
}

/// The record schema version this build writes and understands.
pub const RECORD_VERSION: u32 = 1;

/// The encoded `FileDescriptorSet` of every `.proto` file (for `tonic-reflection`).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/prefixlog_descriptor.bin"));
