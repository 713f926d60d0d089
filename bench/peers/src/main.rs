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
use prefixlog_workload::quantile::median;
use prefixlog_workload::{generate_routed, load_trace, resident_holder_blocks, FleetConfig, Routing, Step};
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
    /// Disjoint interleaved copies of the trace [default: 4 for `--shape shared`, else 2].
    #[arg(long)]
    copies: Option<usize>,
    /// Seed of the request -> worker assignment.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Run only these implementations (comma-separated names).
    #[arg(long)]
    only: Option<String>,
    /// Workload shape: `trace` (the Mooncake trace, routed by conversation), `long`
    /// (generated: long prompts, few shared prefixes; see src/synth.rs; --trace is then not
    /// read) or `shared` (the Mooncake trace with every request routed to a random worker, so
    /// popular prefixes are held by much of the fleet at once).
    #[arg(long, value_enum, default_value_t = Shape::Trace)]
    shape: Shape,
    /// How requests are routed to workers [default: `random` for `--shape shared`, else
    /// `conversation`].
    #[arg(long, value_enum)]
    routing: Option<RoutingArg>,
    /// Replays per implementation, interleaved (round 1 runs every implementation once, then
    /// round 2, ...). The table shows each column's median over the rounds: this machine is
    /// shared, and one replay per implementation compares moments as much as implementations.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Shape {
    Trace,
    Long,
    Shared,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RoutingArg {
    Conversation,
    Random,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let shared = args.shape == Shape::Shared;
    let cfg = FleetConfig {
        workers: args.workers,
        capacity_blocks: args.capacity,
        stretch: args.stretch,
        copies: args.copies.unwrap_or(if shared { 4 } else { 2 }),
        seed: args.seed,
    };
    let routing =
        match args.routing.unwrap_or(if shared { RoutingArg::Random } else { RoutingArg::Conversation }) {
            RoutingArg::Conversation => Routing::Conversation,
            RoutingArg::Random => Routing::Random,
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
    let trace = match args.shape {
        Shape::Trace | Shape::Shared => load_trace(&args.trace)?,
        Shape::Long => synth::long_prompts(&synth::LongPrompts::default()),
    };
    println!("shape: {:?}, routing: {routing:?}", args.shape);
    let steps = generate_routed(&trace, &cfg, routing);
    drop(trace);
    let resident = resident_holder_blocks(&steps);
    print_workload(&cfg, &steps, resident, t.elapsed().as_secs_f64());

    anyhow::ensure!(args.rounds >= 1, "--rounds must be at least 1");
    let mut reference: Option<Vec<Answer>> = None;
    let mut rounds: Vec<Vec<Summary>> = vec![Vec::new(); impls.len()];
    for round in 0..args.rounds {
        // Each round starts one implementation later, so none always runs first or last.
        for k in (0..impls.len()).map(|k| (k + round) % impls.len()) {
            let (name, make) = &impls[k];
            println!("\n== {name} (round {} of {})", round + 1, args.rounds);
            let r = harness::run(make, &steps, &mut reference);
            assert_eq!(r.name, *name, "registry name differs from Index::name()");
            print_details(&r, resident);
            rounds[k].push(Summary::of(&r, resident));
        }
    }
    println!();
    print_table(&rounds);
    Ok(())
}

/// One replay's row of the table.
#[derive(Clone)]
struct Summary {
    name: String,
    writes: f64,
    p50_us: f64,
    p99_us: f64,
    bytes: f64,
    /// `None` for the reference run.
    mismatches: Option<u64>,
}

impl Summary {
    fn of(r: &RunResult, resident: u64) -> Self {
        Self {
            name: r.name.clone(),
            writes: r.write_mblocks_per_s(),
            p50_us: r.percentile_us(0.50),
            p99_us: r.percentile_us(0.99),
            bytes: r.bytes as f64 / resident.max(1) as f64,
            mismatches: r.mismatches.as_ref().map(|m| m.0),
        }
    }

    /// Each column's median over the rounds; mismatches are the most any round had (`None`
    /// when the first round was the reference).
    fn median_of(runs: &[Summary]) -> Self {
        let col = |f: fn(&Summary) -> f64| median(runs.iter().map(f));
        Self {
            name: runs[0].name.clone(),
            writes: col(|r| r.writes),
            p50_us: col(|r| r.p50_us),
            p99_us: col(|r| r.p99_us),
            bytes: col(|r| r.bytes),
            mismatches: runs[0]
                .mismatches
                .map(|_| runs.iter().filter_map(|r| r.mismatches).max().unwrap_or(0)),
        }
    }
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
        "  writes: {} blocks in {:.3} s ({:.3} s calls + {:.3} s flush, of which {:.3} s the final drain) = {:.2} M blocks/s",
        r.write_blocks,
        (r.write_ns + r.flush_ns) as f64 / 1e9,
        r.write_ns as f64 / 1e9,
        r.flush_ns as f64 / 1e9,
        r.drain_ns as f64 / 1e9,
        r.write_mblocks_per_s()
    );
    let stored = r.write_blocks - r.removed_blocks;
    let rate = |blocks: u64, ns: u64| blocks as f64 / (ns.max(1) as f64 / 1e9) / 1e6;
    println!(
        "  calls: stored {} blocks at {:.2} M/s, removed {} blocks at {:.2} M/s (flush time not split)",
        stored,
        rate(stored, r.write_ns - r.remove_ns),
        r.removed_blocks,
        rate(r.removed_blocks, r.remove_ns)
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

/// Medians over the rounds (the middle round of an odd count), every round's writes, and the
/// ratios the speed targets are stated in: prefixlog against the best peer in each column.
fn print_table(rounds: &[Vec<Summary>]) {
    let n = rounds.first().map_or(0, Vec::len);
    println!("medians of {n} round(s):");
    println!("| implementation | writes (M blocks/s) | match p50 µs | match p99 µs | bytes/holder-block | answer mismatches |");
    println!("|---|---:|---:|---:|---:|---:|");
    let medians: Vec<Summary> = rounds.iter().map(|runs| Summary::median_of(runs)).collect();
    for m in &medians {
        let mism = m.mismatches.map_or("reference".to_string(), |n| n.to_string());
        println!(
            "| {} | {:.2} | {:.1} | {:.1} | {:.0} | {} |",
            m.name, m.writes, m.p50_us, m.p99_us, m.bytes, mism
        );
    }
    for runs in rounds {
        let each: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.writes)).collect();
        println!("writes per round, {}: {}", runs[0].name, each.join(" / "));
    }
    let Some(ours) = medians.iter().find(|m| m.name == "prefixlog") else { return };
    let peers: Vec<&Summary> = medians.iter().filter(|m| m.name != "prefixlog").collect();
    if peers.is_empty() {
        return;
    }
    let best_writes = peers.iter().map(|p| p.writes).fold(f64::MIN, f64::max);
    let best_p99 = peers.iter().map(|p| p.p99_us).fold(f64::MAX, f64::min);
    let best_bytes = peers.iter().map(|p| p.bytes).fold(f64::MAX, f64::min);
    println!(
        "prefixlog vs the best peer (medians): writes {:.2}x, match p99 {:.2}x, bytes {:.2}x",
        ours.writes / best_writes,
        ours.p99_us / best_p99,
        ours.bytes / best_bytes
    );
}
