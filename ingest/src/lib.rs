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
//! - [`connect`]: what the linked librdkafka supports (TLS, SASL, codecs) and
//!   [`connect::ConnectErrors`], the client context that names why a connection failed.
//! - [`probe`]: cluster id, partition count and watermarks of a log; [`probe::check_topic`],
//!   the publishers' start-up check.
//! - [`topics`]: create and delete a topic, add partitions (benchmarks, tests; replicas never
//!   do).
//! - [`continuity`]: does the log still continue a state's offsets (start-up check); what a
//!   hole in the log is made of.
//! - [`reader`]: [`LogReader`], the one consumer: offset order, gaps and out-of-range offsets
//!   become [`reader::Discontinuity`], never a silent reset.
//! - [`apply_log`]: applying the log up to a fixed target (audits, repairs, benchmarks).
//! - [`record`]: encode (publishers) and decode/validate (replicas) records; [`BadReason`].
//! - [`partition_state`]: per-partition applied state (offsets, log time, feeds, workers,
//!   counters), digest points, and [`partition_state::record_mark`], the fingerprint of the
//!   record a state ends at.
//! - [`limits`]: what a record may create per partition ([`limits::admit`]), and each
//!   partition's derived [`limits::Usage`].
//! - [`apply`]: the deterministic [`Applier`].
//! - [`publisher`]: idempotent keyed producer; [`Landed::token`] gives consistency tokens.
//! - [`affinity`]: [`CpuSet`], pinning the ingest thread (and its consumer's threads) to CPUs.
//! - [`replica`]: the ingest thread (a panic applying one record halts that partition),
//!   partition replacement for repair and recovery.
//! - [`status`]: [`ReplicaStatus`] (offsets, lag, discontinuities, apply failures, log holes,
//!   observed partition count, broker contact, read-your-writes waits).
//! - [`watermarks`]: the watermark thread: lag, rewinds, the topic's partition count, broker
//!   contact.
//! - [`dead_letter`]: the optional copy of refused records to a dead-letter topic.
//! - [`embedded`]: librdkafka's mock cluster as the zero-setup broker.
//! - `testing` (feature `testing`, tests only): make applying chosen records panic.
//! - [`bridge`]: vLLM / SGLang KV events over ZeroMQ (both msgpack layouts) → KV event records:
//!   sequence gaps, replay, epochs, canonical local hashes, counters (labelled families), the
//!   worker's naming for gateways (serving URL, pod), and the refusal of engine sets that would
//!   publish one stream twice.

pub mod affinity;
pub mod apply;
pub mod apply_log;
pub mod bridge;
pub mod connect;
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
pub mod replica;
pub mod settings;
pub mod status;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod topics;
pub mod watermarks;

pub use affinity::CpuSet;
pub use apply::{Applier, ApplyFailure, NotNext, Outcome};
pub use apply_log::{apply_log, ApplyLogError, ApplyLogOptions, Until};
pub use embedded::EmbeddedKafka;
pub use identity::{check_compatible, Incompatible, LogIdentity};
pub use log_spec::{ClientRole, KafkaConnection, LogSpec, Shard, ShardError};
pub use partition_state::{DigestPoint, PartitionState};
pub use probe::{check_topic, cleanup_policy, probe_log, CleanupPolicy, LogProbe, ProbeError, Watermarks};
pub use publisher::{token_of, Landed, PublishError, Publisher};
pub use reader::{Discontinuity, LogReader};
pub use record::{BadReason, KvBatch, KvOp, LaneMeta, Lifecycle, Op};
pub use replica::{GapPolicy, IngestOptions, Replica, ReplicaError};
pub use settings::StateSettings;
pub use status::{HoleCause, LogHole, ReplicaStatus};
pub use topics::{add_partitions, create_topic, delete_topic, TopicError};
