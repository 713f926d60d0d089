//! Adding to the trie: walking a chain from a block and creating the runs it lacks
//! ([`Trie::walk_create`]), splitting a run where a chain or a membership change leaves it in
//! the middle ([`Trie::split_before`]), linking children, binding canonical exts; and putting a
//! trie together from parts (rebuild's runs, an image's arrays). The way back, freeing and
//! merging runs, is `reclaim`.

use super::{common_prefix, max_run, Trie, NIL, ROOT};
use crate::digest::{block_term, child_path};
use crate::trie::blocks::Blocks;
use crate::trie::runs::{Members, Run, Runs, CHILDREN, LIVE};
use crate::trie::table::NodeTable;
use crate::trie::{edge_hash, ext_hash};

/// The shortest run a store is cut to so that it fits a free range ([`Trie::piece`]).
const MIN_PIECE: u32 = 64;

/// A stretch of a walked chain inside one run: `count` blocks from block `first`. For blocks
/// the walk created, the sum of their digest terms comes along (the walk computes their
/// paths anyway).
#[derive(Clone, Copy, Debug)]
pub struct Stretch {
    pub first: u32,
    pub count: u32,
    pub new_terms: Option<u64>,
}

impl Trie {
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
    pub(super) fn relink(&mut self, parent: u32, first_local: u64, old: u32, new: u32) {
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
}
