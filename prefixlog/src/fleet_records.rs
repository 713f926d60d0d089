//! The trace workload as log records: one KV event batch per engine event, per-worker seqs.

use prefixlog_engine::KeyspaceId;
use prefixlog_state::record::encode_kv_events;
use prefixlog_state::{KvOp, Tier};
use prefixlog_workload::{generate, load_trace, repeat_hours, FleetConfig, Step};
use std::path::Path;

#[derive(clap::Args, Clone, Debug)]
pub struct WorkloadArgs {
    /// Mooncake-format JSONL trace.
    #[arg(long, env = "PREFIXLOG_TRACE", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mooncake/conversation_trace.jsonl"))]
    pub trace: std::path::PathBuf,
    /// Simulated workers.
    #[arg(long, env = "PREFIXLOG_WORKLOAD_WORKERS", default_value_t = 256)]
    pub workers: usize,
    /// LRU capacity of each worker, in blocks.
    #[arg(long, env = "PREFIXLOG_WORKLOAD_CAPACITY", default_value_t = 8192)]
    pub capacity: usize,
    /// Blocks per trace id.
    #[arg(long, env = "PREFIXLOG_WORKLOAD_STRETCH", default_value_t = 8)]
    pub stretch: usize,
    /// Disjoint interleaved copies of the trace.
    #[arg(long, env = "PREFIXLOG_WORKLOAD_COPIES", default_value_t = 1)]
    pub copies: usize,
}

/// One encoded record: (worker, value, blocks it carries, trace time of its request).
pub struct FleetRecord {
    pub worker: u64,
    pub value: Vec<u8>,
    pub blocks: usize,
    pub time_ms: u64,
}

pub fn keyspace() -> KeyspaceId {
    KeyspaceId::new("trace", 64, 1)
}

/// The trace workload's records; `hours` > 1 repeats the trace with fresh content each hour
/// ([`repeat_hours`]).
pub fn fleet_records(a: &WorkloadArgs, hours: usize) -> anyhow::Result<Vec<FleetRecord>> {
    let trace = repeat_hours(&load_trace(Path::new(&a.trace))?, hours);
    let cfg = FleetConfig {
        workers: a.workers,
        capacity_blocks: a.capacity,
        stretch: a.stretch,
        copies: a.copies,
        seed: 1,
    };
    let mut seq = vec![0u64; a.workers];
    let ks = keyspace();
    let mut out = Vec::new();
    // generate() emits one Match per (request, copy) before that request's events.
    let mut request = 0usize;
    let mut time_ms = 0;
    for s in generate(&trace, &cfg) {
        let (w, op, blocks) = match s {
            Step::Stored { worker, parent_ext, blocks } => {
                let n = blocks.len();
                (worker, KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext, blocks }, n)
            }
            Step::Removed { worker, exts } => {
                let n = exts.len();
                (worker, KvOp::Removed { tier: Tier::Gpu, lane: 0, exts }, n)
            }
            Step::Match { .. } => {
                time_ms = trace.get(request / a.copies.max(1)).map_or(time_ms, |r| r.timestamp_ms);
                request += 1;
                continue;
            }
        };
        seq[w as usize] += 1;
        let value = encode_kv_events(&ks, u64::from(w), 0, 1, seq[w as usize], false, &[op]);
        out.push(FleetRecord { worker: u64::from(w), value, blocks, time_ms });
    }
    Ok(out)
}
