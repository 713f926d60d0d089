//! The log: records, publishers, and the replica's ingest loop.
//!
//! A record's path through a replica: Kafka → [`replica`] (one thread, all partitions, offset
//! order) → [`apply::Applier`] (decode + validate with [`record`], dedupe per feed, apply to
//! the engine) → `prefixlog_engine::Engine`.
//!
//! Module map:
//! - [`record`]: encode (publishers) and decode/validate (replicas) the protobuf records;
//!   [`record::BadReason`].
//! - [`apply`]: the deterministic applier: per-partition offsets, log time, feed dedupe/epoch/gap
//!   policy, placement expiry by log time, per-partition digests.
//! - [`publisher`]: idempotent keyed producer returning (partition, offset) tokens.
//! - [`replica`]: the Kafka consumer loop and [`replica::ReplicaStatus`] (offsets, lag,
//!   read-your-writes waits).
//! - [`dead_letter`]: the optional copy of refused records to a dead-letter topic.
//! - [`embedded`]: librdkafka's mock cluster as the zero-setup broker.
//! - [`bridge`]: vLLM / SGLang KV events over ZeroMQ (both msgpack layouts) → KV event records:
//!   sequence gaps, replay, epochs, canonical local hashes, counters.

pub mod apply;
pub mod bridge;
pub mod dead_letter;
pub mod embedded;
pub mod publisher;
pub mod record;
pub mod replica;

pub use apply::{Applier, ApplyConfig, Outcome};
pub use embedded::EmbeddedKafka;
pub use publisher::{Landed, PublishError, Publisher, PublisherConfig};
pub use record::{BadReason, KvBatch, KvOp, LaneMeta, Lifecycle, Op};
pub use replica::{probe_log, LogProbe, Replica, ReplicaConfig, ReplicaError, ReplicaStatus};
