//! `prefixlog-lab bench-fleet`: one replica under a fleet's load (issue 39, item 4). A fleet of
//! `--workers` simulated engines (2,048 in the documented run) publishes its KV events as fast
//! as the publisher goes while gateways keep `--in-flight` queries going over `MatchStream`
//! (the client's multiplexer, `--streams` streams; 0: unary `Match`), all in one run:
//!
//! 1. a fresh replica starts on the empty topic; the gateways start once its first record is
//!    applied (before, the keyspace does not exist and every query is NOT_FOUND);
//! 2. every worker's records are published (one task per worker, each worker's in order);
//!    every `--sample-ms` the replica's lag (records published and not yet applied) is sampled;
//! 3. the phase ends when the replica has applied every record: applied records/s and
//!    blocks/s, the gateways' queries/s, p50 and p99 during it, the lag distribution;
//! 4. raw consume of the same log by the same reader (nothing applied): the ratio;
//! 5. the caught-up replica's CPU per 1,000 queries at the same concurrency, unary and
//!    streamed (`stream_bench::compare`).
//!
//! The machine's 2 cores run the broker (embedded: in this process), the replica's ingest and
//! query threads and the gateways' client thread: the ratios, not the absolute numbers, are
//! what one run on a shared machine can say.

use crate::bench_env::{bench_options, workload_queries, BenchLog};
use crate::client_thread::ClientThread;
use prefixlog::fleet_records::{fleet_records, WorkloadArgs};
use prefixlog_proto::v1::{prefix_index_client::PrefixIndexClient, MatchRequest};
use prefixlog_query::tonic::transport::Endpoint;
use prefixlog_query::StreamMux;
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
}

/// Latency samples kept per run (a fixed bound: the phase's length depends on the machine).
const MAX_SAMPLES: usize = 4_000_000;

/// What the gateways saw during the fleet phase.
#[derive(Default)]
struct GatewayReport {
    latencies: Vec<Duration>,
    answered: usize,
    failed: usize,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let client = ClientThread::start()?;
    let env = BenchLog::start(&a.log, "prefixlog.bench-fleet").await?;
    let records = fleet_records(&a.workload, 1)?;
    let blocks: usize = records.iter().map(|r| r.blocks).sum();
    let queries = workload_queries(&a.workload, None)?;
    let n = records.len();
    println!(
        "fleet: {} workers, {n} records, {blocks} blocks, {} partitions; gateways: {} queries in flight over {}",
        a.workload.workers,
        a.log.partitions,
        a.in_flight,
        if a.streams == 0 { "unary Match".to_string() } else { format!("{} MatchStream streams", a.streams) }
    );

    let node = env.node(bench_options()).await?;
    let status = node.status().clone();
    let applied = move || {
        status.records_applied.load(Ordering::Acquire) + status.records_skipped.load(Ordering::Acquire)
    };
    let published = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let publishing = {
        let (items, published) = (items_of(&records), published.clone());
        let publisher = env.publisher.clone();
        tokio::spawn(async move {
            let landed = prefixlog::publish_trace::publish_by_worker(&publisher, items).await;
            published.store(n, Ordering::Release);
            landed.map(|_| t.elapsed())
        })
    };
    while applied() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let gateways = {
        let (ep, qs, stop) = (node.endpoint(), queries.clone(), stop.clone());
        client.run(gateways(ep, qs, a.in_flight, a.streams, stop))
    };
    let sampling = async {
        let from = Instant::now();
        let mut lag = Vec::new();
        while applied() < n as u64 {
            tokio::time::sleep(Duration::from_millis(a.sample_ms)).await;
            // Records landed and not applied, as the replica's watermark thread sees the log.
            lag.push(node.status().lag().max(0) as u64);
        }
        stop.store(true, Ordering::Release);
        (t.elapsed().as_secs_f64(), from.elapsed().as_secs_f64(), lag)
    };
    let (report, (apply_s, gateway_s, mut lag)) = tokio::join!(gateways, sampling);
    let report = report??;
    let publish_s = publishing.await??.as_secs_f64();

