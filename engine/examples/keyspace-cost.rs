//! What a keyspace costs: resident memory (RSS, from /proc/self/statm) and live heap bytes (a
//! counting allocator) per keyspace, for N empty keyspaces and for N keyspaces holding one
//! block of one holder each. Issue 34 measured ~0.8 MB per keyspace created by a removal.
//!
//!   cargo run --release -p prefixlog-engine --example keyspace-cost -- --keyspaces 2000

use clap::Parser;
use prefixlog_engine::{BlockHashes, Engine, EngineConfig, HolderKey, Keyspace, KeyspaceId};
use prefixlog_workload::heap::{live_bytes, CountingAlloc};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

#[derive(Parser)]
#[command(about = "Resident and heap bytes per keyspace, empty and with one block")]
struct Args {
    /// Keyspaces to create in each phase.
    #[arg(long, default_value_t = 2000)]
    keyspaces: usize,
    /// Log partitions (keyspaces keep a digest per partition).
    #[arg(long, default_value_t = 16)]
    partitions: u32,
}

fn rss() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    pages * 4096
}

fn report(what: &str, n: usize, (rss0, heap0): (i64, isize)) {
    let (drss, dheap) = (rss() - rss0, live_bytes() - heap0);
    println!(
        "{what}: {n} keyspaces, RSS +{:.1} MiB ({} B each), heap +{:.1} MiB ({} B each)",
        drss as f64 / 1048576.0,
        drss / n as i64,
        dheap as f64 / 1048576.0,
        dheap / n as isize
    );
}

fn main() {
    let a = Args::parse();
    let cfg = EngineConfig { partitions: a.partitions, ..Default::default() };
    let start = (rss(), live_bytes());
    let empty: Vec<Keyspace> = (0..a.keyspaces)
        .map(|i| Keyspace::new(KeyspaceId::new(format!("m{i}"), 16, 1), cfg.clone()))
        .collect();
    report("empty (Keyspace::new)", a.keyspaces, start);
    drop(empty);
    let start = (rss(), live_bytes());
    let engine = Engine::new(cfg);
    for i in 0..a.keyspaces {
        let id = KeyspaceId::new(format!("m{i}"), 16, 1);
        engine
            .store(&id, HolderKey::new(i as u64, 0, 0), None, &[(i as u64 + 1, 7)].map(BlockHashes::from), 1)
            .expect("a chain");
    }
    report("one holder, one block (Engine::store)", a.keyspaces, start);
    assert_eq!(engine.keyspace_ids().len(), a.keyspaces);
}
