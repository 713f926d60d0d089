//! The `prefixlog-lab` binary: the demo and the benchmarks, apart from the server binary so
//! that `prefixlog` is what runs in production. Every benchmark starts its replicas the one
//! way (`prefixlog_node::ReplicaNode`) and reports ratios measured in one run.
//!
//! - `demo`: broker, two replicas, gateways and a simulated fleet in one process (`make demo`).
//! - `bench-routing`: prefix-hit ratio of shared index vs gateway-local trees vs oracle, 1..16
//!   gateways.
//! - `bench-ingest`: Kafka → apply throughput next to raw consume throughput.
//! - `bench-query`: Match latency over gRPC (idle, ingesting) next to an Echo RPC, unary and
//!   streamed.
//! - `bench-audit`: reconstructing a past point vs a full replay.
//! - `bench-restart`: restart from checkpoint + tail vs full replay.
//! - `bench-shards`: memory per replica with N shards, fan-out Match latency vs unsharded.
//! - `bench-fleet`: one replica under a fleet's load (2,048 workers publishing, gateways at
//!   1,024 queries in flight): apply vs raw consume, query latency, lag, CPU per 1,000 queries.
//! - `bench-rounds`: a replica process's RSS over rounds of new content (is memory released?).
//! - `bench-scale`: a replica process holding a fleet past Dynamo's INDEXER_BENCH (224,000
//!   effective workers): memory per holder-block, closed- and open-loop query latency.
//! - `bench-facades`: open-loop answer latency through gRPC, the SMG facade and the SGLang
//!   facade at once, while a replica process ingests and once caught up.
//! - `load-http`: an HTTP/1.1 load generator (closed or open loop) for side-by-side `/query`
//!   comparisons with other indexers (`tests/upstream/bench_dynamo.py`).
//!
//! Modules: [`bench_env`] (what the Kafka benchmarks share: a topic, a publisher, replicas),
//! [`client_thread`] (the measuring client's own thread), [`replica_process`] (a replica as a
//! process of its own),
//! one module per benchmark, [`stream_bench`] (the `MatchStream` half of `bench-query`), and
//! [`demo`].

mod bench_audit;
mod bench_env;
mod bench_facades;
mod bench_fleet;
mod bench_ingest;
mod bench_restart;
mod bench_rounds;
mod bench_scale;
mod bench_shards;
mod client_thread;
mod demo;
mod load_http;
mod query_bench;
mod replica_process;
mod stream_bench;

use clap::{Parser, Subcommand};
use prefixlog::process::{self, ProcessArgs};

#[derive(Parser)]
#[command(
    name = "prefixlog-lab",
    version,
    about = "prefixlog's demo and benchmarks",
    long_about = "The demo (`prefixlog-lab demo`, what `make demo` runs) and the benchmarks of \
prefixlog. Each benchmark prints its command, date and ratios measured in one run; \
docs/benchmarks.md records the current numbers."
)]
struct Cli {
    #[command(flatten)]
    process: ProcessArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The demo: embedded broker, two replicas, gateways routing a simulated fleet by the index.
    Demo(demo::Args),
    /// Routing quality: shared index vs gateway-local trees vs oracle, 1..16 gateways (in-process).
    BenchRouting(demo::routing_sim::Args),
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
    /// One replica under a fleet's load: workers publishing at full speed while gateways keep
    /// queries in flight; apply vs raw consume, query latency, lag, CPU per 1,000 queries.
    BenchFleet(bench_fleet::Args),
    /// A replica process's RSS after each of several hours of new content (the workers' caches
    /// evicting the hour before): is memory released?
    BenchRounds(bench_rounds::Args),
    /// A replica process holding a fleet past Dynamo's INDEXER_BENCH (e.g. 224,000 effective
    /// workers): memory per holder-block, closed-loop queries/s, open-loop latency quantiles.
    BenchScale(bench_scale::Args),
    /// Answer latency through gRPC `MatchStream`, the SMG facade and the SGLang facade at once,
    /// open loop, while a replica process ingests and once it has caught up.
    BenchFacades(bench_facades::Args),
    /// Post request bodies to an HTTP endpoint, closed loop or at a fixed rate, and report
    /// queries/s and latency quantiles (one JSON line on stdout).
    LoadHttp(load_http::Args),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The demo draws a progress bar and a table: only warnings go to the log by default.
    let default_filter =
        if matches!(cli.cmd, Cmd::Demo(_) | Cmd::LoadHttp(_)) { "warn" } else { "info,rdkafka=warn" };
    let query_cpus = match &cli.cmd {
        Cmd::BenchQuery(a) => a.query_cpus.as_ref(),
        _ => None,
    };
    let rt = process::start(&cli.process, default_filter, query_cpus)?;
    let result = match cli.cmd {
        Cmd::Demo(a) => rt.block_on(demo::run(a)),
        Cmd::BenchRouting(a) => demo::routing_sim::run(a),
        Cmd::BenchIngest(a) => rt.block_on(bench_ingest::run(a)),
        Cmd::BenchQuery(a) => rt.block_on(query_bench::run(a)),
        Cmd::BenchAudit(a) => rt.block_on(bench_audit::run(a)),
        Cmd::BenchRestart(a) => rt.block_on(bench_restart::run(a)),
        Cmd::BenchShards(a) => rt.block_on(bench_shards::run(a)),
        Cmd::BenchFleet(a) => rt.block_on(bench_fleet::run(a)),
        Cmd::BenchRounds(a) => rt.block_on(bench_rounds::run(a)),
        Cmd::BenchScale(a) => rt.block_on(bench_scale::run(a)),
        Cmd::BenchFacades(a) => rt.block_on(bench_facades::run(a)),
        Cmd::LoadHttp(a) => rt.block_on(load_http::run(a)),
    };
    process::finish(result)
}
