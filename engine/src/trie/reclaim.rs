//! Giving blocks and runs back: freeing dead runs (and their ancestors), merging a run with
//! its only child when a removal left them with the same members, and shrinking a run's tail.
//! Removals are where runs end up short and spare capacity piles up, so this is where runs
//! are joined again and capacity is returned.

use super::{edge_hash, ext_hash, max_run, Trie, NIL, PREFETCH_AHEAD, ROOT, SPARE_KEPT};
use crate::digest::{block_term, parent_path};
use crate::trie::runs::{CHILDREN, LIVE};

impl Trie {
    /// Frees run `r` (dead, not the root): unlinks it, drops its blocks' exts, and returns its
    /// allocation to the parent run when contiguous with it, else to the allocator.
    fn free_run(&mut self, r: u32) {
        debug_assert!(r != ROOT && self.runs[r].dead());
        let (parent, first_local, start, len, cap) = {
            let run = &self.runs[r];
            (run.parent, run.first_local, run.start, run.len, run.cap)
        };
        let pr = self.run_of(parent);
        let p = &mut self.runs[pr];
        p.bits -= 1;
        if p.first_child == r {
            p.first_child = NIL;
        } else {
            let found = self.edges.remove(edge_hash(parent, first_local), r);
            debug_assert!(found, "a non-first child is in the edge table");
        }
        self.refresh_same(pr);
        for b in start..start + len {
            self.drop_block(b);
        }
        let p = &mut self.runs[pr];
        let same_chunk =
            p.start >> crate::trie::blocks::CHUNK_BITS == start >> crate::trie::blocks::CHUNK_BITS;
        if pr != ROOT && p.start + p.cap == start && same_chunk {
            p.cap += cap;
            self.trim_spare(pr);
        } else {
            self.blocks.free_range(start, cap);
        }
        self.runs.release(r);
        self.live_runs -= 1;
        self.live_blocks -= len as usize;
    }

    /// Unbinds a block's ext and marks it free.
    fn drop_block(&mut self, b: u32) {
        if let Some(e) = self.blocks.meta(b).ext() {
            let found = self.exts.remove(ext_hash(e), b);
            debug_assert!(found, "a bound ext is in the ext table");
        }
        self.blocks.set_free(b);
    }

    /// Frees run `r` and then its ancestors while they are dead; the first live one may then
    /// be one run with its neighbours ([`Self::merge_around`]).
    pub fn release(&mut self, mut r: u32) {
        while r != ROOT && self.runs[r].dead() {
            let parent = self.runs[r].parent;
            self.free_run(r);
            r = self.run_of(parent);
        }
        self.merge_around(r);
    }

    /// After run `r` lost a holder or a child: merges it into its parent run and then with
    /// its child, where they can be one run ([`Self::merge_with_child`]).
    pub fn merge_around(&mut self, r: u32) {
        if r == ROOT || !self.runs[r].live() {
            return;
        }
        let p = self.run_of(self.runs[r].parent);
        let r = if p != ROOT && self.runs[p].first_child == r { self.merge_with_child(p) } else { r };
        self.merge_with_child(r);
    }

