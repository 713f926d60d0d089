//! Engine benchmark on the trace workload: single-threaded replay (write throughput, match
//! latency, bytes per holder-block) and a concurrent run (one writer applying every event
//! while a reader queries) that measures write-lock hold times and query latency under
//! writes. The side-by-side peer comparison is `make bench-peers` (bench/peers).
//!
//!   cargo run --release -p prefixlog-engine --example engine-bench -- --help

use clap::Parser;
use prefixlog_engine::{Engine, EngineConfig, HolderKey, KeyspaceId, MatchOptions, Tier};
use prefixlog_workload::{generate, load_trace, resident_holder_blocks, FleetConfig, Step};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Replay the trace workload through prefixlog's engine and report throughput and latency")]
struct Args {
    /// Mooncake-format JSONL trace.
    #[arg(long, env = "PREFIXLOG_TRACE", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mooncake/conversation_trace.jsonl"))]
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
    /// Only the single-threaded replay and the checkpoint path (dump + rebuild), skipping the
    /// writer + concurrent reader run.
    #[arg(long)]
    skip_concurrent: bool,
    /// The writer + concurrent reader run keeps two copies of the keyspace (`serve
    /// --query-copy`): the reader never waits on the writer, which does every write twice.
    #[arg(long)]
    query_copy: bool,
    /// Every store is also applied to the worker's host-tier holder, and removals only to its
    /// GPU one (an engine that offloads everything it evicts, with room for it): matches take
    /// the tier path, which combines each worker's tiers. Compare with a run without it.
    #[arg(long)]
    host_copies: bool,
    /// Also apply the writes on this many threads, each applying the workers of its own share
    /// (worker mod N, as partitions split them), once into one shared engine (the keyspace's
    /// write lock between them) and once into one engine per thread (stripes, as shard replicas
    /// have): apply scaling with cores. 1 skips it.
    #[arg(long, default_value_t = 1)]
    writers: usize,
    /// Matches ask for the k best holders only (a gateway's question); default: every holder.
    #[arg(long)]
    top_k: Option<usize>,
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    v.sort_unstable();
    v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
        .map_or(f64::NAN, |&x| x as f64 / 1e3)
}

