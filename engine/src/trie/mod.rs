//! The trie of one keyspace, path-compressed into runs.
//!
//! A run is a chain of consecutive block positions that share one membership list (every
//! holder in it holds every block of it, each block stamped by the same operation): matching
//! compares a run's locals as one contiguous slice and credits its members once, instead of
//! one dependent load per position. Runs are split where a chain branches (children hang only
//! off a run's last block) and where membership changes, and merged again with their only
//! child when a removal leaves the two with the same members ([`reclaim`]; rebuild lays them
//! out maximal). Runs hold at most [`MAX_RUN`] blocks, which bounds the cost of a split (runs
//! keep the path hashes of their two ends, every 64th block keeps its own, and
//! [`crate::digest::parent_path`] walks backwards from a run's end).
//!
//! Blocks of a run are a contiguous range of [`Blocks`] (`start..start + len`, with spare
//! capacity up to `cap` that a shrunk run keeps and a child run may reuse). Children are
//! found through the run's `first_child` or the edge table keyed by (parent block, local), and
//! blocks by canonical ext through the ext table ([`NodeTable`]: one probe, one read on a
//! match). Block ids never change while blocks live, so splitting a run rewrites only the run
//! ids of its smaller part and at most one table entry.
//!
//! Operation records end at run ends: a record's leaf is always the last block of its run,
//! and `pins` counts the records ending there (a pinned run is never freed).
//!
//! The files of this folder, by concern: this one holds the trie's shape and what reads it
//! (child and ext lookup, paths and digest terms, record windows, chains); [`insert`] adds to it
//! (walks a chain creating what it lacks, splits runs, links children, binds exts); [`reclaim`]
//! gives back (frees dead runs, merges runs a removal left equal, shrinks tails);
//! `same_holders` keeps the flag of a run whose only child has the same holders; [`grow_ahead`]
//! grows tables and block storage outside the write lock; `check` verifies the structure.
//! Below them: [`runs`] (the run records and their arena), [`blocks`] (per-block storage and
//! the allocator of block ranges) and [`table`] (the lookup tables).

pub(crate) mod blocks;
mod check;
pub(crate) mod grow_ahead;
pub(crate) mod insert;
mod reclaim;
pub(crate) mod runs;
mod same_holders;
pub(crate) mod table;

use crate::digest::{block_term, child_path, fold_mul, ROOT_PATH};
use blocks::{Blocks, ANCHOR, CHUNK, ROOT_BLOCK};
use runs::LIVE;
pub use runs::{Member, Members, Run, Runs};
use table::NodeTable;

/// The root's run: its one (virtual) block is [`ROOT_BLOCK`], the parent of top-level runs.
pub const ROOT: u32 = 0;
pub const NIL: u32 = u32::MAX;
/// Longest run. Long enough that a query walks few runs (a long document is one run), short
/// enough that a split (which rewrites the run ids of its smaller part) stays cheap.
pub const MAX_RUN: u32 = 4096;
const _: () = assert!(MAX_RUN as usize <= CHUNK);

/// The longest run new runs may have: [`MAX_RUN`], or less when a test lowers it to make
/// small states cross run boundaries (any value gives the same answers, digests and dumps;
/// only the layout differs).
#[cfg(not(any(test, feature = "testing")))]
#[inline]
pub fn max_run() -> u32 {
    MAX_RUN
}

#[cfg(any(test, feature = "testing"))]
static TEST_MAX_RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(MAX_RUN);

#[cfg(any(test, feature = "testing"))]
#[inline]
pub fn max_run() -> u32 {
    TEST_MAX_RUN.load(std::sync::atomic::Ordering::Relaxed)
}

/// Test-only: cuts new runs at `n` blocks (clamped to `1..=MAX_RUN`), process-wide.
#[cfg(any(test, feature = "testing"))]
pub fn set_max_run_for_test(n: u32) {
    TEST_MAX_RUN.store(n.clamp(1, MAX_RUN), std::sync::atomic::Ordering::Relaxed);
}
/// Spare capacity a run keeps past its last block (see [`Trie::trim_spare`]).
pub(crate) const SPARE_KEPT: u32 = 64;
/// How many blocks ahead a walk over a run's blocks prefetches their ext-table slots.
const PREFETCH_AHEAD: usize = 8;

