//! The log: what a log is, its records, publishing, reading it with continuity checks, and
//! applying it deterministically.
//!
//! A record's path through a replica: Kafka → [`reader::LogReader`] (offset order, continuity
//! checked) → [`replica`] (the ingest thread) → [`apply::Applier`] (decode + validate with
//! [`record`], dedupe per feed, apply) → `prefixlog_engine::Engine`.
//!
//! Module map:
//! - [`log_spec`]: [`LogSpec`] (connection, topic, partitions, shard, settings) and
//!   [`KafkaConnection::client_config`], the one place every Kafka client is configured.
//! - [`settings`]: [`StateSettings`], the settings that decide applied state.
//! - [`identity`]: [`LogIdentity`] and [`check_compatible`], the one compatibility rule
//!   (cluster, topic, partitions, settings, covered partitions) for checkpoints and peers.
//! - [`probe`]: cluster id, partition count and watermarks of a log.
//! - [`topics`]: create and delete a topic (benchmarks, tests; replicas never do).
//! - [`continuity`]: does the log still continue a state's offsets (start-up check).
//! - [`reader`]: [`LogReader`], the one consumer: offset order, gaps and out-of-range offsets
//!   become [`reader::Discontinuity`], never a silent reset.
//! - [`replay`]: bounded replay to a fixed target (audits, repairs, benchmarks).
//! - [`record`]: encode (publishers) and decode/validate (replicas) records; [`BadReason`].
//! - [`partition_state`]: per-partition applied state (offsets, log time, feeds, workers,
//!   counters) and digest points.
//! - [`limits`]: what a record may create per partition ([`limits::admit`]), and each
//!   partition's derived [`limits::Usage`].
//! - [`apply`]: the deterministic [`Applier`].
//! - [`publisher`]: idempotent keyed producer; [`Landed::token`] gives consistency tokens.
//! - [`affinity`]: [`CpuSet`], pinning the ingest thread (and its consumer's threads) to CPUs.
//! - [`replica`]: the ingest thread, [`ReplicaStatus`] (offsets, lag, discontinuities,
//!   read-your-writes waits), partition replacement for repair and recovery.
//! - [`dead_letter`]: the optional copy of refused records to a dead-letter topic.
//! - [`embedded`]: librdkafka's mock cluster as the zero-setup broker.
//! - [`bridge`]: vLLM / SGLang KV events over ZeroMQ (both msgpack layouts) → KV event records:
//!   sequence gaps, replay, epochs, canonical local hashes, counters, and the refusal of engine
//!   sets that would publish one stream twice.

pub mod affinity;
pub mod apply;
pub mod bridge;
pub mod continuity;
pub mod dead_letter;
pub mod embedded;
pub mod identity;
pub mod limits;
pub mod log_spec;
pub mod partition_state;
pub mod probe;
pub mod publisher;
pub mod reader;
pub mod record;
pub mod replay;
pub mod replica;
pub mod settings;
pub mod topics;

pub use affinity::CpuSet;
pub use apply::{Applier, NotNext, Outcome};
pub use embedded::EmbeddedKafka;
pub use identity::{check_compatible, Incompatible, LogIdentity};
pub use log_spec::{ClientRole, KafkaConnection, LogSpec, Shard, ShardError};
pub use partition_state::{DigestPoint, PartitionState};
pub use probe::{cleanup_policy, probe_log, CleanupPolicy, LogProbe, ProbeError, Watermarks};
pub use publisher::{token_of, Landed, PublishError, Publisher};
pub use reader::{Discontinuity, LogReader};
pub use record::{BadReason, KvBatch, KvOp, LaneMeta, Lifecycle, Op};
pub use replay::{replay, ReplayError, ReplayOptions, Until};
pub use replica::{GapPolicy, IngestOptions, Replica, ReplicaError, ReplicaStatus};
pub use settings::StateSettings;
pub use topics::{create_topic, delete_topic, TopicError};
