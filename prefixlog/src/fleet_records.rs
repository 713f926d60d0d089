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
    /// Identical copies of each simulated worker: every event of worker `w` is also published
    /// for workers `w + k × workers`, k < this (Dynamo's INDEXER_BENCH `-d`, its worker
    /// duplication factor). Effective workers: workers × worker copies.
    #[arg(long, env = "PREFIXLOG_WORKLOAD_WORKER_COPIES", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub worker_copies: u64,
}

impl WorkloadArgs {
    /// Distinct worker ids the records name: workers × worker copies.
    pub fn effective_workers(&self) -> u64 {
        self.workers as u64 * self.worker_copies
    }
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
    fleet_records_in(a, hours, &keyspace(), 0)
}

/// [`fleet_records`] in keyspace `ks`, every worker id `first_worker` higher (so that the
/// same workload in several keyspaces of one log has feeds of its own).
pub fn fleet_records_in(
    a: &WorkloadArgs,
    hours: usize,
    ks: &KeyspaceId,
    first_worker: u64,
) -> anyhow::Result<Vec<FleetRecord>> {
    let trace = repeat_hours(&load_trace(Path::new(&a.trace))?, hours);
    let cfg = FleetConfig {
        workers: a.workers,
        capacity_blocks: a.capacity,
        stretch: a.stretch,
        copies: a.copies,
        seed: 1,
    };
    let mut seq = vec![0u64; a.effective_workers() as usize];
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
        for copy in 0..a.worker_copies {
            let w = u64::from(w) + copy * a.workers as u64;
            seq[w as usize] += 1;
            let worker = first_worker + w;
            let value = encode_kv_events(ks, worker, 0, 1, seq[w as usize], false, std::slice::from_ref(&op));
            out.push(FleetRecord { worker, value, blocks, time_ms });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixlog_state::record::{decode, Op};

    fn args(worker_copies: u64) -> WorkloadArgs {
        WorkloadArgs {
            trace: concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mooncake/conversation_trace.jsonl").into(),
            workers: 8,
            capacity: 256,
            stretch: 1,
            copies: 1,
            worker_copies,
        }
    }

    /// Dynamo's `-d`: every record of worker w again for w + 8, w + 16, each copy with its
    /// own sequence, the same events.
    #[test]
    fn worker_copies_repeat_each_record_for_distinct_workers() {
        let (one, three) = (fleet_records(&args(1), 1).unwrap(), fleet_records(&args(3), 1).unwrap());
        assert_eq!(three.len(), 3 * one.len());
        assert_eq!(args(3).effective_workers(), 24);
        let events = |r: &FleetRecord| match decode(Some(&r.value), 0, 1, 1 << 20).unwrap() {
            Op::KvEvents { worker, seq, events, .. } => (worker, seq, events),
            _ => panic!("a KV events record"),
        };
        let mut next_seq = [1u64; 24];
        for (i, base) in one.iter().enumerate() {
            let (w, _, base_events) = events(base);
            for copy in 0..3 {
                let r = &three[3 * i + copy as usize];
                let (worker, seq, evs) = events(r);
                assert_eq!((worker, r.worker, r.blocks), (w + 8 * copy, w + 8 * copy, base.blocks));
                assert_eq!(seq, next_seq[worker as usize], "each effective worker's own sequence");
                next_seq[worker as usize] += 1;
                assert_eq!(evs, base_events);
            }
        }
    }
}