fn apply(e: &Engine, id: &KeyspaceId, step: &Step, t: u64, host_copies: bool) -> u64 {
    let start = Instant::now();
    match step {
        Step::Stored { worker, parent_ext, blocks } => {
            let key = HolderKey::new(u64::from(*worker), 0, 0);
            let _ = e.store(id, key, *parent_ext, blocks, t);
            if host_copies {
                let _ = e.store(id, key.on(Tier::Host), *parent_ext, blocks, t);
            }
        }
        Step::Removed { worker, exts } => {
            e.remove(id, HolderKey::new(u64::from(*worker), 0, 0), exts, t);
        }
        Step::Match { .. } => {}
    }
    start.elapsed().as_nanos() as u64
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let cfg = FleetConfig {
        workers: a.workers,
        capacity_blocks: a.capacity,
        stretch: a.stretch,
        copies: a.copies,
        seed: 1,
    };
    let trace = load_trace(&a.trace)?;
    let steps = Arc::new(generate(&trace, &cfg));
    let writes: u64 = steps.iter().map(|s| s.write_blocks() as u64).sum();
    println!(
        "workload: {} requests x {} copies, stretch {}, {} workers, {}-block LRU: {} steps, {} write blocks, {} resident holder-blocks",
        trace.len(), a.copies, a.stretch, a.workers, a.capacity, steps.len(), writes, resident_holder_blocks(&steps)
    );
    let id = KeyspaceId::new("trace", 64, 1);
    let host_copies = a.host_copies;

    // 1. Single-threaded replay.
    let e = Engine::new(EngineConfig::default());
    let (mut write_ns, mut lat, mut listed) = (0u64, Vec::new(), 0usize);
    let match_opts = MatchOptions { top_k: a.top_k, ..Default::default() };
    for (t, s) in steps.iter().enumerate() {
        if let Step::Match { locals } = s {
            let q = Instant::now();
            let r = e.match_chain(&id, locals, &match_opts);
            lat.push(q.elapsed().as_nanos() as u64);
            listed += r.as_ref().map_or(0, Vec::len);
            std::hint::black_box(r);
        } else {
            write_ns += apply(&e, &id, s, t as u64, host_copies);
        }
    }
    let ks = e.keyspace(&id).expect("keyspace");
    let (nodes, hb, heap) = {
        let g = ks.read();
        (g.node_count(), g.holder_blocks(), g.heap_bytes())
    };
    println!(
        "\n| run | writes (M blocks/s) | match p50 µs | match p99 µs | match max µs | holders per answer |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let per_answer = listed as f64 / lat.len().max(1) as f64;
    println!(
        "| single thread{}{} | {:.2} | {:.1} | {:.1} | {:.1} | {per_answer:.1} |",
        if a.host_copies { ", host copies (tier path)" } else { "" },
        a.top_k.map(|k| format!(", top_k {k}")).unwrap_or_default(),
        writes as f64 / (write_ns as f64 / 1e9) / 1e6,
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0)
    );

    // Checkpoint path: enumerate (runs while ingest is paused) and rebuild (restart).
    let t = Instant::now();
    let dump = ks.read().dump();
    let dump_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let rebuilt = prefixlog_engine::Keyspace::rebuild(&dump, EngineConfig::default()).expect("rebuild");
    let rebuild_s = t.elapsed().as_secs_f64();
    assert_eq!(rebuilt.digest(), ks.read().digest());
    drop((dump, rebuilt));
    // Image path: the in-memory layout written out and restored with bulk copies.
    let t = Instant::now();
    let mut image = Vec::new();
    ks.read().write_image(&mut image)?;
    let image_write_s = t.elapsed().as_secs_f64();
    // Restored 7 times, the median reported (tens of ms each: one run is at the mercy of the
    // machine); once as bytes of unknown provenance (every section hashed) and once as a
    // checkpoint store hands them over (verified end to end already).
    let median_restore = |read: fn(&[u8], EngineConfig) -> Result<prefixlog_engine::Keyspace, _>| {
        let mut secs: Vec<f64> = (0..7)
            .map(|_| {
                let t = Instant::now();
                let restored = read(&image, EngineConfig::default()).expect("restore");
                let s = t.elapsed().as_secs_f64();
                assert_eq!(restored.digest(), ks.read().digest());
                s
            })
            .collect();
        secs.sort_by(f64::total_cmp);
        secs[secs.len() / 2]
    };
    let image_read_s = median_restore(prefixlog_engine::Keyspace::read_image);
    let verified_read_s = median_restore(prefixlog_engine::Keyspace::read_verified_image);
    let image_line = format!(
        "image path: write {image_write_s:.2} s, restore (verify + load, ready to answer; median of 7) {image_read_s:.3} s = {:.1} M holder-blocks/s, already verified {verified_read_s:.3} s = {:.1} M holder-blocks/s, {:.0} MiB",
        hb as f64 / image_read_s / 1e6,
        hb as f64 / verified_read_s / 1e6,
        image.len() as f64 / (1 << 20) as f64
    );
    drop(image);
    if a.writers > 1 {
        parallel_writes(&steps, &id, a.writers, writes, host_copies);
    }
    if a.skip_concurrent {
        println!(
            "checkpoint path: dump {dump_s:.2} s ({:.1} M holder-blocks/s), rebuild {rebuild_s:.2} s ({:.1} M holder-blocks/s)",
            hb as f64 / dump_s / 1e6,
            hb as f64 / rebuild_s / 1e6
        );
        println!("{image_line}");
        return Ok(());
    }

    // 2. One writer applying every event, one reader querying concurrently.
    let e = Arc::new(Engine::new(EngineConfig::default()));
    if a.query_copy {
        e.keep_query_copies();
    }
    e.keyspace_or_create(&id);
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (e, steps, id, done) = (e.clone(), steps.clone(), id.clone(), done.clone());
        std::thread::spawn(move || {
            let mut holds = Vec::with_capacity(steps.len());
            let start = Instant::now();
            for (t, s) in steps.iter().enumerate() {
                if !matches!(s, Step::Match { .. }) {
                    holds.push(apply(&e, &id, s, t as u64, host_copies));
                }
            }
            let el = start.elapsed();
            done.store(true, Ordering::Release);
            (holds, el)
        })
    };
    let queries: Vec<&Vec<u64>> = steps
        .iter()
        .filter_map(|s| if let Step::Match { locals } = s { Some(locals) } else { None })
        .collect();
    let (mut lat, mut waits) = (Vec::new(), Vec::new());
    let ks = e.keyspace(&id).expect("keyspace");
    let mut i = 0;
    while !done.load(Ordering::Acquire) {
        let q = Instant::now();
        let guard = ks.read();
        waits.push(q.elapsed().as_nanos() as u64);
        std::hint::black_box(guard.match_chain(queries[i % queries.len()], &MatchOptions::default()));
        drop(guard);
        lat.push(q.elapsed().as_nanos() as u64);
        i += 1;
    }
    let (mut events, el) = writer.join().expect("writer");
    println!(
        "| writer + concurrent reader{} | {:.2} | {:.1} | {:.1} | {:.1} |",
        if a.query_copy { " (two copies)" } else { "" },
        writes as f64 / el.as_secs_f64() / 1e6,
        pct(&mut lat, 0.5),
        pct(&mut lat, 0.99),
        pct(&mut lat, 1.0)
    );
    println!(
        "\napply time per event (write lock taken once per {} blocks): p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs ({} events, {} concurrent queries)",
        EngineConfig::default().max_blocks_per_lock,
        pct(&mut events, 0.5),
        pct(&mut events, 0.99),
        pct(&mut events, 0.999),
        pct(&mut events, 1.0),
        events.len(),
        lat.len()
    );
    println!(
        "query wait for the read lock while the writer applies: p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs",
        pct(&mut waits, 0.5),
        pct(&mut waits, 0.99),
        pct(&mut waits, 0.999),
        pct(&mut waits, 1.0)
    );
    println!(
        "checkpoint path: dump {:.2} s ({:.1} M holder-blocks/s), rebuild {:.2} s ({:.1} M holder-blocks/s)",
        dump_s,
        hb as f64 / dump_s / 1e6,
        rebuild_s,
        hb as f64 / rebuild_s / 1e6
    );
    println!("{image_line}");
    println!(
        "state: {nodes} nodes, {hb} holder-blocks, ~{:.0} B/holder-block (arena + tables estimate; the peer harness measures allocator bytes)",
        heap as f64 / hb.max(1) as f64
    );
    Ok(())
}

