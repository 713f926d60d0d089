//! `prefixlog-lab bench-scale`: one replica holding a fleet past Dynamo's INDEXER_BENCH (issue
//! 51). Its method: the conversation trace on `--workers` simulated workers, `--copies`
//! disjoint copies of the trace (Dynamo's `--trace-duplication-factor`), and every worker
//! `--worker-copies` times under distinct ids (its `-d`). Dynamo's largest row, 224,000
//! effective workers (1,000 workers per trace copy × 32 copies × 7), is `--workers 32000
//! --copies 32 --worker-copies 7` (effective workers = workers × worker copies).
//!
//! The whole log is published first; then a replica, a separate `prefixlog serve` process so
//! that its RSS and CPU are its own (checkpoints off unless `--checkpoints`, so that none
//! lands inside a measured phase), applies it from the start:
//! - while it applies, an open loop offers `--rate` queries/s for `--seconds`;
//! - what the caught-up replica holds: holder-blocks, the engine's trie heap per
//!   holder-block, RSS (and its anonymous part);
//! - closed loop, `--in-flight` queries over `--streams` `MatchStream` streams: queries/s,
//!   latency quantiles, replica CPU per query;
//! - caught up, the open loop again for `--caught-up-seconds`.
//!
//! An open loop's latency is reported from each query's send and from when it was due (the
//! client's timer included), and as the replica's own service time (its
//! `prefixlog_query_latency_seconds` histogram: from the decoded request to its answer).
//! It ends with one line: `scale: N effective workers, N holder-blocks, X bytes/holder-block,
//! RSS X MiB; closed loop ...; open loop X/s p99 X us (in the replica <= X us), while applying
//! p99 X us (in the replica <= X us)`.

use crate::bench_env::{workload_queries, BenchLog};
use crate::bench_rounds::landed_token;
use crate::client_thread::ClientThread;
use crate::replica_process::{
    bucket_quantile, histogram, metrics_page, replica_bin, samples, ReplicaProcess,
};
use crate::stream_bench::{drive, drive_at, Driven, OpenLoop, Until};
use prefixlog::fleet_records::{fleet_records, WorkloadArgs};
use prefixlog_workload::quantile::quantile_us;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Closed loop: queries kept in flight.
    #[arg(long, default_value_t = 1024)]
    pub in_flight: usize,
    /// `MatchStream` streams the queries are spread over.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub streams: u64,
    /// Closed loop: queries asked.
    #[arg(long, default_value_t = 100_000)]
    pub queries: usize,
    /// Open loop: queries offered per second.
    #[arg(long, default_value_t = 10_000.0)]
    pub rate: f64,
    /// Open loop while the replica applies: seconds offered (from when it first answers).
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Open loop against the caught-up replica: seconds offered.
    #[arg(long, default_value_t = 10)]
    pub caught_up_seconds: u64,
    /// Let the replica take checkpoints (its defaults) while it applies and is measured.
    #[arg(long)]
    pub checkpoints: bool,
    /// The gateways ask for the k best workers; 0: every worker holding a prefix.
    #[arg(long, default_value_t = 8)]
    pub top_k: u32,
    /// How long the replica may take to apply the log, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub apply_limit_secs: u64,
    #[command(flatten)]
    pub replica: crate::replica_process::ReplicaArgs,
}

/// What the replica holds once caught up.
struct Held {
    holder_blocks: f64,
    heap_bytes: f64,
    rss_mib: f64,
    anon_mib: f64,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let bin = replica_bin(a.replica.replica_bin.as_deref())?;
    let client = ClientThread::start()?;
    let env = BenchLog::start(&a.log, "prefixlog.bench-scale").await?;
    let records = fleet_records(&a.workload, 1)?;
    let (n_records, blocks) = (records.len(), records.iter().map(|r| r.blocks).sum::<usize>());
    let top_k = (a.top_k > 0).then_some(a.top_k);
    let queries = workload_queries(&a.workload, top_k)?;
    let streams = a.streams as usize;
    println!(
        "scale: {} effective workers ({} workers × {} worker copies, {} trace copies): {n_records} records, {blocks} blocks stored; {} distinct queries, {}; replica arguments {:?}",
        a.workload.effective_workers(),
        a.workload.workers,
        a.workload.worker_copies,
        a.workload.copies,
        queries.len(),
        top_k.map_or("every holder".to_string(), |k| format!("top_k {k}")),
        a.replica.replica_arg
    );
    let t = Instant::now();
    let items = records.into_iter().enumerate().map(|(i, r)| (r.worker, 1_000 + i as i64, r.value)).collect();
    let landed = env.publish(items).await?;
    println!("published in {:.1} s", t.elapsed().as_secs_f64());

