//! The `prefixlog` binary: the server and the operator's tools, one subcommand per job. The
//! demo and the benchmarks are the `prefixlog-lab` binary (crate `lab/`).
//!
//! - `serve`: run an index replica (embedded broker when no `--brokers`).
//! - `bridge`: vLLM / SGLang KV events over ZeroMQ → the log (one process, several engines).
//! - `lmcache-bridge`: LMCache's Kafka cache-event stream → the log (each instance's chunks).
//! - `audit`: the index state at a past time or offsets, explain a placement, diff, verify.
//! - `checkpoints`: list, show and verify a replica's RocksDB checkpoints.
//! - `publish-trace`: publish the trace workload's KV events to a log (load for a deployment).

/// jemalloc, with background threads purging pages freed for 1 s: memory freed after a burst
/// (large HTTP bodies, message buffers) goes back to the system. Under glibc's malloc a burst of
/// 32 × 7 MiB bodies left RSS 136 MiB higher for good (docs/operations.md, Security).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read at its start (overridden by `_RJEM_MALLOC_CONF` in the environment).
#[allow(non_upper_case_globals)]
#[export_name = "_rjem_malloc_conf"]
pub static malloc_conf: &[u8] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:1000\0";

mod audit_cmd;
mod bridge_cmd;
mod checkpoints_cmd;
mod epp_args;
mod lmcache_cmd;
mod serve;

use clap::{Parser, Subcommand};

use prefixlog::process::{self, ProcessArgs};
use prefixlog::publish_trace;

#[derive(Parser)]
#[command(
    name = "prefixlog",
    version,
    about = "A shared, replicated prefix-cache index for LLM inference routing",
    long_about = "prefixlog keeps one exact index of which inference worker holds which KV-cache blocks. \
Bridges and gateways append KV events and placements to Kafka (partitioned by worker); every replica \
applies them deterministically and answers longest-prefix queries.\n\nRun `prefixlog serve` with no \
arguments for a self-contained replica on an embedded broker."
)]
struct Cli {
    #[command(flatten)]
    process: ProcessArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run an index replica: consume its partitions, apply, checkpoint, answer queries.
    Serve(Box<serve::Args>),
    /// Bridge vLLM / SGLang KV events (ZeroMQ) into the log: one process, one or more engines.
    Bridge(bridge_cmd::Args),
    /// Bridge LMCache's Kafka cache-event stream (KafkaCacheEventSink) into the log: each
    /// instance's chunks on its worker's host / disk / external tiers.
    LmcacheBridge(lmcache_cmd::Args),
    /// Reconstruct past index state from checkpoints + log replay; explain routing decisions.
    Audit(audit_cmd::Args),
    /// Inspect a replica's checkpoints: list, show, verify.
    Checkpoints(checkpoints_cmd::Args),
    /// Publish the trace workload (a simulated fleet's KV events) to the log. `replay` is its
    /// older name, still accepted.
    #[command(alias = "replay")]
    PublishTrace(publish_trace::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let query_cpus = match &cli.cmd {
        Cmd::Serve(a) => a.query_cpus.as_ref(),
        _ => None,
    };
    let rt = process::start(&cli.process, "info,rdkafka=warn", query_cpus)?;
    let result = match cli.cmd {
        Cmd::Serve(a) => rt.block_on(serve::run(*a)),
        Cmd::Bridge(a) => rt.block_on(bridge_cmd::run(a)),
        Cmd::LmcacheBridge(a) => rt.block_on(lmcache_cmd::run(a)),
        Cmd::Audit(a) => audit_cmd::run(a, rt.handle()),
        Cmd::Checkpoints(a) => checkpoints_cmd::run(a),
        Cmd::PublishTrace(a) => rt.block_on(publish_trace::run(a)),
    };
    process::finish(result)
}
