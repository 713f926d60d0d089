//! `prefixlog-lab bench-fleet`: one replica under a fleet's load (issue 39, item 4). A fleet of
//! `--workers` simulated engines (2,048 in the documented run) and gateways that keep
//! `--in-flight` queries going over `MatchStream` (the client's multiplexer, `--streams`
//! streams; 0: unary `Match`). Two hours of the trace's KV events, in one run:
//!
//! 1. **catch-up under load**: the first hour is published and read once by the replica's reader
//!    with nothing applied (raw consume); then a fresh replica applies it while the gateways
//!    query (they start at its first applied record: before, the keyspace does not exist). The
//!    highest rate the replica sustains: applied records/s and blocks/s, against raw consume;
//! 2. **live**: the second hour is published as fast as the publisher goes (one task per
//!    worker) while the replica tails it and the gateways query; every `--sample-ms` its lag
//!    (records landed and not yet applied) is sampled;
//! 3. the caught-up replica's CPU per 1,000 queries at the same concurrency, unary and
//!    streamed (`stream_bench::compare`).
//!
//! The machine's cores run the broker (embedded: in this process), the replica's ingest and
//! query threads, the publisher and the gateways' client thread: the ratios, not the absolute
//! numbers, are what one run on a shared machine can say.

use crate::bench_env::{bench_options, workload_queries, BenchLog};
use crate::client_thread::ClientThread;
use crate::stream_bench::{drive, drive_at, Driven, Until};
use prefixlog::fleet_records::{fleet_records, FleetRecord, WorkloadArgs};
use prefixlog_proto::v1::MatchRequest;
use prefixlog_workload::quantile::quantile_us;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Queries the gateways keep in flight.
    #[arg(long, env = "PREFIXLOG_BENCH_IN_FLIGHT", default_value_t = 1024)]
    pub in_flight: usize,
    /// `MatchStream` streams the queries are spread over (0: unary `Match` calls).
    #[arg(long, env = "PREFIXLOG_BENCH_STREAMS", default_value_t = 8)]
    pub streams: usize,
    /// How often the replica's lag is sampled, in ms.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub sample_ms: u64,
    /// Queries of each path in the CPU-per-query measurement of the caught-up replica.
    #[arg(long, default_value_t = 20_000)]
    pub cpu_queries: usize,
    /// The gateways ask for the k best workers only (default: every worker holding a prefix).
    #[arg(long)]
    pub top_k: Option<u32>,
    /// The gateways offer this many queries/s (open loop: each query sent when due, whatever
    /// is in flight) instead of keeping `--in-flight` going; `--streams` 0 sends unary calls.
    #[arg(long)]
    pub rate: Option<f64>,
    /// The replica keeps two copies of every keyspace (`serve --query-copy`).
    #[arg(long)]
    pub query_copy: bool,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let client = ClientThread::start()?;
    let env = BenchLog::start(&a.log, "prefixlog.bench-fleet").await?;
    let records = fleet_records(&a.workload, 2)?;
    let (first, second) = records.split_at(records.len() / 2);
    let blocks = |r: &[FleetRecord]| r.iter().map(|r| r.blocks).sum::<usize>();
    let queries = workload_queries(&a.workload, a.top_k)?;
    println!(
        "fleet: {} workers, 2 hours: {} + {} records, {} + {} blocks, {} partitions; gateways: {} queries in flight over {}{}",
        a.workload.workers,
        first.len(),
        second.len(),
        blocks(first),
        blocks(second),
        a.log.partitions,
        a.in_flight,
        if a.streams == 0 { "unary Match".to_string() } else { format!("{} MatchStream streams", a.streams) },
        a.top_k.map(|k| format!(", top_k {k}")).unwrap_or_default()
    );
    if let Some(rate) = a.rate {
        println!("gateways: open loop at {rate} queries/s instead of {} in flight", a.in_flight);
    }
    let t = Instant::now();
    // Fails if the broker's retention dropped any of it (the embedded broker keeps 5 MiB or
    // 100,000 records per partition): raw consume must read the same records.
    env.publish(items_of(first, 0)).await?;
    env.publisher.flush(Duration::from_secs(60))?;
    let backlog_s = t.elapsed().as_secs_f64();
    // Before the second hour lands: retention may drop the first once the replica has it.
    let raw = crate::bench_ingest::raw_consume(&env, first.len(), blocks(first), a.log.partitions)?;

    let node = env.node(prefixlog_node::NodeOptions { query_copy: a.query_copy, ..bench_options() }).await?;
    let applied = || {
        let s = node.status();
        s.records_applied.load(Ordering::Acquire) + s.records_skipped.load(Ordering::Acquire)
    };
    while applied() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let landed = Arc::new(AtomicUsize::new(first.len()));
    let catch_up = under_load(&client, &node, &queries, &a, &landed, first.len() as u64).await?;

    let publishing = {
        let (items, publisher, landed) =
            (items_of(second, first.len()), env.publisher.clone(), landed.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let published =
                prefixlog::publish_trace::publish_by_worker_counted(&publisher, items, &landed).await;
            published.map(|_| t.elapsed())
        })
    };
    let live = under_load(&client, &node, &queries, &a, &landed, records.len() as u64).await?;
    let publish_s = publishing.await??.as_secs_f64();

    let costs = crate::stream_bench::compare(
        &client,
        node.endpoint(),
        queries.clone(),
        (a.in_flight, a.streams.max(1)),
        a.cpu_queries,
    )
    .await?;
    node.kill().await;
    env.finish().await;

    let rate = blocks(first) as f64 / catch_up.secs / 1e6;
    println!("\n| measure | value |\n|---|---:|");
    println!("| first hour published (backlog) in (s) | {backlog_s:.2} |");
    println!("| catch-up under load: applied in (s) | {:.2} |", catch_up.secs);
    println!("| catch-up: applied records/s | {:.0} |", first.len() as f64 / catch_up.secs);
    println!("| catch-up: applied M blocks/s | {rate:.2} |");
    println!("| raw consume M blocks/s (same records, nothing applied) | {:.2} |", raw.rate);
    println!("| **catch-up apply / raw consume** | **{:.2}** |", rate / raw.rate);
    catch_up.print("catch-up");
    println!("| live: second hour published in (s), applied by (s) | {publish_s:.2} / {:.2} |", live.secs);
    live.print("live");
    for c in &costs {
        println!("| replica CPU per 1,000 queries, caught up, {} (ms) | {:.1} |", c.path, c.us_per_query());
    }
    Ok(())
}

