//! Trace-driven workload: a simulated fleet of inference workers with LRU block caches.
//!
//! This is the one workload generator that the engine benchmark, the peer comparison
//! (`bench/peers`), the Kafka benchmarks and the demo share, so their numbers describe the
//! same stream.
//!
//! Module map:
//! - [`trace`]: loading the Mooncake-format JSONL trace (`hash_ids` are chained 512-token blocks)
//!   and expanding a request into a chain of `(ext, local)` block hashes.
//! - [`fleet`]: per-worker LRU caches that turn "this worker serves this chain" into the
//!   `stored` / `removed` events a real engine (vLLM, SGLang) would publish.
//! - [`heap`]: [`heap::CountingAlloc`], a counting global allocator for exact heap costs.
//! - [`quantile`]: the one quantile rule (nearest rank) and median every benchmark prints.
//! - [`generate`]: the event stream used by the benchmarks: a match query before every request,
//!   then the events of the worker it is routed to ([`Routing`]: by conversation, or at random
//!   with [`generate_routed`]).

pub mod fleet;
pub mod heap;
pub mod quantile;
pub mod trace;

pub use fleet::{Event, Fleet};
pub use prefixlog_ids::BlockHashes;
pub use trace::{expand_request, load_trace, repeat_hours, repeat_period_ms, TraceRequest};

/// Shape of the simulated fleet and of the trace expansion.
#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Number of workers requests are spread over.
    pub workers: usize,
    /// LRU capacity of each worker, in blocks.
    pub capacity_blocks: usize,
    /// Each trace id becomes this many consecutive blocks (a 512-token id at block size 64 is 8).
    pub stretch: usize,
    /// Disjoint copies of the trace, interleaved request by request (more distinct prefixes).
    pub copies: usize,
    /// Seed of the request → worker assignment.
    pub seed: u64,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self { workers: 256, capacity_blocks: 8192, stretch: 8, copies: 2, seed: 1 }
    }
}

/// One step of a generated stream, in the order it must be applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A match query for a request's whole chain of local hashes (issued before routing it).
    Match { locals: Vec<u64> },
    /// A worker stored `blocks` extending the chain that ends at `parent_ext`.
    Stored { worker: u32, parent_ext: Option<u64>, blocks: Vec<BlockHashes> },
    /// A worker evicted the blocks with these ext hashes.
    Removed { worker: u32, exts: Vec<u64> },
}

impl Step {
    /// Number of blocks this step writes (0 for queries).
    pub fn write_blocks(&self) -> usize {
        match self {
            Step::Match { .. } => 0,
            Step::Stored { blocks, .. } => blocks.len(),
            Step::Removed { exts, .. } => exts.len(),
        }
    }
}

/// How [`generate_routed`] picks the worker that serves a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// A seeded hash of the request's conversation (its second trace id, the first being the
    /// shared root): follow-up turns land on the worker that holds the earlier ones, as a good
    /// router would do. Few workers hold any one prefix beyond the root.
    Conversation,
    /// A seeded hash of the request's position in the trace: every request to a random
    /// worker. Popular prefixes end up held by many workers at once (the shape of a shared
    /// system prompt across a fleet), and every turn re-stores its conversation's history on
    /// another worker.
    Random,
}

/// The conversation-routed stream ([`Routing::Conversation`]).
pub fn generate(trace: &[TraceRequest], cfg: &FleetConfig) -> Vec<Step> {
    generate_routed(trace, cfg, Routing::Conversation)
}

/// Every request (of every copy) in trace order: a match query for its chain, then the
/// events of the worker `routing` sends it to.
pub fn generate_routed(trace: &[TraceRequest], cfg: &FleetConfig, routing: Routing) -> Vec<Step> {
    let mut fleet = Fleet::new(cfg.workers, cfg.capacity_blocks);
    let mut steps = Vec::with_capacity(trace.len() * cfg.copies * 3);
    for (i, req) in trace.iter().enumerate() {
        for copy in 0..cfg.copies {
            let chain = expand_request(req, copy, cfg.stretch);
            if chain.is_empty() {
                continue;
            }
            steps.push(Step::Match { locals: chain.iter().map(|b| b.local).collect() });
            let worker = match routing {
                Routing::Conversation => route_by_conversation(req, copy, cfg),
                Routing::Random => route_at_random(i, copy, cfg),
            };
            for ev in fleet.serve(worker, &chain) {
                steps.push(match ev {
                    Event::Stored { worker, parent_ext, blocks } => {
                        Step::Stored { worker, parent_ext, blocks }
                    }
                    Event::Removed { worker, exts } => Step::Removed { worker, exts },
                });
            }
        }
    }
    steps
}

