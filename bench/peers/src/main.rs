//! `peer-bench`: replays the prefixlog trace workload through published peer prefix indexes and
//! prints their numbers side by side (write throughput, match latency, bytes per holder-block,
//! answer agreement with the first implementation run).

mod alloc;
mod dynamo_crtc;
mod dynamo_radix;
mod harness;
mod index;
mod prefixlog;
mod smg;
mod synth;

use clap::Parser;
use harness::{Answer, RunResult};
use index::Index;
use prefixlog_workload::{generate, load_trace, resident_holder_blocks, FleetConfig, Step};
use std::path::PathBuf;
use std::time::Instant;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// A named constructor of an implementation under test.
type Entry = (&'static str, fn() -> Box<dyn Index>);

/// Every implementation, in run order. The first one run is the answer reference.
/// Adding one: a file with `impl Index for ...`, a `mod` line above, and one line here.
fn registry() -> Vec<Entry> {
    vec![
        ("smg-radix-tree", || Box::new(smg::Smg::new())),
        ("prefixlog", || Box::new(prefixlog::Prefixlog::new())),
        ("dynamo-radix-tree", || Box::new(dynamo_radix::DynamoRadix::new())),
        ("dynamo-crtc-threadpool", || Box::new(dynamo_crtc::DynamoCrtc::new())),
    ]
}

#[derive(Parser, Debug)]
#[command(about = "Replay the trace workload through peer prefix indexes, side by side")]
struct Args {
    /// Mooncake-format JSONL trace.
    #[arg(long, env = "PREFIXLOG_TRACE", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/mooncake/conversation_trace.jsonl"))]
    trace: PathBuf,
    /// Simulated workers.
    #[arg(long, default_value_t = 256)]
    workers: usize,
    /// LRU capacity of each worker, in blocks.
    #[arg(long, default_value_t = 8192)]
    capacity: usize,
    /// Blocks per trace id.
    #[arg(long, default_value_t = 8)]
    stretch: usize,
    /// Disjoint interleaved copies of the trace.
    #[arg(long, default_value_t = 2)]
    copies: usize,
    /// Seed of the request -> worker assignment.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run only these implementations (comma-separated names).
    #[arg(long)]
    only: Option<String>,
    /// Workload shape: `trace` (the Mooncake trace) or `long` (generated: long prompts, few
    /// shared prefixes; see src/synth.rs; --trace is then not read).
    #[arg(long, default_value = "trace")]
    shape: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = FleetConfig {
        workers: args.workers,
        capacity_blocks: args.capacity,
        stretch: args.stretch,
        copies: args.copies,
        seed: args.seed,
    };
    let wanted: Option<Vec<String>> =
        args.only.as_ref().map(|s| s.split(',').map(|x| x.trim().to_string()).collect());
    let mut impls = registry();
    if let Some(w) = &wanted {
        for name in w {
            anyhow::ensure!(
                impls.iter().any(|(n, _)| n == name),
                "unknown implementation {name:?}; known: {:?}",
                impls.iter().map(|(n, _)| *n).collect::<Vec<_>>()
            );
        }
        impls.retain(|(n, _)| w.iter().any(|x| x == n));
    }

    let t = Instant::now();
    let trace = match args.shape.as_str() {
        "trace" => load_trace(&args.trace)?,
        "long" => synth::long_prompts(&synth::LongPrompts::default()),
        other => anyhow::bail!("unknown --shape {other:?}; known: trace, long"),
    };
    println!("shape: {}", args.shape);
    let steps = generate(&trace, &cfg);
    drop(trace);
    let resident = resident_holder_blocks(&steps);
    print_workload(&cfg, &steps, resident, t.elapsed().as_secs_f64());

    let mut reference: Option<Vec<Answer>> = None;
    let mut results = Vec::new();
    for (name, make) in &impls {
        println!("\n== {name}");
        let r = harness::run(make, &steps, &mut reference);
        assert_eq!(r.name, *name, "registry name differs from Index::name()");
        print_details(&r, resident);
        results.push(r);
    }
    println!();
    print_table(&results, resident);
    Ok(())
}

fn print_workload(cfg: &FleetConfig, steps: &[Step], resident: u64, secs: f64) {
    let (mut queries, mut stored, mut removed, mut sb, mut rb, mut qb) = (0, 0, 0, 0u64, 0u64, 0u64);
    for s in steps {
        match s {
            Step::Match { locals } => (queries, qb) = (queries + 1, qb + locals.len() as u64),
            Step::Stored { blocks, .. } => (stored, sb) = (stored + 1, sb + blocks.len() as u64),
            Step::Removed { exts, .. } => (removed, rb) = (removed + 1, rb + exts.len() as u64),
        }
    }
    println!("workload: {cfg:?} (generated in {secs:.1} s)");
    println!(
        "  {queries} queries (avg {:.1} blocks), {stored} stored events ({sb} blocks), \
         {removed} removed events ({rb} blocks); {resident} resident holder-blocks at the end",
        qb as f64 / queries.max(1) as f64
    );
}

fn print_details(r: &RunResult, resident: u64) {
    println!(
        "  writes: {} blocks in {:.3} s ({:.3} s calls + {:.3} s flush) = {:.2} M blocks/s",
        r.write_blocks,
        (r.write_ns + r.flush_ns) as f64 / 1e9,
        r.write_ns as f64 / 1e9,
        r.flush_ns as f64 / 1e9,
        r.write_mblocks_per_s()
    );
    let total_q: u64 = r.lat_ns.iter().sum();
    println!(
        "  match: {} queries, p50 {:.2} us, p90 {:.2} us, p99 {:.2} us, p99.9 {:.2} us, max {:.1} us, mean {:.2} us",
        r.lat_ns.len(),
        r.percentile_us(0.50),
        r.percentile_us(0.90),
        r.percentile_us(0.99),
        r.percentile_us(0.999),
        r.lat_ns.last().copied().unwrap_or(0) as f64 / 1e3,
        total_q as f64 / r.lat_ns.len().max(1) as f64 / 1e3
    );
    println!(
        "  memory: {:.1} MiB live after replay = {:.1} B/holder-block",
        r.bytes as f64 / (1 << 20) as f64,
        r.bytes as f64 / resident.max(1) as f64
    );
    match &r.mismatches {
        None => println!("  answers: recorded as the reference"),
        Some((n, first)) => {
            println!("  answers: {n} of {} queries differ from the reference", r.lat_ns.len());
            if let Some(f) = first {
                println!("  first mismatch: {f}");
            }
        }
    }
    if !r.notes.is_empty() {
        println!("  notes: {}", r.notes);
    }
}

fn print_table(results: &[RunResult], resident: u64) {
    println!("| implementation | writes (M blocks/s) | match p50 µs | match p99 µs | bytes/holder-block | answer mismatches |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in results {
        let mism = match &r.mismatches {
            None => "reference".to_string(),
            Some((n, _)) => n.to_string(),
        };
        println!(
            "| {} | {:.2} | {:.1} | {:.1} | {:.0} | {} |",
            r.name,
            r.write_mblocks_per_s(),
            r.percentile_us(0.50),
            r.percentile_us(0.99),
            r.bytes as f64 / resident.max(1) as f64,
            mism
        );
    }
}
