//! The `prefixlog` binary: one CLI, one subcommand per job.
//!
//! - `serve`: run an index replica (embedded broker when no `--brokers`).
//! - `replay`: publish the trace workload's KV events to a log.
//! - `bridge`: vLLM / SGLang KV events over ZeroMQ → the log (one process, several engines).
//! - `bench-ingest`: Kafka → apply throughput next to raw consume throughput.
//! - `bench-query`: Match latency over gRPC (idle, ingesting) next to an Echo RPC.
//! - `bench-audit`: reconstructing a past point vs a full replay.
//! - `bench-restart`: restart from checkpoint + tail vs full replay.
//! - `bench-shards`: memory per replica with N shards, fan-out Match latency vs unsharded.
//! - `audit`: the index state at a past time or offsets, explain a placement, diff, verify.
//! - `checkpoints`: list, show and verify a replica's RocksDB checkpoints.
//! - `demo`: broker, two replicas, gateways and a simulated fleet in one process (README's `make demo`).
//! - `bench-routing`: prefix-hit ratio of shared index vs gateway-local trees vs oracle, 1..16 gateways.

mod audit_cmd;
mod bench_audit;
mod bench_env;
mod bench_ingest;
mod bench_restart;
mod bench_shards;
mod bridge_cmd;
mod checkpoints_cmd;
mod demo;
mod epp_args;
mod fleet_records;
mod kafka_args;
mod query_bench;
mod replay;
mod serve;
mod stream_bench;

use clap::{Parser, Subcommand};

/// How log lines are written.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (log shippers).
    Json,
}

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
    /// Log line format. The level is set by RUST_LOG (e.g. RUST_LOG=debug).
    #[arg(long, global = true, env = "PREFIXLOG_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run an index replica: consume its partitions, apply, checkpoint, answer queries.
    Serve(Box<serve::Args>),
    /// Publish the trace workload (a simulated fleet's KV events) to the log.
    Replay(replay::Args),
    /// Bridge vLLM / SGLang KV events (ZeroMQ) into the log: one process, one or more engines.
    Bridge(bridge_cmd::Args),
    /// Measure Kafka → apply throughput against raw consume throughput (embedded broker).
    BenchIngest(bench_ingest::Args),
    /// Measure Match latency over gRPC, idle and while ingesting, next to an Echo RPC (embedded broker).
    BenchQuery(query_bench::Args),
    /// Measure reconstructing a past point from checkpoints against a full replay.
    BenchAudit(bench_audit::Args),
    /// Measure time to ready from a checkpoint + tail against a full replay (embedded broker).
    BenchRestart(bench_restart::Args),
    /// Measure memory per replica with N shards and the fan-out Match latency (embedded broker).
    BenchShards(bench_shards::Args),
    /// Reconstruct past index state from checkpoints + log replay; explain routing decisions.
    Audit(audit_cmd::Args),
    /// Inspect a replica's checkpoints: list, show, verify.
    Checkpoints(checkpoints_cmd::Args),
    /// The demo: embedded broker, two replicas, gateways routing a simulated fleet by the index.
    Demo(demo::Args),
    /// Routing quality: shared index vs gateway-local trees vs oracle, 1..16 gateways (in-process).
    BenchRouting(demo::routing_sim::Args),
}

impl Cmd {
    /// The CPUs the whole process is pinned to before its runtime starts (`--query-cpus`).
    fn query_cpus(&self) -> Option<&prefixlog_ingest::CpuSet> {
        match self {
            Cmd::Serve(a) => a.query_cpus.as_ref(),
            Cmd::BenchQuery(a) => a.query_cpus.as_ref(),
            _ => None,
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The demo draws a progress bar and a table: only warnings go to the log by default.
    let default_filter = if matches!(cli.cmd, Cmd::Demo(_)) { "warn" } else { "info,rdkafka=warn" };
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default_filter.into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => logs.json().init(),
    }
    // Before the runtime exists: its threads, and every thread started later, inherit the set.
    if let Some(cpus) = cli.cmd.query_cpus() {
        cpus.pin_current_thread()
            .map_err(|e| anyhow::anyhow!("--query-cpus {cpus}: cannot run on these CPUs: {e}"))?;
        tracing::info!(cpus = %cpus, "pinned the process to --query-cpus (the ingest thread re-pins to --ingest-cpus if set)");
    }
    let rt = tokio::runtime::Runtime::new()?;
    let result = match cli.cmd {
        Cmd::Serve(a) => rt.block_on(serve::run(*a)),
        Cmd::Replay(a) => rt.block_on(replay::run(a)),
        Cmd::Bridge(a) => rt.block_on(bridge_cmd::run(a)),
        Cmd::BenchIngest(a) => rt.block_on(bench_ingest::run(a)),
        Cmd::BenchQuery(a) => rt.block_on(query_bench::run(a)),
        Cmd::Checkpoints(a) => checkpoints_cmd::run(a),
        Cmd::Audit(a) => audit_cmd::run(a),
        Cmd::BenchRestart(a) => rt.block_on(bench_restart::run(a)),
        Cmd::BenchAudit(a) => rt.block_on(bench_audit::run(a)),
        Cmd::BenchShards(a) => rt.block_on(bench_shards::run(a)),
        Cmd::Demo(a) => rt.block_on(demo::run(a)),
        Cmd::BenchRouting(a) => demo::routing_sim::run(a),
    };
    // Replays and probes close their Kafka clients in the background: none may be mid-destroy
    // when the process exits.
    prefixlog_ingest::log_spec::wait_for_closing_clients();
    result
}