/// Blocks resident per worker at the end of a stream: stored minus removed.
pub fn resident_holder_blocks(steps: &[Step]) -> u64 {
    let mut n: i64 = 0;
    for s in steps {
        match s {
            Step::Stored { blocks, .. } => n += blocks.len() as i64,
            Step::Removed { exts, .. } => n -= exts.len() as i64,
            Step::Match { .. } => {}
        }
    }
    n.max(0) as u64
}

fn route_by_conversation(req: &TraceRequest, copy: usize, cfg: &FleetConfig) -> u32 {
    let conv = req.hash_ids.get(1).or(req.hash_ids.first()).copied().unwrap_or(0);
    let h = trace::mix64(conv ^ trace::mix64(copy as u64 ^ cfg.seed));
    (h % cfg.workers.max(1) as u64) as u32
}

/// Request `index` of copy `copy` to a worker drawn from a seeded hash (deterministic).
fn route_at_random(index: usize, copy: usize, cfg: &FleetConfig) -> u32 {
    let h = trace::mix64(index as u64 ^ trace::mix64(copy as u64 ^ cfg.seed ^ 0x005e_ed0f_4a4d));
    (h % cfg.workers.max(1) as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_trace() -> Vec<TraceRequest> {
        (0..200u64).map(|i| TraceRequest { timestamp_ms: i, hash_ids: vec![0, 1 + i % 7, 100 + i] }).collect()
    }

    #[test]
    fn generated_stream_is_consistent() {
        for routing in [Routing::Conversation, Routing::Random] {
            let cfg = FleetConfig { workers: 4, capacity_blocks: 20, stretch: 2, copies: 2, seed: 3 };
            check_consistent(&generate_routed(&small_trace(), &cfg, routing), 4, 20);
        }
    }

    /// Random routing spreads one conversation's turns over the fleet; conversation routing
    /// keeps them on one worker.
    #[test]
    fn random_routing_spreads_conversations() {
        let cfg = FleetConfig { workers: 16, capacity_blocks: 1000, stretch: 1, copies: 1, seed: 3 };
        let trace = small_trace();
        let workers_of_conversation = |routing| {
            let mut seen = std::collections::BTreeSet::new();
            let mut conv = None;
            for s in generate_routed(&trace, &cfg, routing) {
                match s {
                    Step::Match { locals } => conv = Some(locals[1]),
                    Step::Stored { worker, .. } if conv == Some(expand_request(&trace[0], 0, 1)[1].local) => {
                        seen.insert(worker);
                    }
                    _ => {}
                }
            }
            seen.len()
        };
        assert_eq!(workers_of_conversation(Routing::Conversation), 1);
        assert!(workers_of_conversation(Routing::Random) >= 8);
        assert_eq!(generate(&trace, &cfg), generate_routed(&trace, &cfg, Routing::Conversation));
        assert_eq!(
            generate_routed(&trace, &cfg, Routing::Random),
            generate_routed(&trace, &cfg, Routing::Random)
        );
    }

    /// Replays a stream into a per-worker set of exts: every removal names a held block, every
    /// parent is held, and no worker ever exceeds its capacity.
    fn check_consistent(steps: &[Step], workers: usize, capacity: usize) {
        let mut held: Vec<rustc_hash::FxHashSet<u64>> = vec![Default::default(); workers];
        for s in steps {
            match s {
                Step::Stored { worker, parent_ext, blocks } => {
                    let h = &mut held[*worker as usize];
                    if let Some(p) = parent_ext {
                        assert!(h.contains(p), "parent not held");
                    }
                    for b in blocks {
                        assert!(h.insert(b.ext), "stored twice");
                    }
                    assert!(h.len() <= capacity);
                }
                Step::Removed { worker, exts } => {
                    for e in exts {
                        assert!(held[*worker as usize].remove(e), "removed unheld");
                    }
                }
                Step::Match { .. } => {}
            }
        }
        let resident: usize = held.iter().map(|h| h.len()).sum();
        assert_eq!(resident as u64, resident_holder_blocks(steps));
        assert!(steps.iter().any(|s| matches!(s, Step::Removed { .. })));
    }
}
