//! The `SAME` flag of a run: set exactly when the run has one child, its `first_child`, and
//! that child has the same holders (stamps aside).
//!
//! Why: evictions cut a shared prefix into short runs. A system prompt held by a hundred
//! workers, evicted tail-first by some of them, becomes a chain of runs of a block or two,
//! whose holder lists are equal again once those workers store it back; each holder's blocks
//! in each run carry the stamp of the operation that stored them, which differ, so the runs
//! do not merge. A match stepping from such a run into its child used to compare the two
//! holder lists entry by entry (~700 entries per query on long prompts, the largest part of
//! its walk); with the flag it reads one bit of the run record it already has.
//!
//! Derived state: not part of an image (masked out when written, recomputed when read) and
//! never compared by digests or dumps. Every change to a run's holders or to its children
//! refreshes the flags it can affect (the run's own and its parent run's), and
//! `check_structure` recomputes every flag, so a missed refresh fails the invariant checks
//! that the differential and trap tests run after every step.

use crate::trie::runs::SAME;
use crate::trie::{Trie, NIL, ROOT};

impl Trie {
    /// What run `r`'s flag should be.
    pub(crate) fn same_as_child(&self, r: u32) -> bool {
        let run = &self.runs[r];
        run.children() == 1 && run.first_child != NIL && run.same_holders(&self.runs[run.first_child])
    }

    /// Recomputes run `r`'s flag, after its children or its only child changed.
    pub(crate) fn refresh_same(&mut self, r: u32) {
        let same = self.same_as_child(r);
        let run = &mut self.runs[r];
        run.bits = if same { run.bits | SAME } else { run.bits & !SAME };
    }

    /// Recomputes the flags a change to run `r`'s holders can affect: its own and its
    /// parent run's.
    pub(crate) fn holders_changed(&mut self, r: u32) {
        self.refresh_same(r);
        if r != ROOT {
            let parent = self.run_of(self.runs[r].parent);
            self.refresh_same(parent);
        }
    }

    /// Recomputes every live run's flag (after an image is read).
    pub(crate) fn refresh_all_same(&mut self) {
        for r in 0..self.runs.slots() {
            if self.runs[r].live() {
                self.refresh_same(r);
            }
        }
    }
}
