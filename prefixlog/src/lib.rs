//! What the two binaries share: `prefixlog` (the server and the operator's tools) and
//! `prefixlog-lab` (the demo and the benchmarks, crate `lab/`).
//!
//! Module map:
//! - [`kafka_args`]: the Kafka and state-settings flags, turned into a `prefixlog_ingest::LogSpec`.
//! - [`fleet_records`]: the trace workload (a simulated fleet) as encoded log records.
//! - [`publish_trace`]: publishing those records, each worker's in order (`publish-trace`).
//! - [`process`]: how a process starts and ends ([`process::start`], [`process::finish`]): log
//!   format and filter, `--query-cpus` pinning before the runtime exists, waiting for Kafka
//!   clients closing in the background.
//! - [`engine_feeds`]: the engine feeds the Dynamo HTTP facade's `/register` runs (the bridge's
//!   engine stream).

pub mod engine_feeds;
pub mod fleet_records;
pub mod kafka_args;
pub mod process;
pub mod publish_trace;