/// The writes applied on `n` threads, each applying its share of the workers in log order:
/// into one shared engine, and into one engine per thread. Prints M blocks/s of each.
fn parallel_writes(steps: &Arc<Vec<Step>>, id: &KeyspaceId, n: usize, writes: u64, host_copies: bool) {
    let run = |engines: Vec<Arc<Engine>>| {
        let start = Instant::now();
        let threads: Vec<_> = (0..n)
            .map(|share| {
                let (steps, id, e) = (steps.clone(), id.clone(), engines[share % engines.len()].clone());
                std::thread::spawn(move || {
                    for (t, s) in steps.iter().enumerate() {
                        let worker = match s {
                            Step::Stored { worker, .. } | Step::Removed { worker, .. } => *worker as usize,
                            Step::Match { .. } => continue,
                        };
                        if worker % n == share {
                            apply(&e, &id, s, t as u64, host_copies);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().expect("writer"));
        let secs = start.elapsed().as_secs_f64();
        let hb: u64 = engines.iter().map(|e| e.holder_blocks()).sum();
        (writes as f64 / secs / 1e6, hb)
    };
    let fresh = || Arc::new(Engine::new(EngineConfig::default()));
    let (one, one_hb) = run(vec![fresh()]);
    let (striped, striped_hb) = run((0..n).map(|_| fresh()).collect());
    let (serial, serial_hb) = {
        let e = fresh();
        let start = Instant::now();
        for (t, s) in steps.iter().enumerate() {
            apply(&e, id, s, t as u64, host_copies);
        }
        (writes as f64 / start.elapsed().as_secs_f64() / 1e6, e.holder_blocks())
    };
    assert_eq!((one_hb, striped_hb), (serial_hb, serial_hb), "every layout holds the same blocks");
    println!("\n| writes on {n} threads (wall clock, M blocks/s) | one thread | {n} threads, one engine | {n} threads, an engine each |");
    println!("|---|---:|---:|---:|");
    println!(
        "| M blocks/s | {serial:.2} | {one:.2} ({:.2}×) | {striped:.2} ({:.2}×) |",
        one / serial,
        striped / serial
    );
}