    let raw = crate::bench_ingest::raw_consume(&env, n, blocks, a.log.partitions)?;
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

    let apply_rate = blocks as f64 / apply_s / 1e6;
    println!("\n| measure | value |\n|---|---:|");
    println!("| published in (s) | {publish_s:.2} |");
    println!("| applied in (s), from the first publish | {apply_s:.2} |");
    println!("| applied records/s | {:.0} |", n as f64 / apply_s);
    println!("| applied M blocks/s | {apply_rate:.2} |");
    println!("| raw consume M blocks/s (same log, nothing applied) | {:.2} |", raw.rate);
    println!("| **applied / raw consume** | **{:.2}** |", apply_rate / raw.rate);
    print_gateways(&report, gateway_s);
    print_lag(&mut lag);
    for c in &costs {
        println!("| replica CPU per 1,000 queries, caught up, {} (ms) | {:.1} |", c.path, c.us_per_query());
    }
    Ok(())
}

fn items_of(records: &[prefixlog::fleet_records::FleetRecord]) -> Vec<(u64, i64, Vec<u8>)> {
    records.iter().enumerate().map(|(i, r)| (r.worker, 1_000 + i as i64, r.value.clone())).collect()
}

/// Keeps `in_flight` queries going until `stop` (on the client thread). A failed query is
/// counted, not fatal: a replica catching up may answer a query with an error.
async fn gateways(
    endpoint: String,
    queries: Arc<[MatchRequest]>,
    in_flight: usize,
    streams: usize,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<GatewayReport> {
    let ch = Endpoint::from_shared(endpoint)?.tcp_nodelay(true).connect().await?;
    let muxes: Vec<Arc<StreamMux>> = (0..streams).map(|_| Arc::new(StreamMux::new(ch.clone()))).collect();
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for j in 0..in_flight.max(1) {
        let mux = (streams > 0).then(|| muxes[j % streams].clone());
        let (mut unary, next, queries, stop) =
            (PrefixIndexClient::new(ch.clone()), next.clone(), queries.clone(), stop.clone());
        set.spawn(async move {
            let mut mine = GatewayReport::default();
            while !stop.load(Ordering::Acquire) {
                let q = queries[next.fetch_add(1, Ordering::Relaxed) % queries.len()].clone();
                let t = Instant::now();
                let ok = match &mux {
                    Some(mux) => {
                        mux.ask(q, tokio::time::Instant::now() + Duration::from_secs(30)).await.is_ok()
                    }
                    None => unary.r#match(q).await.is_ok(),
                };
                if ok {
                    mine.answered += 1;
                    if mine.latencies.len() < MAX_SAMPLES / in_flight.max(1) {
                        mine.latencies.push(t.elapsed());
                    }
                } else {
                    mine.failed += 1;
                }
            }
            mine
        });
    }
    let mut all = GatewayReport::default();
    while let Some(r) = set.join_next().await {
        let r = r?;
        all.answered += r.answered;
        all.failed += r.failed;
        all.latencies.extend(r.latencies);
    }
    all.latencies.sort_unstable();
    Ok(all)
}

fn print_gateways(r: &GatewayReport, secs: f64) {
    println!("| gateway queries answered while applying (failed) | {} ({}) |", r.answered, r.failed);
    println!("| gateway queries/s while applying | {:.0} |", r.answered as f64 / secs.max(1e-9));
    println!(
        "| Match p50 / p99 while applying (µs) | {:.0} / {:.0} |",
        quantile_us(&r.latencies, 0.5),
        quantile_us(&r.latencies, 0.99)
    );
}

/// The lag samples' distribution (records published and not yet applied).
fn print_lag(lag: &mut [u64]) {
    lag.sort_unstable();
    let at = |q: f64| lag.get(((lag.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
    println!(
        "| lag in records, p50 / p90 / p99 / max ({} samples) | {} / {} / {} / {} |",
        lag.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        lag.last().copied().unwrap_or(0)
    );
}
