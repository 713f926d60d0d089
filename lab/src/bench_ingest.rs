//! `prefixlog-lab bench-ingest`: Kafka → apply throughput next to raw consume throughput, same run,
//! same records.
//!
//! A broker's speed drifts within seconds (tansu's SQLite, a neighbour on a shared machine), and
//! one pass over the log takes 1–2 s, so one raw pass and one apply pass compare two moments as
//! much as two paths. The benchmark alternates them (`--rounds`, raw then apply, each over the
//! whole log) and compares medians; every round is printed too.

use crate::bench_env::{bench_options, BenchLog};
use prefixlog::fleet_records::{fleet_records, keyspace, WorkloadArgs};
use prefixlog_ingest::reader::{LogReader, Read};
use prefixlog_ingest::{NextOffset, Shard};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_workload::quantile::median;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Alternating rounds of raw consume and replica apply, each over the whole log; the ratio
    /// is the median apply rate over the median raw rate.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// The replicas keep two copies of every keyspace (`serve --query-copy`): twice the write
    /// work.
    #[arg(long, env = "PREFIXLOG_BENCH_QUERY_COPY")]
    pub query_copy: bool,
    /// Apply with this many threads: as many shard replicas side by side in this process
    /// (`--shard i/N` each, one ingest thread and one engine each), timed until together they
    /// have applied the whole log. 1 is one unsharded replica.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub apply_threads: u32,
}

/// One pass over the whole log.
pub(crate) struct Pass {
    pub(crate) seconds: f64,
    /// Blocks per second in millions, over the records the pass timed.
    pub(crate) rate: f64,
    /// Records applied before the timer started (the replica's start-up), left out of `rate`.
    untimed: u64,
    /// The replica's start-up (probe, checks, reader); zero for raw consume.
    start_s: f64,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.apply_threads <= a.log.partitions,
        "--apply-threads {} needs at least as many partitions (--partitions {}): each thread is a shard replica owning some",
        a.apply_threads,
        a.log.partitions
    );
    let env = BenchLog::start(&a.log, "prefixlog.bench").await?;
    let records = fleet_records(&a.workload, 1)?;
    let blocks: usize = records.iter().map(|r| r.blocks).sum();
    let publisher = &env.publisher;
    let t = Instant::now();
    let n = prefixlog::publish_trace::publish_all(publisher, &records).await?;
    publisher.flush(Duration::from_secs(60))?;
    let publish_s = t.elapsed().as_secs_f64();
    println!(
        "workload: {n} records, {blocks} blocks ({} keyspace), {} partitions; published in {publish_s:.2} s; \
         applied by {} replica(s) side by side",
        keyspace(),
        a.log.partitions,
        a.apply_threads
    );

    let mut rounds = Vec::new();
    let mut last_hb = 0;
    for _ in 0..a.rounds {
        let raw = raw_consume(&env, n, blocks, a.log.partitions)?;
        let (apply, hb) = replica_apply(&env, n, blocks, a.query_copy, a.apply_threads).await?;
        last_hb = hb;
        rounds.push((raw, apply));
    }
    print_rounds(&rounds, n);
    let raw = median(rounds.iter().map(|r| r.0.rate));
    let apply = median(rounds.iter().map(|r| r.1.rate));
    println!(
        "\napply / raw = {:.2} (median {apply:.2} / median {raw:.2} M blocks/s over {} rounds; target ≥ 0.9); \
         {last_hb} resident holder-blocks after apply",
        apply / raw,
        rounds.len()
    );
    env.finish().await;
    Ok(())
}

/// Every record fetched (by the same reader a replica uses) and its payload touched, nothing
/// applied.
pub(crate) fn raw_consume(env: &BenchLog, n: usize, blocks: usize, partitions: u32) -> anyhow::Result<Pass> {
    let mut reader = LogReader::open(&env.spec, (0..partitions).map(|p| NextOffset::new(p, 0)))?;
    let t = Instant::now();
    let mut got = 0usize;
    while got < n {
        match reader.poll(Duration::from_millis(100)) {
            Read::Record(r) => {
                std::hint::black_box(r.payload().map_or(0, |p| std::hint::black_box(p).len()));
                got += 1;
            }
            Read::Discontinuity(d) => anyhow::bail!("the benchmark log has a gap: {d}"),
            Read::Idle | Read::BrokerError(_) => {}
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    Ok(Pass { seconds, rate: blocks as f64 / seconds / 1e6, untimed: 0, start_s: 0.0 })
}

/// Fresh replicas (no checkpoint; `threads` shard replicas side by side, or one unsharded)
/// consume, decode and apply the whole log, timed from the moment all are up: their start is a
/// fixed cost, not throughput. Records applied during the start are left out of the rate, and
/// the blocks with them in proportion. Returns the pass and the resident holder-blocks after it.
async fn replica_apply(
    env: &BenchLog,
    n: usize,
    blocks: usize,
    query_copy: bool,
    threads: u32,
) -> anyhow::Result<(Pass, u64)> {
    let t = Instant::now();
    let opts = NodeOptions { query_copy, ..bench_options() };
    // Started together, so that no replica applies much of its share while another starts.
    let mut starting = tokio::task::JoinSet::new();
    for index in 0..threads {
        let spec = match threads {
            1 => env.spec.clone(),
            count => env.spec.clone().with_shard(Shard::Slice { index, count })?,
        };
        let opts = opts.clone();
        starting.spawn(async move { ReplicaNode::start(spec, opts).await });
    }
    let mut nodes = Vec::new();
    while let Some(node) = starting.join_next().await {
        nodes.push(node??);
    }
    let start_s = t.elapsed().as_secs_f64();
    let applied =
        || -> u64 { nodes.iter().map(|n| n.status().records_applied.load(Ordering::Acquire)).sum() };
    let untimed = applied();
    let t = Instant::now();
    while applied() < n as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let seconds = t.elapsed().as_secs_f64();
    let hb = nodes.iter().map(|n| n.engine().holder_blocks()).sum();
    for node in nodes {
        node.kill().await;
    }
    let timed = (n as f64 - untimed as f64) / n as f64;
    Ok((Pass { seconds, rate: blocks as f64 * timed / seconds / 1e6, untimed, start_s }, hb))
}

fn print_rounds(rounds: &[(Pass, Pass)], n: usize) {
    println!("\n| round | raw consume M blocks/s (s) | replica consume + decode + apply M blocks/s (s) | apply / raw |");
    println!("|---:|---:|---:|---:|");
    for (i, (raw, apply)) in rounds.iter().enumerate() {
        println!(
            "| {} | {:.2} ({:.2}) | {:.2} ({:.2}) | {:.2} |",
            i + 1,
            raw.rate,
            raw.seconds,
            apply.rate,
            apply.seconds,
            apply.rate / raw.rate
        );
    }
    let starts: Vec<String> = rounds.iter().map(|r| format!("{:.2} s", r.1.start_s)).collect();
    let untimed: u64 = rounds.iter().map(|r| r.1.untimed).sum();
    println!(
        "(replica start-up before each apply pass — probe, checks, reader: {}; {untimed} of {} records applied meanwhile, left out)",
        starts.join(", "),
        n * rounds.len()
    );
}
