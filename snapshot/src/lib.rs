//! Checkpoints: a replica's full state and the log offsets it covers, in RocksDB.
//!
//! A restart loads the newest checkpoint that verifies and belongs to the current log, seeks
//! every partition to its stored offset and replays only the tail (Kafka Streams' state store +
//! checkpointed offsets, with the state itself as the checkpoint).
//!
//! Module map:
//! - [`store`]: [`CheckpointStore`]: atomic writes (one `WriteBatch`), checksummed reads,
//!   listing, retention (last K + a thinned series over a log-time window).
//! - [`checkpoint`]: capture from a running replica without stalling queries; restore an
//!   applier + engine; identity checks (checkpoint of another log → not applied).
//! - [`codec`]: the hand-laid columnar encoding of keyspace dumps and partition states.

pub mod checkpoint;
pub mod codec;
pub mod store;

pub use checkpoint::{capture, checkpoint, incompatibility, newest_usable, restore, Capture};
pub use store::{CheckpointMeta, CheckpointStore, Loaded, LogIdentity, Retention, StoreError};
