//! Replays a generated step stream through one `Index` and measures it.

use crate::alloc;
use crate::index::Index;
use prefixlog_workload::quantile::nearest_rank;
use prefixlog_workload::Step;
use std::time::Instant;

/// Sorted `(worker, depth)` pairs with depth > 0: the normalized answer of one query.
pub type Answer = Vec<(u32, u32)>;

pub struct RunResult {
    pub name: String,
    /// Blocks carried by Stored + Removed steps (removals count: evicting is half the work).
    pub write_blocks: u64,
    /// Of those, the blocks of Removed steps.
    pub removed_blocks: u64,
    /// Time inside `stored()` / `removed()`.
    pub write_ns: u64,
    /// Of that, the time inside `removed()`.
    pub remove_ns: u64,
    /// Time inside `flush()` (before each query, plus once at the end): the rest of the writes.
    pub flush_ns: u64,
    /// Of that, the final `flush()`: the drain of writes still queued when the replay ends.
    pub drain_ns: u64,
    /// Per-`query()` latency, sorted ascending.
    pub lat_ns: Vec<u64>,
    /// Live heap bytes after the replay minus before the index was built.
    pub bytes: i64,
    /// `Some` when compared against a reference: (mismatching queries, first mismatch detail).
    pub mismatches: Option<(u64, Option<String>)>,
    pub notes: String,
}

impl RunResult {
    pub fn write_mblocks_per_s(&self) -> f64 {
        self.write_blocks as f64 / ((self.write_ns + self.flush_ns) as f64 / 1e9) / 1e6
    }

    /// The `p`-quantile of the query latencies in µs (the workspace's one rule: nearest rank).
    pub fn percentile_us(&self, p: f64) -> f64 {
        nearest_rank(&self.lat_ns, p).map_or(f64::NAN, |ns| ns as f64 / 1e3)
    }
}

/// Replays `steps` into a fresh index from `make`. With `reference == None` the answers are
/// recorded into it (this run becomes the reference); otherwise they are compared with it.
pub fn run(
    make: &dyn Fn() -> Box<dyn Index>,
    steps: &[Step],
    reference: &mut Option<Vec<Answer>>,
) -> RunResult {
    let n_queries = steps.iter().filter(|s| matches!(s, Step::Match { .. })).count();
    // Everything the harness keeps is allocated before the baseline or untracked.
    let mut lat_ns: Vec<u64> = Vec::with_capacity(n_queries);
    let recording = reference.is_none();
    let mut recorded: Vec<Answer> =
        alloc::untracked(|| Vec::with_capacity(if recording { n_queries } else { 0 }));
    let mut mismatches = 0u64;
    let mut first_mismatch: Option<String> = None;
    let (mut write_ns, mut flush_ns, mut write_blocks) = (0u64, 0u64, 0u64);
    let (mut remove_ns, mut removed_blocks) = (0u64, 0u64);

    let baseline = alloc::live_bytes();
    let mut index = make();
    for step in steps {
        match step {
            Step::Stored { worker, parent_ext, blocks } => {
                let t = Instant::now();
                index.stored(*worker, *parent_ext, blocks);
                write_ns += t.elapsed().as_nanos() as u64;
                write_blocks += blocks.len() as u64;
            }
            Step::Removed { worker, exts } => {
                let t = Instant::now();
                index.removed(*worker, exts);
                let ns = t.elapsed().as_nanos() as u64;
                (write_ns, remove_ns) = (write_ns + ns, remove_ns + ns);
                write_blocks += exts.len() as u64;
                removed_blocks += exts.len() as u64;
            }
            Step::Match { locals } => {
                let t = Instant::now();
                index.flush();
                flush_ns += t.elapsed().as_nanos() as u64;
                let t = Instant::now();
                let mut ans = index.query(locals);
                lat_ns.push(t.elapsed().as_nanos() as u64);
                ans.retain(|&(_, d)| d > 0);
                ans.sort_unstable();
                let qi = lat_ns.len() - 1;
                if recording {
                    alloc::untracked(|| recorded.push(ans.clone()));
                } else {
                    let want = &reference.as_ref().expect("reference present")[qi];
                    if &ans != want {
                        mismatches += 1;
                        if first_mismatch.is_none() {
                            first_mismatch =
                                Some(alloc::untracked(|| describe(qi, locals.len(), want, &ans)));
                        }
                    }
                }
            }
        }
    }
    let t = Instant::now();
    index.flush();
    let drain_ns = t.elapsed().as_nanos() as u64;
    flush_ns += drain_ns;
    let bytes = (alloc::live_bytes() - baseline) as i64;
    let name = index.name().to_string();
    let notes = index.notes();
    drop(index);

    lat_ns.sort_unstable();
    if recording {
        *reference = Some(recorded);
    } else {
        alloc::untracked(|| drop(recorded));
    }
    RunResult {
        name,
        write_blocks,
        removed_blocks,
        write_ns,
        remove_ns,
        flush_ns,
        drain_ns,
        lat_ns,
        bytes,
        mismatches: (!recording).then_some((mismatches, first_mismatch)),
        notes,
    }
}

/// Human-readable first mismatch: the rows only one side has.
fn describe(qi: usize, chain_len: usize, want: &Answer, got: &Answer) -> String {
    let only = |a: &Answer, b: &Answer| -> Vec<(u32, u32)> {
        a.iter().filter(|x| b.binary_search(x).is_err()).copied().take(8).collect()
    };
    format!(
        "query #{qi} (chain of {chain_len} blocks): reference has {} rows, this has {}; \
         (worker, depth) only in reference: {:?}; only here: {:?}",
        want.len(),
        got.len(),
        only(want, got),
        only(got, want)
    )
}