const K_EDGE: u64 = 0x9e37_79b9_7f4a_7c15;
const K_EXT: u64 = 0xd6e8_feb8_6659_fd93;

#[inline]
pub fn edge_hash(parent: u32, local: u64) -> u64 {
    fold_mul(local ^ (u64::from(parent) << 29), K_EDGE)
}

#[inline]
pub fn ext_hash(ext: u64) -> u64 {
    fold_mul(ext, K_EXT)
}

/// Length of the common prefix of two slices. Compares 8 at a time first (branch-free
/// inside a group, so it vectorises): a match walks hundreds of locals per run.
#[inline]
pub fn common_prefix(a: &[u64], b: &[u64]) -> u32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        if x.iter().zip(y).fold(0, |d, (p, q)| d | (p ^ q)) != 0 {
            break;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i as u32
}

/// A stretch of blocks of one run: `(run, first block, count)`.
pub type Segment = (u32, u32, u32);

#[derive(Clone)]
pub struct Trie {
    pub blocks: Blocks,
    pub runs: Runs,
    pub(crate) edges: NodeTable,
    pub(crate) exts: NodeTable,
    live_runs: usize,
    live_blocks: usize,
}

impl Default for Trie {
    fn default() -> Self {
        Self::new()
    }
}

impl Trie {
    pub fn new() -> Self {
        let mut runs = Runs::default();
        let root = Run {
            start: ROOT_BLOCK,
            len: 1,
            cap: 1,
            parent: ROOT_BLOCK,
            first_child: NIL,
            first_child_start: 0,
            bits: LIVE,
            pins: 0,
            first_local: 0,
            start_path: ROOT_PATH,
            end_path: ROOT_PATH,
            members: Members::new(),
        };
        runs.alloc(root);
        Self {
            blocks: Blocks::new(),
            runs,
            edges: NodeTable::default(),
            exts: NodeTable::default(),
            live_runs: 0,
            live_blocks: 0,
        }
    }

    /// Block positions in the trie.
    pub fn live_blocks(&self) -> usize {
        self.live_blocks
    }

    /// Runs other than the root.
    pub fn live_runs(&self) -> usize {
        self.live_runs
    }

    #[inline]
    pub fn run_of(&self, b: u32) -> u32 {
        self.blocks.run_of(b)
    }

    /// The child run of run `r`'s last block whose first local is `local`.
    #[inline]
    pub fn child(&self, r: u32, local: u64) -> Option<u32> {
        let run = &self.runs[r];
        let fc = run.first_child;
        if fc != NIL && self.runs[fc].first_local == local {
            return Some(fc);
        }
        let n = run.children();
        if n == 0 || (fc != NIL && n == 1) {
            return None;
        }
        let pb = run.last();
        let runs = &self.runs;
        self.edges.find(edge_hash(pb, local), |c| runs[c].parent == pb && runs[c].first_local == local)
    }

    /// Starts loading what finding the child of run `r` with first local `next` will read:
    /// the first child's record and first locals, and the edge table slot when there are
    /// several children. A hint only.
    #[inline]
    pub fn prefetch_child(&self, r: u32, next: Option<u64>) {
        let run = &self.runs[r];
        if run.first_child != NIL {
            crate::trie::table::prefetch_ptr(&self.runs[run.first_child]);
            let locals = self.blocks.locals(run.first_child_start, 1).as_ptr();
            crate::trie::table::prefetch_ptr(locals);
            crate::trie::table::prefetch_ptr(locals.wrapping_add(8));
        }
        if let Some(local) = next.filter(|_| run.children() > 1) {
            self.edges.prefetch(edge_hash(run.last(), local));
        }
    }

    /// Starts loading the first locals of run `r`. A hint only.
    #[inline]
    pub fn prefetch_locals(&self, r: u32) {
        let run = &self.runs[r];
        crate::trie::table::prefetch_ptr(self.blocks.locals(run.start, 1).as_ptr());
    }

