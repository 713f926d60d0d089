//! `prefixlog-lab bench-shards`: what sharding costs and saves, same run, same records (embedded
//! broker): engine memory per replica with N shards against one unsharded replica, and the
//! client's fan-out Match latency (one Match per shard, in parallel, merged) against an
//! unsharded Match, queries alternating so both see the same conditions.

use crate::bench_env::{bench_options, BenchLog};
use prefixlog::fleet_records::{fleet_records, keyspace, WorkloadArgs};
use prefixlog_client::{IndexClient, MatchOutcome, MatchQuery, Prompt};
use prefixlog_ingest::Shard;
use prefixlog_node::ReplicaNode;
use prefixlog_workload::quantile::quantile_us as pct;
use prefixlog_workload::{generate, load_trace, FleetConfig, Step};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Shards to split the partitions into.
    #[arg(long, env = "PREFIXLOG_BENCH_SHARDS", default_value_t = 2)]
    pub shards: u32,
    /// Match calls per client (each alternates with the other client's).
    #[arg(long, env = "PREFIXLOG_BENCH_QUERIES", default_value_t = 10_000)]
    pub queries: usize,
    /// Ask for the k best workers only (default: every worker holding a prefix).
    #[arg(long, env = "PREFIXLOG_BENCH_TOP_K")]
    pub top_k: Option<u32>,
}

fn heap(n: &ReplicaNode) -> (u64, u64) {
    let e = n.engine();
    let heap = e.keyspaces().iter().map(|k| k.read().heap_bytes() as u64).sum();
    (heap, e.holder_blocks())
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.shards >= 2 && a.shards <= a.log.partitions, "--shards must be in 2..=--partitions");
    let env = BenchLog::start(&a.log, "prefixlog.bench-shards").await?;
    let records = fleet_records(&a.workload, 1)?;
    let landed = prefixlog::publish_trace::publish_all(&env.publisher, &records).await?;
    println!("workload: {landed} records, {} partitions, {} shards", a.log.partitions, a.shards);
    let unsharded = env.node(bench_options()).await?;
    let mut shards = Vec::new();
    for i in 0..a.shards {
        let spec = env.spec.clone().with_shard(Shard::Slice { index: i, count: a.shards })?;
        shards.push(ReplicaNode::start(spec, bench_options()).await?);
    }
    for n in std::iter::once(&unsharded).chain(&shards) {
        // Caught up: every owned partition's watermark read and reached.
        while !n.status().watermarks_unknown().is_empty() || n.status().lag() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (uh, ub) = heap(&unsharded);
    println!("\n| replica | partitions | holder-blocks | engine heap MB | of unsharded |");
    println!("|---|---:|---:|---:|---:|");
    println!("| unsharded | {} | {ub} | {:.1} | 1.00 |", a.log.partitions, uh as f64 / 1e6);
    for (i, s) in shards.iter().enumerate() {
        let (h, b) = heap(s);
        println!(
            "| shard {i}/{} | {} | {b} | {:.1} | {:.2} |",
            a.shards,
            s.spec().owned().len(),
            h as f64 / 1e6,
            h as f64 / uh as f64
        );
    }

    let trace = load_trace(std::path::Path::new(&a.workload.trace))?;
    let cfg = FleetConfig {
        workers: a.workload.workers,
        capacity_blocks: a.workload.capacity,
        stretch: a.workload.stretch,
        copies: a.workload.copies,
        seed: 1,
    };
    let queries: Vec<Vec<u64>> = generate(&trace, &cfg)
        .into_iter()
        .filter_map(|s| if let Step::Match { locals } = s { Some(locals) } else { None })
        .collect();
    let deadline = Duration::from_secs(5);
    let one = IndexClient::new(vec![unsharded.endpoint()], deadline)?;
    let fan = IndexClient::discover(shards.iter().map(ReplicaNode::endpoint).collect(), deadline).await?;
    let (mut lu, mut lf) = (Vec::with_capacity(a.queries), Vec::with_capacity(a.queries));
    for i in 0..a.queries + 1_000 {
        let mut q = MatchQuery::new(keyspace(), Prompt::Hashes(queries[i % queries.len()].clone()));
        q.top_k = a.top_k;
        let t = Instant::now();
        let r1 = one.match_prompt(&q).await;
        let d1 = t.elapsed();
        let t = Instant::now();
        let r2 = fan.match_prompt(&q).await;
        let d2 = t.elapsed();
        anyhow::ensure!(
            !matches!(r1, MatchOutcome::Unavailable(_)) && !matches!(r2, MatchOutcome::Unavailable(_)),
            "a query failed"
        );
        if i >= 1_000 {
            // The first 1,000 warm connections and caches.
            lu.push(d1);
            lf.push(d2);
        }
    }
    lu.sort_unstable();
    lf.sort_unstable();
    println!("\n| Match | calls | p50 µs | p99 µs |");
    println!("|---|---:|---:|---:|");
    println!("| unsharded | {} | {:.1} | {:.1} |", lu.len(), pct(&lu, 0.5), pct(&lu, 0.99));
    println!(
        "| fan-out over {} shards (merged) | {} | {:.1} | {:.1} |",
        a.shards,
        lf.len(),
        pct(&lf, 0.5),
        pct(&lf, 0.99)
    );
    println!(
        "\nfan-out / unsharded: p50 {:.2}x, p99 {:.2}x (target p99 <= 1.5x)",
        pct(&lf, 0.5) / pct(&lu, 0.5),
        pct(&lf, 0.99) / pct(&lu, 0.99)
    );
    unsharded.kill().await;
    for s in shards {
        s.kill().await;
    }
    env.finish().await;
    Ok(())
}
