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

pub(crate) mod blocks;
mod check;
pub(crate) mod grow_ahead;
mod reclaim;
pub(crate) mod runs;
mod same_holders;
pub(crate) mod table;

use crate::digest::{block_term, child_path, fold_mul, ROOT_PATH};
use blocks::{Blocks, ANCHOR, CHUNK, ROOT_BLOCK};
pub use runs::{Member, Members, Run, Runs};
use runs::{CHILDREN, LIVE};
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
/// The shortest run a store is cut to so that it fits a free range ([`Trie::piece`]).
const MIN_PIECE: u32 = 64;
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

/// A stretch of a walked chain inside one run: `count` blocks from block `first`. For blocks
/// the walk created, the sum of their digest terms comes along (the walk computes their
/// paths anyway).
#[derive(Clone, Copy, Debug)]
pub struct Stretch {
    pub first: u32,
    pub count: u32,
    pub new_terms: Option<u64>,
}

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

    /// Splits the run holding `b` so that `b` starts a run (no-op if it already does).
    /// The smaller part gets a new id, so the split costs at most half the run.
    pub fn split_before(&mut self, b: u32) {
        let r = self.run_of(b);
        let (start, len, cap) = (self.runs[r].start, self.runs[r].len, self.runs[r].cap);
        if b == start {
            return;
        }
        let j = b - start;
        let before = self.path_at(r, j - 1);
        let at = child_path(before, self.blocks.local(b));
        let members = self.runs[r].members.clone();
        if j <= len - j {
            let (parent, first_local, start_path) = {
                let run = &self.runs[r];
                (run.parent, run.first_local, run.start_path)
            };
            let head = Run {
                start,
                len: j,
                cap: j,
                parent,
                first_child: r,
                first_child_start: b,
                bits: LIVE | 1,
                pins: 0,
                first_local,
                start_path,
                end_path: before,
                members,
            };
            let h = self.runs.alloc(head);
            self.relink(parent, first_local, r, h);
            (start..b).for_each(|x| self.blocks.set_run(x, h));
            let run = &mut self.runs[r];
            (run.start, run.len, run.cap, run.parent) = (b, len - j, cap - j, b - 1);
            (run.first_local, run.start_path) = (self.blocks.local(b), at);
        } else {
            let run = &self.runs[r];
            let tail = Run {
                start: b,
                len: len - j,
                cap: cap - j,
                parent: b - 1,
                first_child: run.first_child,
                first_child_start: run.first_child_start,
                bits: run.bits,
                pins: run.pins,
                first_local: self.blocks.local(b),
                start_path: at,
                end_path: run.end_path,
                members,
            };
            let t = self.runs.alloc(tail);
            (b..start + len).for_each(|x| self.blocks.set_run(x, t));
            let run = &mut self.runs[r];
            (run.len, run.cap, run.first_child, run.bits, run.pins, run.end_path) =
                (j, j, t, LIVE | 1, 0, before);
            run.first_child_start = b;
        }
        self.live_runs += 1;
        let (head, tail) = (self.run_of(b - 1), self.run_of(b));
        self.refresh_same(head);
        self.refresh_same(tail);
        self.refresh_same(self.run_of(self.runs[head].parent));
    }

    /// Points the parent block's link to child `old` at `new` instead.
    fn relink(&mut self, parent: u32, first_local: u64, old: u32, new: u32) {
        let pr = self.run_of(parent);
        if self.runs[pr].first_child == old {
            self.runs[pr].first_child = new;
        } else {
            let found = self.edges.replace(edge_hash(parent, first_local), old, new);
            debug_assert!(found, "a non-first child is in the edge table");
        }
    }

    /// A new, unheld run of `locals` under `parent` (the last block of its run). Returns it
    /// and the sum of its blocks' digest terms (`inferred` variant).
    pub fn create_run(&mut self, parent: u32, locals: &[u64], inferred: bool) -> (u32, u64) {
        let n = locals.len() as u32;
        debug_assert!((1..=max_run()).contains(&n));
        let pr = self.run_of(parent);
        debug_assert_eq!(parent, self.runs[pr].last(), "children hang off run ends");
        let (start, cap) = self.allocate(pr, n);
        self.blocks.locals_mut(start, n).copy_from_slice(locals);
        let start_path = child_path(self.runs[pr].end_path, locals[0]);
        self.blocks.set_path(start, start_path);
        let mut terms = block_term(start_path, inferred);
        let mut end_path = start_path;
        for (b, &l) in (start + 1..).zip(&locals[1..]) {
            end_path = child_path(end_path, l);
            self.blocks.set_path(b, end_path);
            terms = terms.wrapping_add(block_term(end_path, inferred));
        }
        let run = Run {
            start,
            len: n,
            cap,
            parent,
            first_child: NIL,
            first_child_start: 0,
            bits: LIVE,
            pins: 0,
            first_local: locals[0],
            start_path,
            end_path,
            members: Members::new(),
        };
        let id = self.runs.alloc(run);
        (start..start + n).for_each(|b| self.blocks.set_run(b, id));
        self.link(pr, id);
        self.live_runs += 1;
        self.live_blocks += n as usize;
        (id, terms)
    }

    /// How many of the `n` blocks a new run under block `parent` should take: all of them
    /// where they fit whole (the parent's spare, or a free range), else the longest room
    /// there is of at least [`MIN_PIECE`] blocks, so that free ranges shorter than a whole
    /// store get filled instead of the block arrays growing past them (on the long peers
    /// shape they held 14% of the arrays: a document evicted and a shorter one in its place).
    fn piece(&self, parent: u32, n: u32) -> u32 {
        let pr = self.run_of(parent);
        let spare = if pr == ROOT { 0 } else { self.runs[pr].cap - self.runs[pr].len };
        let free = self.blocks.longest_free();
        if spare >= n || free >= n {
            return n;
        }
        match spare.max(free) {
            room if room >= MIN_PIECE => room,
            _ => n,
        }
    }

    /// Room for `n` blocks of a new child of run `pr`: right after the parent's blocks if its
    /// spare capacity fits (the chain stays contiguous), else from the allocator.
    fn allocate(&mut self, pr: u32, n: u32) -> (u32, u32) {
        let p = &mut self.runs[pr];
        if pr != ROOT && p.cap - p.len >= n {
            let spare = (p.start + p.len, p.cap - p.len);
            p.cap = p.len;
            return spare;
        }
        (self.blocks.alloc(n), n)
    }

    /// Adds run `c` to run `pr`'s last block's children.
    fn link(&mut self, pr: u32, c: u32) {
        let c_start = self.runs[c].start;
        let p = &mut self.runs[pr];
        debug_assert!(p.children() < CHILDREN);
        p.bits += 1;
        if p.first_child == NIL {
            p.first_child = c;
            p.first_child_start = c_start;
        } else {
            let (parent, local) = (self.runs[c].parent, self.runs[c].first_local);
            self.edges.insert(edge_hash(parent, local), c);
        }
        self.refresh_same(pr);
    }

    /// Rebuild: links run `c` under its parent block, refusing a second child with the same
    /// first local. Returns false (and links nothing) then.
    pub fn link_checked(&mut self, c: u32) -> bool {
        let (parent, local) = (self.runs[c].parent, self.runs[c].first_local);
        let pr = self.run_of(parent);
        if self.child(pr, local).is_some() {
            return false;
        }
        self.link(pr, c);
        true
    }

    /// Walks from block `parent` along `locals`, creating the blocks that do not exist yet
    /// (as new runs, splitting a run where the chain leaves it in the middle). `out` receives
    /// the path as stretches, each inside one run at the time of the walk (by block ids,
    /// which later splits do not change); created ones carry their `inferred` digest terms.
    pub fn walk_create(&mut self, parent: u32, locals: &[u64], inferred: bool, out: &mut Vec<Stretch>) {
        out.clear();
        let (mut cur, mut i) = (parent, 0usize);
        while i < locals.len() {
            let r = self.run_of(cur);
            let last = self.runs[r].last();
            if cur != last {
                let k = common_prefix(self.blocks.locals(cur + 1, last - cur), &locals[i..]);
                if k > 0 {
                    out.push(Stretch { first: cur + 1, count: k, new_terms: None });
                    (cur, i) = (cur + k, i + k as usize);
                    continue;
                }
                self.split_before(cur + 1);
            } else if let Some(c) = self.child(r, locals[i]) {
                let (start, len) = (self.runs[c].start, self.runs[c].len);
                let k = common_prefix(self.blocks.locals(start, len), &locals[i..]);
                out.push(Stretch { first: start, count: k, new_terms: None });
                (cur, i) = (start + k - 1, i + k as usize);
                continue;
            }
            while i < locals.len() {
                let m = self.piece(cur, (locals.len() - i).min(max_run() as usize) as u32) as usize;
                let (c, terms) = self.create_run(cur, &locals[i..i + m], inferred);
                let start = self.runs[c].start;
                out.push(Stretch { first: start, count: m as u32, new_terms: Some(terms) });
                (cur, i) = (start + m as u32 - 1, i + m);
            }
        }
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

    /// Makes `ext` the canonical ext of block `b` if neither already has one. Returns whether
    /// `ext` now resolves to `b` through the shared table.
    pub fn bind_ext(&mut self, b: u32, ext: u64) -> bool {
        if let Some(e) = self.blocks.meta(b).ext() {
            // A bound block is in the table under its own ext, and only under it.
            return e == ext;
        }
        let blocks = &self.blocks;
        if self.exts.insert_new(ext_hash(ext), b, |k| blocks.meta(k).ext() == Some(ext)).is_some() {
            return false;
        }
        self.blocks.set_ext(b, ext);
        true
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

    /// Rebuild: a run over blocks the caller has filled (locals and exts, block id order),
    /// with the given paths; not yet linked (see [`Self::link_checked`]).
    pub(crate) fn adopt_run(
        &mut self,
        start: u32,
        len: u32,
        parent: u32,
        paths: (u64, u64),
        members: Members,
    ) -> u32 {
        let run = Run {
            start,
            len,
            cap: len,
            parent,
            first_child: NIL,
            first_child_start: 0,
            bits: LIVE,
            pins: 0,
            first_local: self.blocks.local(start),
            start_path: paths.0,
            end_path: paths.1,
            members,
        };
        let id = self.runs.alloc(run);
        (start..start + len).for_each(|b| self.blocks.set_run(b, id));
        self.live_runs += 1;
        self.live_blocks += len as usize;
        id
    }

    /// Image: a trie from its parts (block storage, runs, edge and ext tables), counting its
    /// live runs and blocks.
    pub(crate) fn from_parts(blocks: Blocks, runs: Runs, edges: NodeTable, exts: NodeTable) -> Self {
        let (mut live_runs, mut live_blocks) = (0, 0);
        for r in 1..runs.slots() {
            if runs[r].live() {
                live_runs += 1;
                live_blocks += runs[r].len as usize;
            }
        }
        let mut trie = Self { blocks, runs, edges, exts, live_runs, live_blocks };
        trie.refresh_all_same();
        trie
    }

    /// Rebuild: installs an ext table built beside the run pass.
    pub fn install_exts(&mut self, table: NodeTable) {
        self.exts = table;
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