    let data = tempfile::tempdir()?;
    let t = Instant::now();
    let mut replica_args: Vec<String> = a.replica.replica_arg.clone();
    if !a.checkpoints {
        replica_args.extend(["--checkpoint-interval=0s".into(), "--checkpoint-records=0".into()]);
    }
    let mut replica = ReplicaProcess::start(&bin, &env, data.path(), &replica_args)?;
    let limit = Duration::from_secs(a.apply_limit_secs);
    // Answering (its keyspace exists) long before it has applied the log.
    replica.wait_for(&[], &queries[0], limit).await?;
    let (ep, qs) = (replica.endpoint.clone(), queries.clone());
    let asked = |secs: u64| Until::Asked((a.rate * secs as f64) as usize);
    let before = replica.metrics()?;
    let open_from = t.elapsed().as_secs_f64();
    let token = landed_token(&landed);
    let admin = replica.admin_port();
    let loop_then_scrape = async {
        let open = client.run(drive_at(ep.clone(), qs.clone(), a.rate, asked(a.seconds), streams)).await;
        // Scraped the moment the loop ends, whether or not the apply has.
        (open, metrics_page(admin))
    };
    let ((applying, after), applied_at) = tokio::join!(loop_then_scrape, replica.wait_applied(&token, limit));
    let after = after?;
    let applying = OpenPhase::new(applying??, &before, &after);
    let holder_blocks = |page: &str| samples(page, "prefixlog_holder_blocks").next().map_or(0.0, |(_, v)| v);
    println!(
        "while applying: the open loop ran from {:.0} to {:.0} holder-blocks applied",
        holder_blocks(&before),
        holder_blocks(&after)
    );
    let apply_secs = (applied_at? - t).as_secs_f64();
    if apply_secs < open_from + a.seconds as f64 {
        println!(
            "note: the replica caught up before the open loop \"while applying\" ended: use fewer --seconds"
        );
    }
    let held = Held {
        holder_blocks: replica.gauge("prefixlog_holder_blocks")?,
        heap_bytes: replica.gauge("prefixlog_engine_heap_bytes")?,
        rss_mib: replica.status_mib("VmRSS")?,
        anon_mib: replica.status_mib("RssAnon")?,
    };
    println!(
        "applied from the start in {apply_secs:.1} s (process start included): {:.2} M blocks/s, the open loop at {}/s during {:.1}..{:.1} s of it; holds {:.0} holder-blocks, engine heap {:.1} MiB, RSS {:.1} MiB",
        blocks as f64 / apply_secs / 1e6,
        a.rate,
        open_from,
        open_from + a.seconds as f64,
        held.holder_blocks,
        held.heap_bytes / 1048576.0,
        held.rss_mib
    );

    client.run(drive(ep.clone(), qs.clone(), a.in_flight, streams, Until::Asked(a.queries / 10))).await??;
    let (cpu, t) = (replica.cpu()?, Instant::now());
    let closed =
        client.run(drive(ep.clone(), qs.clone(), a.in_flight, streams, Until::Asked(a.queries))).await??;
    let closed_secs = t.elapsed().as_secs_f64();
    let cpu_us = replica.cpu()?.saturating_sub(cpu).as_secs_f64() * 1e6 / closed.answered.max(1) as f64;
    let before = replica.metrics()?;
    let open = client.run(drive_at(ep, qs, a.rate, asked(a.caught_up_seconds), streams)).await??;
    let caught_up = OpenPhase::new(open, &before, &replica.metrics()?);
    drop(replica);
    env.finish().await;
    let failed = [closed.failed, applying.open.driven.failed, caught_up.open.driven.failed];
    anyhow::ensure!(failed == [0; 3], "queries failed (closed loop, open while applying, open): {failed:?}");
    report(
        &a,
        &held,
        (&closed, closed_secs, cpu_us),
        [("while applying", &applying), ("caught up", &caught_up)],
    );
    Ok(())
}

/// The replica's own Match latency histogram (from the request's arrival to its answer).
const LATENCY: &str = "prefixlog_query_latency_seconds";
/// The time a query waited for its keyspace's read lock.
const LOCK_WAIT: &str = "prefixlog_query_read_lock_wait_seconds";