/// One phase: the gateways query until the replica has applied `until` records in all.
struct Phase {
    secs: f64,
    gateways: Driven,
    /// Lag samples, records landed and not applied.
    lag: Vec<u64>,
}

async fn under_load(
    client: &ClientThread,
    node: &prefixlog_node::ReplicaNode,
    queries: &Arc<[MatchRequest]>,
    a: &Args,
    landed: &AtomicUsize,
    until: u64,
) -> anyhow::Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let gateways = {
        let (ep, qs, stop, (rate, in_flight, streams)) =
            (node.endpoint(), queries.clone(), stop.clone(), (a.rate, a.in_flight, a.streams));
        client.run(async move {
            match rate {
                Some(rate) => Ok(drive_at(ep, qs, rate, Until::Stopped(stop), streams).await?.driven),
                None => drive(ep, qs, in_flight, streams, Until::Stopped(stop)).await,
            }
        })
    };
    let sampling = async {
        let (t, status) = (Instant::now(), node.status());
        let applied = || {
            status.records_applied.load(Ordering::Acquire) + status.records_skipped.load(Ordering::Acquire)
        };
        let mut lag = Vec::new();
        while applied() < until {
            // Records acknowledged by the broker and not yet applied. Applied is read first:
            // landed only grows, so the lag is never understated.
            let done = applied();
            lag.push((landed.load(Ordering::Acquire) as u64).saturating_sub(done));
            tokio::time::sleep(Duration::from_millis(a.sample_ms)).await;
        }
        stop.store(true, Ordering::Release);
        (t.elapsed().as_secs_f64(), lag)
    };
    let (report, (secs, lag)) = tokio::join!(gateways, sampling);
    Ok(Phase { secs, gateways: report??, lag })
}

impl Phase {
    fn print(&self, name: &str) {
        let (r, secs) = (&self.gateways, self.secs);
        println!("| {name}: gateway queries answered (failed) | {} ({}) |", r.answered, r.failed);
        println!("| {name}: gateway queries/s | {:.0} |", r.answered as f64 / secs.max(1e-9));
        println!(
            "| {name}: Match p50 / p99 / p99.9 (µs) | {:.0} / {:.0} / {:.0} |",
            quantile_us(&r.latencies, 0.5),
            quantile_us(&r.latencies, 0.99),
            quantile_us(&r.latencies, 0.999)
        );
        let mut lag = self.lag.clone();
        lag.sort_unstable();
        let at = |q: f64| lag.get(((lag.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
        println!(
            "| {name}: lag in records, p50 / p90 / p99 / max ({} samples) | {} / {} / {} / {} |",
            lag.len(),
            at(0.5),
            at(0.9),
            at(0.99),
            lag.last().copied().unwrap_or(0)
        );
    }
}

/// `(worker, log time, record)` of `records`, the `from`-th record of the run first.
pub(crate) fn items_of(records: &[FleetRecord], from: usize) -> Vec<(u64, i64, Vec<u8>)> {
    records.iter().enumerate().map(|(i, r)| (r.worker, 1_000 + (from + i) as i64, r.value.clone())).collect()
}