    /// The path hash of the block at offset `off` of run `r`: from the nearest anchor or
    /// end at or before it, at most [`ANCHOR`]` - 1` steps.
    pub fn path_at(&self, r: u32, off: u32) -> u64 {
        let run = &self.runs[r];
        if off == run.len - 1 {
            return run.end_path;
        }
        let b = run.start + off;
        let a = b & !(ANCHOR - 1);
        let (from, path) =
            if a > run.start { (a, self.blocks.anchor(a)) } else { (run.start, run.start_path) };
        self.blocks.locals(from + 1, b - from).iter().fold(path, |p, &l| child_path(p, l))
    }

    /// Sum of the digest terms of `count` blocks of run `r` from offset `off`.
    pub fn terms(&self, r: u32, off: u32, count: u32, inferred: bool) -> u64 {
        let run = &self.runs[r];
        let locals = self.blocks.locals(run.start, run.len);
        let mut p = self.path_at(r, off);
        let mut sum = block_term(p, inferred);
        for &l in &locals[off as usize + 1..(off + count) as usize] {
            p = child_path(p, l);
            sum = sum.wrapping_add(block_term(p, inferred));
        }
        sum
    }

    /// Hints that `ext` will be looked up soon ([`NodeTable::prefetch`]).
    #[inline]
    pub fn prefetch_ext(&self, ext: u64) {
        self.prefetch_ext_hash(ext_hash(ext));
    }

    /// [`Self::prefetch_ext`] for an ext whose [`ext_hash`] is `h`.
    #[inline]
    pub fn prefetch_ext_hash(&self, h: u64) {
        self.exts.prefetch(h);
    }

    /// The block whose canonical ext is `ext`.
    #[inline]
    pub fn by_ext(&self, ext: u64) -> Option<u32> {
        let blocks = &self.blocks;
        self.exts.find(ext_hash(ext), |b| blocks.meta(b).ext() == Some(ext))
    }

    /// The `len` blocks ending at `leaf`, as run segments from the leaf towards the root.
    pub fn window(&self, leaf: u32, len: u32, out: &mut Vec<Segment>) {
        out.clear();
        let (mut cur, mut rem) = (leaf, len);
        while rem > 0 && cur != ROOT_BLOCK {
            let r = self.run_of(cur);
            let run = &self.runs[r];
            let off = cur - run.start;
            let take = (off + 1).min(rem);
            out.push((r, cur + 1 - take, take));
            rem -= take;
            cur = if take == off + 1 { run.parent } else { cur - take };
        }
    }

    /// The block before `b` on its path (its parent position).
    #[inline]
    pub fn parent_block(&self, b: u32) -> u32 {
        let run = &self.runs[self.run_of(b)];
        if b == run.start {
            run.parent
        } else {
            b - 1
        }
    }

    /// Local hashes from the root down to block `b`.
    pub fn chain_to(&self, mut b: u32) -> Vec<u64> {
        let mut v = Vec::new();
        while b != ROOT_BLOCK {
            let run = &self.runs[self.run_of(b)];
            v.extend(self.blocks.locals(run.start, b - run.start + 1).iter().rev());
            b = run.parent;
        }
        v.reverse();
        v
    }

    /// Approximate heap bytes (blocks, runs, member spills, tables), for metrics.
    pub fn heap_bytes(&self) -> usize {
        self.blocks.heap_bytes() + self.runs.heap_bytes() + self.edges.heap_bytes() + self.exts.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::common_prefix;

    #[test]
    fn common_prefix_agrees_with_the_plain_loop() {
        let a: Vec<u64> = (0..70).collect();
        for len in [0usize, 1, 7, 8, 9, 16, 63, 64, 70] {
            for diff in 0..=len {
                let mut b = a[..len].to_vec();
                if diff < len {
                    b[diff] ^= 1;
                }
                let plain = a.iter().zip(&b).take_while(|(x, y)| x == y).count() as u32;
                assert_eq!(common_prefix(&a, &b), plain, "len {len} diff {diff}");
                assert_eq!(common_prefix(&b, &a), plain);
            }
        }
    }
}
