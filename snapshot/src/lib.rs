//! Checkpoints: a replica's full state and the log offsets it covers, in RocksDB.
//!
//! A restart loads the newest checkpoint that verifies and can stand for this replica (the one
//! compatibility rule, `prefixlog_state::check_compatible`: same cluster, topic, partitions,
//! state settings, and the partitions it needs), checks that the log still continues its
//! offsets, and replays only the tail (Kafka Streams' state store + checkpointed offsets, with
//! the state itself as the checkpoint).
//!
//! Module map:
//! - [`store`]: [`CheckpointStore`]: atomic writes (one `WriteBatch`), checksummed reads,
//!   listing, retention (last K + a thinned series over a log-time window), readers beside a
//!   live replica (RocksDB secondary).
//! - [`capture`]: [`Capture`], a consistent copy of a running replica's state taken without
//!   stalling queries; [`KeyspaceImage`].
//! - [`checkpoint`]: a capture written to the store; restore an applier with the
//!   checkpoint's settings; choose the newest usable; partition-filtered exports.
//! - [`handle`]: the RocksDB handle and what a replica's store does when its disk fails it
//!   (read-only on a full disk, reopened after a failed write, moved aside when damaged).
//! - [`stream`]: a stored checkpoint's export streamed in bounded pieces, verified on the way
//!   ([`CheckpointStore::export_to`]: a peer's checkpoint transfer).
//! - [`checkpoint_meta`]: [`CheckpointMeta`] (identity, offsets, log times, checksums) and
//!   [`KeyspaceEntry`], the types; [`meta`]: their encoding in this build's format.
//! - [`export`]: a checkpoint as one verified byte string for transfer; [`Loaded`].
//! - [`format`]: the checkpoint formats this build writes ([`FORMAT_VERSION`]) and reads.
//! - [`error`]: [`StoreError`] with the damaged [`Part`] and the [`Damage`].
//! - `pages`: fresh buffers mapped in one call before a bulk write (capture, restore read).
//! - [`codec`]: metas and partition states as serde types in postcard, with the typed
//!   [`decode_error::DecodeError`] it shares with [`upgrade`] (keyspaces are engine images:
//!   `prefixlog_engine::persist::image`).
//! - [`upgrade`]: reading the formats before it (2 to 5: hand-laid metas and partition values,
//!   format-2 columnar dumps), so an upgraded replica still restores older checkpoints.

pub mod capture;
pub mod checkpoint;
pub mod checkpoint_meta;
pub mod codec;
pub mod decode_error;
pub mod error;
pub mod export;
pub mod format;
pub mod handle;
pub mod meta;
mod pages;
pub mod store;
pub mod stream;
pub mod upgrade;

pub use capture::{capture, capture_sound, Capture, KeyspaceImage};
pub use checkpoint::{checkpoint, export_partitions, newest_usable, restore, restore_for, RestoreError};
pub use error::{Damage, Part, StoreError};
pub use export::{
    decode_export, encode_export, KeyspaceRestoreError, Loaded, LoadedKeyspace, StoredKeyspace, VerifiedImage,
};
pub use format::{FORMAT_VERSION, READABLE_FORMATS};
pub use handle::Opened;
pub use meta::{CheckpointMeta, KeyspaceEntry};
pub use store::{CheckpointStore, Retention, StoreHealth};
pub use stream::{ExportSink, Streamed};