/// An open loop and what the replica's own histogram saw meanwhile.
struct OpenPhase {
    open: OpenLoop,
    /// p50, p99, p99.9 in the replica, µs: the upper bound of the bucket holding each.
    server_us: [f64; 3],
    /// The same of the time queries waited for their keyspace's read lock (held by writes).
    lock_wait_us: [f64; 3],
}

impl OpenPhase {
    /// `before` and `after`: the replica's `/metrics` pages around the open loop.
    fn new(open: OpenLoop, before: &str, after: &str) -> Self {
        let quantiles = |name: &str| {
            let (b, a) = (histogram(before, name), histogram(after, name));
            QUANTILES.map(|q| bucket_quantile(&b, &a, q).unwrap_or(f64::NAN) * 1e6)
        };
        Self { open, server_us: quantiles(LATENCY), lock_wait_us: quantiles(LOCK_WAIT) }
    }
}

const QUANTILES: [f64; 3] = [0.5, 0.99, 0.999];

fn report(
    a: &Args,
    held: &Held,
    (closed, closed_secs, cpu_us): (&Driven, f64, f64),
    phases: [(&str, &OpenPhase); 2],
) {
    let q = |d: &Driven| QUANTILES.map(|x| quantile_us(&d.latencies, x));
    let closed_qps = closed.answered as f64 / closed_secs;
    let per_block = held.heap_bytes / held.holder_blocks.max(1.0);
    println!("\n| measure | value |\n|---|---:|");
    println!("| effective workers | {} |", a.workload.effective_workers());
    println!("| resident holder-blocks | {:.0} |", held.holder_blocks);
    println!("| engine trie heap bytes per holder-block (holder tables not counted) | {per_block:.1} |");
    println!("| replica RSS / anonymous (MiB) | {:.1} / {:.1} |", held.rss_mib, held.anon_mib);
    println!(
        "| closed loop, {} in flight (the replica serves 32 per stream at once): queries/s | {closed_qps:.0} |",
        a.in_flight
    );
    let [p50, p99, p999] = q(closed);
    println!("| closed loop: p50 / p99 / p99.9 (µs) | {p50:.0} / {p99:.0} / {p999:.0} |");
    println!("| closed loop: replica CPU per query (µs) | {cpu_us:.1} |");
    for (name, p) in phases {
        let (open, late) = (&p.open.driven, &p.open.late);
        println!("| open loop at {}/s {name}: queries answered | {} |", a.rate, open.answered);
        let [p50, p99, p999] = q(open);
        println!("| {name}: p50 / p99 / p99.9, sent to answered (µs) | {p50:.0} / {p99:.0} / {p999:.0} |");
        let [d50, d99, d999] = QUANTILES.map(|x| quantile_us(&p.open.from_due, x));
        println!("| {name}: p50 / p99 / p99.9, due to answered (µs) | {d50:.0} / {d99:.0} / {d999:.0} |");
        let [s50, s99, s999] = p.server_us;
        println!("| {name}: in the replica, p50 / p99 / p99.9 at most (µs, its histogram's bucket) | {s50:.0} / {s99:.0} / {s999:.0} |");
        let [w50, w99, w999] = p.lock_wait_us;
        println!("| {name}: waited for the read lock, p50 / p99 / p99.9 at most (µs) | {w50:.0} / {w99:.0} / {w999:.0} |");
        let late = [0.5, 0.99].map(|x| quantile_us(late, x));
        println!(
            "| {name}: sent late by the client's timer, p50 / p99 (µs) | {:.0} / {:.0} |",
            late[0], late[1]
        );
    }
    let [(_, applying), (_, caught_up)] = phases;
    println!(
        "\nscale: {} effective workers, {:.0} holder-blocks, {per_block:.1} bytes/holder-block, RSS {:.0} MiB; closed loop {} in flight {closed_qps:.0} queries/s, CPU {cpu_us:.1} us/query; open loop {}/s p99 {:.0} us (in the replica <= {:.0} us), while applying p99 {:.0} us (in the replica <= {:.0} us)",
        a.workload.effective_workers(),
        held.holder_blocks,
        held.rss_mib,
        a.in_flight,
        a.rate,
        q(&caught_up.open.driven)[1],
        caught_up.server_us[1],
        q(&applying.open.driven)[1],
        applying.server_us[1],
    );
}
