//! Test-only fault hooks (feature `testing`): damage a keyspace as memory corruption or a bug
//! would, and nothing else, so that the checks, the scrubber and anti-entropy repair have
//! something real to find. Never compiled into a production build.

use super::Keyspace;
use crate::trie::blocks::ROOT_BLOCK;
use crate::trie::Member;
use crate::types::HolderKey;

impl Keyspace {
    /// Test-only fault hook: silently drops one block of a holder, as memory corruption or a
    /// bug would, so anti-entropy has a divergence to find. Returns whether a block was dropped.
    pub fn corrupt_for_test(&mut self, key: &HolderKey) -> bool {
        let Some(h) = self.holders.get(key) else { return false };
        let held = (1..self.trie.runs.slots()).find(|&r| {
            let run = &self.trie.runs[r];
            run.live() && run.member(h).is_some()
        });
        let Some(r) = held else { return false };
        let snap = self.snap(h);
        let b = self.trie.runs[r].start;
        self.remove_block(h, b);
        self.settle(h, snap);
        true
    }

    /// Test-only fault hook: makes the holder a member of a top-level run it does not hold,
    /// with a stamp no record has, and changes nothing else — as memory corruption of a
    /// membership list would. Digests (kept beside the trie) still agree with every peer's,
    /// but queries now credit the holder with that run's blocks: an overcount only a scrub
    /// finds. Returns the run's locals (a query that shows it), if such a run exists.
    pub fn corrupt_membership_for_test(&mut self, key: &HolderKey) -> Option<Vec<u64>> {
        let h = self.holders.get(key)?;
        let r = (1..self.trie.runs.slots()).find(|&r| {
            let run = &self.trie.runs[r];
            run.live() && run.parent == ROOT_BLOCK && run.member(h).is_none()
        })?;
        let holders = &self.holders;
        let at = self.trie.runs[r].members.partition_point(|m| holders.at(m.holder).key < *key);
        self.trie.runs[r].members.insert(at, Member { holder: h, stamp: 0 });
        self.trie.holders_changed(r);
        let run = &self.trie.runs[r];
        Some(self.trie.blocks.locals(run.start, run.len).to_vec())
    }
}
