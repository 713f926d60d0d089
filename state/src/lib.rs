//! The deterministic core: what a record is and how the log is applied, with no Kafka, no
//! clock, no async runtime, no metrics and no I/O. State is a pure function of the records
//! applied and the state settings. (A running replica's progress and health, which needs all of
//! those, is the serving side's: `prefixlog_query::ReplicaStatus`.)
//!
//! A record's path through this crate: bytes from the log → [`record::decode`] (validate, or
//! refuse with a [`BadReason`]) → [`Applier`] (feed policy per holder, limits, offsets) →
//! `prefixlog_engine::Engine`. The Kafka edge (`prefixlog-ingest`) reads the log and hands the
//! records in; checkpoints, queries, peers and audits use this crate without linking a Kafka
//! client.
//!
//! Module map:
//! - [`record`]: encode (publishers) and decode/validate (replicas) records; [`BadReason`].
//! - [`settings`]: [`StateSettings`], the settings that decide applied state.
//! - [`identity`]: [`LogIdentity`] and [`check_compatible`], the one compatibility rule
//!   (cluster, topic, partitions, settings, covered partitions) for checkpoints and peers.
//! - [`partition_state`]: per-partition applied state (offsets, log time, feeds, workers,
//!   counters), digest points, and [`partition_state::record_mark`], the fingerprint of the
//!   record a state ends at.
//! - [`limits`]: what a record may create per partition ([`limits::admit`]), and each
//!   partition's derived [`limits::Usage`].
//! - [`apply`]: the deterministic [`Applier`].
//! - [`log`]: the log as the layers above the Kafka edge see it: [`LogSource`] (probe, apply up
//!   to a target), [`LiveState`] (a running replica's applier, partition swaps) and [`LogAppend`]
//!   (appending records); and what reading it runs into: [`LogHole`] and its [`HoleCause`],
//!   [`DeadLetterCounts`].
//! - `testing` (feature `testing`, tests only): make applying chosen records panic.
//! - `memory_log` (feature `testing`, tests only): an in-memory log and replica for the layers
//!   above the Kafka edge.

pub mod apply;
pub mod identity;
pub mod limits;
pub mod log;
#[cfg(any(test, feature = "testing"))]
pub mod memory_log;
pub mod partition_state;
pub mod record;
pub mod settings;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use apply::{Applier, ApplyFailure, NotNext, Outcome};
pub use identity::{check_compatible, Incompatible, LogIdentity};
pub use log::{
    ApplyLogOptions, BeforeApply, DeadLetterCounts, HoleCause, LiveState, LogAppend, LogError, LogHole,
    LogProbe, LogSource, OnRecord, Until, Watermarks,
};
pub use partition_state::{DigestPoint, PartitionState};
/// In `prefixlog-ids` so the gateway client can take them without this crate.
pub use prefixlog_ids::{token_of, BlockHashes, Landed, NextOffset, Tier};
pub use record::{BadReason, KvBatch, KvOp, LaneMeta, Lifecycle, Op};
pub use settings::StateSettings;
