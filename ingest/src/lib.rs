//! The Kafka edge: the log as Kafka holds it. Connecting, probing, publishing, reading with
//! continuity checks, bounded replays, and the dead-letter copy of refused records. The
//! replica's ingest thread, which hands records to the deterministic
//! [`prefixlog_state::Applier`], is `prefixlog_node::ingest_thread`.
//!
//! A record's path through a replica: Kafka → [`reader::LogReader`] (offset order, continuity
//! checked) → the ingest thread (`prefixlog_node`) → `prefixlog_state::Applier` (decode +
//! validate, dedupe per feed, apply) → `prefixlog_engine::Engine`.
//!
//! Module map:
//! - [`log_spec`]: [`LogSpec`] (connection, topic, partitions, shard, settings) and
//!   [`KafkaConnection::client_config`], the one place every Kafka client is configured.
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
//! - [`leader_watch`]: after a broker failure, the reader looks the leaders up every 10 ms, so
//!   it follows a newly elected leader as fast as a publisher does.
//! - [`apply_log`]: applying the log up to a fixed target (audits, repairs, benchmarks).
//! - [`publisher`]: idempotent keyed producer; `prefixlog_ids::Landed::token` gives consistency tokens.
//! - [`affinity`]: [`CpuSet`], pinning the ingest thread (and its consumer's threads) to CPUs.
//! - [`dead_letter`]: the optional copy of refused records to a dead-letter topic.
//! - [`embedded`]: librdkafka's mock cluster as the zero-setup broker.

pub mod affinity;
pub mod apply_log;
pub mod connect;
pub mod continuity;
pub mod dead_letter;
pub mod embedded;
pub mod leader_watch;
pub mod log_spec;
pub mod probe;
pub mod publisher;
pub mod reader;
pub mod topics;

pub use affinity::CpuSet;
pub use apply_log::{apply_log, ApplyLogError};
pub use embedded::EmbeddedKafka;
pub use log_spec::{ClientRole, KafkaConnection, LogSpec, Shard, ShardError};
pub use prefixlog_ids::NextOffset;
pub use probe::{check_topic, cleanup_policy, probe_log, CleanupPolicy, ProbeError};
pub use publisher::{PublishError, Publisher};
pub use reader::{Discontinuity, LogReader};
pub use topics::{add_partitions, create_topic, delete_topic, TopicError};
