//! `prefixlog-lab bench-rounds`: is memory released? (issue 51: Dynamo's frontend grows from
//! 425 to 1,582 MiB over five rounds of the same load and never gives it back, dynamo#11933).
//!
//! One replica, a separate `prefixlog serve` process so that its RSS is its own (the broker,
//! the publisher and the gateways stay in this process), is fed `--rounds` hours of the trace
//! workload: every hour new content (fresh block hashes) that the simulated workers' LRU caches
//! take in by evicting the hour before, so the index holds about one hour's worth at any time.
//! After each hour is applied (a query carrying the publisher's token is answered), the
//! gateways send `--queries` of that hour's queries (top_k 8), and the replica's RSS is read
//! from `/proc`. The run
//! ends with one line: `rounds: RSS after round N X.XXx round 1 (max X.XXx), ...`.

use crate::bench_env::{token, workload_queries_by_hour, BenchLog};
use crate::bench_fleet::items_of;
use crate::client_thread::ClientThread;
use crate::replica_process::{replica_bin, ReplicaProcess};
use crate::stream_bench::{drive, Until};
use prefixlog::fleet_records::{fleet_records, FleetRecord, WorkloadArgs};
use prefixlog_proto::v1::PartitionOffset;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Hours of load, each of new content.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(2..=24))]
    pub rounds: u64,
    /// Gateway queries after each round is applied.
    #[arg(long, default_value_t = 50_000)]
    pub queries: usize,
    /// Queries the gateways keep in flight.
    #[arg(long, default_value_t = 256)]
    pub in_flight: usize,
    /// The replica binary (default: `prefixlog` beside this program).
    #[arg(long, env = "PREFIXLOG_BIN")]
    pub replica_bin: Option<PathBuf>,
}

/// What one round left behind.
struct Round {
    records: usize,
    apply_secs: f64,
    rss_mib: f64,
    /// The anonymous part of it (heap and stacks: what the index's growth shows in, without
    /// the binary's and libraries' pages).
    anon_mib: f64,
    queries_per_sec: f64,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let bin = replica_bin(a.replica_bin.as_deref())?;
    let client = ClientThread::start()?;
    let env = BenchLog::start(&a.log, "prefixlog.bench-rounds").await?;
    let rounds = a.rounds as usize;
    let records = fleet_records(&a.workload, rounds)?;
    let period = prefixlog_workload::repeat_period_ms(&prefixlog_workload::load_trace(&a.workload.trace)?);
    let hours = by_hour(&records, rounds, period);
    let queries = workload_queries_by_hour(&a.workload, Some(8), rounds)?;
    anyhow::ensure!(queries.len() == rounds, "{} hours of queries for {rounds} rounds", queries.len());
    let data = tempfile::tempdir()?;
    let mut replica = ReplicaProcess::start(&bin, &env, data.path(), &[])?;
    println!(
        "rounds: {} workers, {} hours of new content, {} records; replica {} (pid {}); {} queries per round, {} in flight",
        a.workload.workers,
        rounds,
        records.len(),
        bin.display(),
        replica.child.id(),
        a.queries,
        a.in_flight
    );
    let mut done = Vec::new();
    let mut from = 0usize;
    for (hour, queries) in hours.into_iter().zip(&queries) {
        let t = Instant::now();
        // Not `BenchLog::publish`: the embedded broker's retention may drop the rounds the
        // replica has applied (a round it has not would show as a gap, and no answer below).
        let landed =
            prefixlog::publish_trace::publish_by_worker(&env.publisher, items_of(hour, from)).await?;
        from += hour.len();
        replica.wait_for(&landed_token(&landed), &queries[0], Duration::from_secs(600)).await?;
        let apply_secs = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let (ep, qs) = (replica.endpoint.clone(), queries.clone());
        let driven = client.run(drive(ep, qs, a.in_flight, 8, Until::Asked(a.queries))).await??;
        anyhow::ensure!(driven.failed == 0, "{} of {} queries failed", driven.failed, a.queries);
        let queries_per_sec = driven.answered as f64 / t.elapsed().as_secs_f64();
        let (rss_mib, anon_mib) = (replica.status_mib("VmRSS")?, replica.status_mib("RssAnon")?);
        println!(
            "round {}: {} records applied in {apply_secs:.2} s, {queries_per_sec:.0} queries/s, RSS {rss_mib:.1} MiB (anonymous {anon_mib:.1})",
            done.len() + 1,
            hour.len()
        );
        done.push(Round { records: hour.len(), apply_secs, rss_mib, anon_mib, queries_per_sec });
    }
    drop(replica);
    env.finish().await;
    print_table(&done);
    Ok(())
}

fn print_table(done: &[Round]) {
    let first = done[0].rss_mib;
    let first_anon = done[0].anon_mib;
    println!(
        "\n| round | records | applied in (s) | queries/s | RSS (MiB) | RSS / round 1 | anonymous / round 1 |\n|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (i, r) in done.iter().enumerate() {
        println!(
            "| {} | {} | {:.2} | {:.0} | {:.1} | {:.2} | {:.2} |",
            i + 1,
            r.records,
            r.apply_secs,
            r.queries_per_sec,
            r.rss_mib,
            r.rss_mib / first,
            r.anon_mib / first_anon
        );
    }
    let last = done.last().expect("at least two rounds");
    let max = done.iter().map(|r| r.rss_mib / first).fold(0.0, f64::max);
    let max_anon = done.iter().map(|r| r.anon_mib / first_anon).fold(0.0, f64::max);
    println!(
        "\nrounds: RSS after round {} {:.2}x round 1 (max {max:.2}x), {:.1} MiB after round 1; anonymous {:.2}x (max {max_anon:.2}x)",
        done.len(),
        last.rss_mib / first,
        first,
        last.anon_mib / first_anon
    );
}

/// The records of each repetition of the trace (`period` ms of trace time apart:
/// `repeat_period_ms`, an hour for the bundled trace).
fn by_hour(records: &[FleetRecord], rounds: usize, period: u64) -> Vec<&[FleetRecord]> {
    let mut out = Vec::with_capacity(rounds);
    let mut rest = records;
    for h in 1..rounds as u64 {
        let n = rest.partition_point(|r| r.time_ms < h * period);
        let (this, after) = rest.split_at(n);
        out.push(this);
        rest = after;
    }
    out.push(rest);
    out
}

pub(crate) fn landed_token(landed: &[prefixlog_state::Landed]) -> Vec<PartitionOffset> {
    token(landed).into_iter().map(|t| PartitionOffset { partition: t.partition, offset: t.offset }).collect()
}