    /// Merges run `x` with its only child when nothing needs the boundary between them: no
    /// record ends at `x`'s last block, both have the same members with the same stamps, the
    /// child's blocks follow `x`'s in one chunk, and the two fit in one run. Returns the
    /// merged run (or `x`).
    ///
    /// Why: removals split runs where a holder's blocks end, and without merging the pieces
    /// stay apart after the holder is gone. Evicting prefixes that many workers share then
    /// leaves chains of runs of a block or two with equal member lists: each costs a run
    /// record and a member list, and a match steps through them one by one. Block ids do not
    /// change (records, overrides and both tables refer to blocks, or to the runs kept), and
    /// answers, digests and dumps do not depend on where runs begin.
    fn merge_with_child(&mut self, x: u32) -> u32 {
        let xr = &self.runs[x];
        if x == ROOT || xr.children() != 1 || xr.first_child == NIL || xr.pins != 0 || xr.cap != xr.len {
            return x;
        }
        let y = xr.first_child;
        let yr = &self.runs[y];
        let mergeable = yr.start == xr.start + xr.len
            && xr.len + yr.len <= max_run()
            && xr.start >> crate::trie::blocks::CHUNK_BITS
                == (yr.start + yr.cap - 1) >> crate::trie::blocks::CHUNK_BITS
            && xr.members == yr.members;
        if !mergeable {
            return x;
        }
        // The longer run keeps its id: only the other one's blocks are renamed.
        let kept = if xr.len >= yr.len {
            let (start, len, cap) = (yr.start, yr.len, yr.cap);
            let (fc, fcs, bits, pins, end_path) =
                (yr.first_child, yr.first_child_start, yr.bits & CHILDREN, yr.pins, yr.end_path);
            (start..start + len).for_each(|b| self.blocks.set_run(b, x));
            let run = &mut self.runs[x];
            (run.len, run.cap, run.first_child, run.first_child_start) =
                (run.len + len, run.len + cap, fc, fcs);
            (run.bits, run.pins, run.end_path) = (LIVE | bits, pins, end_path);
            self.runs.release(y);
            x
        } else {
            let (start, len, parent, first_local, start_path) =
                (xr.start, xr.len, xr.parent, xr.first_local, xr.start_path);
            (start..start + len).for_each(|b| self.blocks.set_run(b, y));
            self.relink(parent, first_local, x, y);
            let run = &mut self.runs[y];
            (run.start, run.len, run.cap, run.parent) = (start, run.len + len, run.cap + len, parent);
            (run.first_local, run.start_path) = (first_local, start_path);
            self.runs.release(x);
            y
        };
        self.live_runs -= 1;
        self.refresh_same(kept);
        self.refresh_same(self.run_of(self.runs[kept].parent));
        kept
    }

    /// Drops the last `n` blocks of run `r` (which keeps at least one; childless; the caller
    /// has taken every holder off those blocks and moved their pins). Returns the sum of the
    /// dropped blocks' digest terms, walked backwards from the run's end path.
    ///
    /// `hashes[k]` is the [`ext_hash`] of the canonical ext of block `last - k` for `k >= 1`
    /// (the removal named those blocks by their canonical exts, hashed once up front); the
    /// last block may have been named by an override, so it is dropped by its meta. Taking the
    /// slots to start early from `hashes`, not from the meta of a block a few places ahead,
    /// keeps a dependent load out of every prefetch: measured on the long peers shape, removal
    /// went from 73–87 to 59–67 ns a block (README "Engine vs published peers").
    pub fn shrink_tail(&mut self, r: u32, n: u32, inferred: bool, hashes: &[u64]) -> u64 {
        let (last, mut path) = (self.runs[r].last(), self.runs[r].end_path);
        debug_assert!(self.runs[r].len > n && self.runs[r].children() == 0);
        debug_assert!(hashes.len() >= n as usize);
        let mut terms = 0u64;
        let first = last + 1 - n;
        for (k, b) in (first..=last).rev().enumerate() {
            // The ext-table slots are the misses: start them a few blocks ahead (past the run's
            // tail too: the removal goes on with the blocks named next).
            if let Some(&h) = hashes.get(k + PREFETCH_AHEAD) {
                self.exts.prefetch(h);
            }
            terms = terms.wrapping_add(block_term(path, inferred));
            path = parent_path(path, self.blocks.local(b));
            if k == 0 {
                self.drop_block(b);
            } else {
                debug_assert_eq!(self.blocks.meta(b).ext().map(ext_hash), Some(hashes[k]));
                let found = self.exts.remove(hashes[k], b);
                debug_assert!(found, "a bound ext is in the ext table");
                self.blocks.set_free(b);
            }
        }
        let run = &mut self.runs[r];
        run.end_path = path;
        run.len -= n;
        self.live_blocks -= n as usize;
        self.trim_spare(r);
        terms
    }

    /// Gives the allocator back the spare capacity of run `r` beyond [`SPARE_KEPT`] blocks.
    /// A run keeps some spare so that a chain evicted tail-first and stored again grows back
    /// in place, contiguous with it; kept whole, the spare of evicted long documents held
    /// 14% of the block arrays on the long peers shape.
    fn trim_spare(&mut self, r: u32) {
        let run = &mut self.runs[r];
        if run.cap - run.len > SPARE_KEPT {
            let keep = run.len + SPARE_KEPT;
            let (from, n) = (run.start + keep, run.cap - keep);
            run.cap = keep;
            self.blocks.free_range(from, n);
        }
    }
}
