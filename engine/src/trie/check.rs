//! Structural invariants of the trie, for [`crate::Keyspace::check_invariants`] (the whole
//! structure) and the scrubber (one run at a time).

use crate::digest::child_path;
use crate::trie::blocks::{ANCHOR, CHUNK_BITS, FREE, ROOT_BLOCK};
use crate::trie::table::NodeTable;
use crate::trie::{edge_hash, ext_hash, Trie, MAX_RUN, NIL, ROOT};
use crate::types::{ensure as check, InvariantError};

use InvariantError::{Block, Edge, Ext, FreeList, Link};

impl Trie {
    /// Run liveness and the free list of run ids; every run's blocks, allocation, parent
    /// link, paths and child count; every block in exactly one run's allocation or free;
    /// both lookup tables holding exactly one entry per indexed block or link.
    pub fn check_structure(&self) -> Result<(), InvariantError> {
        self.check_free_runs()?;
        let mut children = vec![0u32; self.runs.slots() as usize];
        let mut owner = vec![u32::MAX; self.blocks.top() as usize];
        owner[ROOT_BLOCK as usize] = ROOT;
        let (mut live_runs, mut live_blocks) = (0usize, 0usize);
        for r in 1..self.runs.slots() {
            if !self.runs[r].live() {
                continue;
            }
            live_runs += 1;
            live_blocks += self.runs[r].len as usize;
            self.check_run(r, Some(&mut owner))?;
            children[self.run_of(self.runs[r].parent) as usize] += 1;
        }
        check(live_runs == self.live_runs(), || Link { run: ROOT, what: "live run count differs" })?;
        check(live_blocks == self.live_blocks(), || Link { run: ROOT, what: "live block count differs" })?;
        for r in 0..self.runs.slots() {
            let run = &self.runs[r];
            if !run.live() {
                continue;
            }
            check(run.children() == children[r as usize], || Link { run: r, what: "child count differs" })?;
            let fc = run.first_child;
            let fc_ok = fc == NIL
                || self
                    .runs
                    .get(fc)
                    .is_some_and(|c| c.live() && c.parent == run.last() && c.start == run.first_child_start);
            check(fc_ok, || Link { run: r, what: "first child is not a live child" })?;
            let same = self.same_as_child(r);
            check(run.same_as_child() == same, || Link {
                run: r,
                what: "same-holders-as-child flag is stale",
            })?;
        }
        self.check_free_blocks(&owner)?;
        self.check_exts()?;
        self.check_edges()
    }

    fn check_free_runs(&self) -> Result<(), InvariantError> {
        let mut freed = vec![false; self.runs.slots() as usize];
        for &f in self.runs.free_ids() {
            let ok = f != ROOT && f < self.runs.slots() && !self.runs[f].live() && !freed[f as usize];
            check(ok, || FreeList { run: f, what: "free id is out of range, live, or listed twice" })?;
            freed[f as usize] = true;
        }
        check(self.runs[ROOT].live(), || FreeList { run: ROOT, what: "the root run is not live" })?;
        for r in 1..self.runs.slots() {
            let ok = self.runs[r].live() || freed[r as usize];
            check(ok, || FreeList { run: r, what: "dead run id not on the free list" })?;
        }
        Ok(())
    }

