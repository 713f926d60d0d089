//! `prefixlog-lab bench-routing`: routing quality with 1..16 gateways, in-process.
//!
//! Runs the trace through a fleet of LRU caches once per (gateway count, mode), directly
//! against the engine (no Kafka, no gRPC: fast and deterministic). Modes, all with the same
//! policy ([`Load::choose`]: matched depth minus a load cost):
//! - shared: one engine keyspace fed with every worker's KV events, as every replica is; with
//!   `--lag N` an event becomes visible only N requests after it happened (replication lag);
//! - local: every gateway keeps its own prefix tree fed only with its own routing decisions;
//! - oracle: the fleet's true caches.
//!
//! Requests are dealt to gateways in turn. Hit ratio = blocks the chosen worker already held /
//! request blocks.

use super::policy::{oracle_depths, Load, LocalTree};
use prefixlog_engine::{EngineConfig, HolderKey, Keyspace, KeyspaceId, MatchOptions};
use prefixlog_workload::{expand_request, load_trace, BlockHashes, Event, Fleet};
use std::collections::VecDeque;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Mooncake-format JSONL trace.
    #[arg(long, env = "PREFIXLOG_TRACE", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mooncake/conversation_trace.jsonl"))]
    pub trace: std::path::PathBuf,
    /// Use only the first N requests (0: all).
    #[arg(long, env = "PREFIXLOG_ROUTING_REQUESTS", default_value_t = 0)]
    pub requests: usize,
    /// Simulated workers.
    #[arg(long, env = "PREFIXLOG_ROUTING_WORKERS", default_value_t = 16)]
    pub workers: usize,
    /// LRU capacity of each worker, in blocks.
    #[arg(long, env = "PREFIXLOG_ROUTING_CAPACITY", default_value_t = 16384)]
    pub capacity: usize,
    /// Blocks per trace id.
    #[arg(long, env = "PREFIXLOG_ROUTING_STRETCH", default_value_t = 8)]
    pub stretch: usize,
    /// Gateway counts to run.
    #[arg(long, env = "PREFIXLOG_ROUTING_GATEWAYS", value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub gateways: Vec<usize>,
    /// Shared index staleness: events become visible this many requests later.
    #[arg(long, env = "PREFIXLOG_ROUTING_LAG", default_value_t = 0)]
    pub lag: usize,
}

#[derive(Clone, Copy)]
enum Mode {
    Shared,
    Local,
    Oracle,
}

fn simulate(a: &Args, chains: &[(u64, Vec<BlockHashes>)], gateways: usize, mode: Mode) -> f64 {
    let mut fleet = Fleet::new(a.workers, a.capacity);
    let mut load = Load::new(a.workers);
    let mut trees: Vec<LocalTree> = (0..gateways).map(|_| LocalTree::new(a.capacity)).collect();
    let mut index = Keyspace::new(KeyspaceId::new("sim", 64, 1), EngineConfig::default());
    let mut pending: VecDeque<(usize, Event)> = VecDeque::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for (i, (t, chain)) in chains.iter().enumerate() {
        let locals: Vec<u64> = chain.iter().map(|b| b.local).collect();
        while pending.front().is_some_and(|(at, _)| at + a.lag <= i) {
            let (_, ev) = pending.pop_front().expect("non-empty");
            match ev {
                Event::Stored { worker, parent_ext, blocks } => {
                    let _ = index.store(HolderKey::new(u64::from(worker), 0, 0), parent_ext, &blocks, *t);
                }
                Event::Removed { worker, exts } => {
                    index.remove(HolderKey::new(u64::from(worker), 0, 0), &exts, *t);
                }
            }
        }
        let depths: Vec<(u32, u32)> = match mode {
            Mode::Oracle => oracle_depths(&fleet, chain),
            Mode::Local => trees[i % gateways].depths(&locals),
            Mode::Shared => index
                .match_chain(&locals, &MatchOptions::default())
                .into_iter()
                .map(|m| (m.holder.worker as u32, m.depth))
                .collect(),
        };
        let w = load.choose(&depths);
        hit += fleet.cached_prefix(w, chain) as u64;
        total += chain.len() as u64;
        load.routed(w);
        let events = fleet.serve(w, chain);
        match mode {
            Mode::Local => trees[i % gateways].routed(w, &locals, *t + 1),
            Mode::Shared => pending.extend(events.into_iter().map(|e| (i, e))),
            Mode::Oracle => {}
        }
    }
    hit as f64 / total.max(1) as f64
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut trace = load_trace(&a.trace)?;
    if a.requests > 0 {
        trace.truncate(a.requests);
    }
    let chains: Vec<(u64, Vec<BlockHashes>)> = trace
        .iter()
        .map(|r| {
            let mut c = expand_request(r, 0, a.stretch);
            c.truncate(a.capacity);
            (r.timestamp_ms + 1, c)
        })
        .filter(|(_, c)| !c.is_empty())
        .collect();
    println!(
        "{} requests, {} workers ({}-block LRU), stretch {}, shared-index lag {} requests; in-process (engine, no Kafka/gRPC)\n",
        chains.len(),
        a.workers,
        a.capacity,
        a.stretch,
        a.lag
    );
    println!("| gateways | shared index | gateway-local trees | oracle | shared / oracle | local / oracle |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for &g in &a.gateways {
        let g = g.max(1);
        let s = simulate(&a, &chains, g, Mode::Shared);
        let l = simulate(&a, &chains, g, Mode::Local);
        let o = simulate(&a, &chains, g, Mode::Oracle);
        println!("| {g} | {s:.3} | {l:.3} | {o:.3} | {:.3} | {:.3} |", s / o, l / o);
    }
    Ok(())
}