    /// One live run: its blocks point back at it, its allocation is its own (with `owner`,
    /// the block → run map built so far; without it, for a check of one run, that is left
    /// out), it hangs off the last block of a live run and is found there, and its cached
    /// local and paths are right.
    pub(crate) fn check_run(&self, r: u32, mut owner: Option<&mut [u32]>) -> Result<(), InvariantError> {
        let run = &self.runs[r];
        let shape = run.len >= 1
            && run.len <= MAX_RUN
            && run.cap >= run.len
            && run.start + run.cap <= self.blocks.top()
            && run.start >> CHUNK_BITS == (run.start + run.cap - 1) >> CHUNK_BITS;
        check(shape, || Link { run: r, what: "length, capacity or range out of bounds" })?;
        for b in run.start..run.start + run.cap {
            if let Some(owner) = owner.as_deref_mut() {
                let o = &mut owner[b as usize];
                check(*o == u32::MAX, || Block { block: b, what: "in two runs' allocations" })?;
                *o = r;
            }
            let want = if b < run.start + run.len { r } else { FREE };
            check(self.blocks.meta(b).run() == want, || Block {
                block: b,
                what: "run id differs from its run",
            })?;
            let spare_bound = b < run.start + run.len || self.blocks.meta(b).ext().is_none();
            check(spare_bound, || Block { block: b, what: "spare capacity has an ext" })?;
        }
        let parent_ok = run.parent < self.blocks.top() && {
            let pr = self.run_of(run.parent);
            self.runs.get(pr).is_some_and(|p| p.live() && p.last() == run.parent)
        };
        check(parent_ok, || Link { run: r, what: "parent is not the last block of a live run" })?;
        let pr = self.run_of(run.parent);
        check(run.first_local == self.blocks.local(run.start), || Link {
            run: r,
            what: "first local is stale",
        })?;
        check(self.child(pr, run.first_local) == Some(r), || Link {
            run: r,
            what: "not found as its parent's child",
        })?;
        let start_path = child_path(self.runs[pr].end_path, run.first_local);
        check(run.start_path == start_path, || Link {
            run: r,
            what: "start path is not the parent's chained",
        })?;
        let mut path = start_path;
        for b in run.start..run.start + run.len {
            if b > run.start {
                path = child_path(path, self.blocks.local(b));
            }
            let anchored = !b.is_multiple_of(ANCHOR) || self.blocks.anchor(b) == path;
            check(anchored, || Block { block: b, what: "anchor path differs from the chained locals" })?;
        }
        let what = "end path differs from the chained locals";
        check(run.end_path == path, || Link { run: r, what })?;
        Ok(())
    }

    /// Blocks in no run's allocation are exactly the free ranges, and marked free.
    fn check_free_blocks(&self, owner: &[u32]) -> Result<(), InvariantError> {
        let mut free = vec![false; owner.len()];
        for (s, l) in self.blocks.free_ranges() {
            for b in s..s + l {
                let ok = (b as usize) < owner.len() && owner[b as usize] == u32::MAX && !free[b as usize];
                check(ok, || Block { block: b, what: "free range overlaps a run or another free range" })?;
                free[b as usize] = true;
            }
        }
        for (b, &o) in owner.iter().enumerate() {
            let b = b as u32;
            check(o != u32::MAX || free[b as usize], || Block {
                block: b,
                what: "neither in a run nor free",
            })?;
            if o == u32::MAX {
                check(self.blocks.meta(b).run() == FREE, || Block {
                    block: b,
                    what: "free block marked in use",
                })?;
            }
        }
        Ok(())
    }

    fn check_exts(&self) -> Result<(), InvariantError> {
        let mut bound = 0usize;
        for r in 1..self.runs.slots() {
            let run = &self.runs[r];
            if !run.live() {
                continue;
            }
            for b in run.start..run.start + run.len {
                if let Some(e) = self.blocks.meta(b).ext() {
                    bound += 1;
                    check(self.by_ext(e) == Some(b), || Ext {
                        block: b,
                        what: "canonical ext does not resolve to it",
                    })?;
                }
            }
        }
        let mut entries = 0usize;
        for (sig, b) in self.exts.entries() {
            entries += 1;
            let ok = b < self.blocks.top()
                && self.blocks.meta(b).run() != FREE
                && self.blocks.meta(b).ext().is_some_and(|e| NodeTable::signature(ext_hash(e)) == sig);
            check(ok, || Ext { block: b, what: "ext table entry for a free, unbound or rehashed block" })?;
        }
        check(entries == bound, || Ext { block: 0, what: "ext table size differs from the bound blocks" })
    }

    fn check_edges(&self) -> Result<(), InvariantError> {
        let mut links = 0usize;
        for r in 1..self.runs.slots() {
            let run = &self.runs[r];
            if run.live() && self.runs[self.run_of(run.parent)].first_child != r {
                links += 1;
            }
        }
        let mut entries = 0usize;
        for (sig, r) in self.edges.entries() {
            entries += 1;
            let ok = self.runs.get(r).is_some_and(|run| {
                run.live()
                    && self.runs[self.run_of(run.parent)].first_child != r
                    && NodeTable::signature(edge_hash(run.parent, run.first_local)) == sig
            });
            check(ok, || Edge { run: r, what: "edge table entry for a dead, first or rehashed child" })?;
        }
        check(entries == links, || Edge {
            run: ROOT,
            what: "edge table size differs from the non-first children",
        })
    }
}
