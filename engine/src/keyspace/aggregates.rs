//! A keyspace's aggregates: its digest, its per-partition digests and its resident
//! holder-blocks, each a sum over holders. An operation snaps its holder's term before it
//! changes anything ([`Keyspace::snap`]) and carries the change in once at the end
//! ([`Keyspace::settle`]), not per block.

use crate::digest::holder_term;
use crate::keyspace::Keyspace;

impl Keyspace {
    /// Order-independent digest of every holder's block set.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Digest of the holders whose worker lives in log partition `p`.
    pub fn partition_digest(&self, p: u32) -> u64 {
        self.group_digests.get(p as usize).copied().unwrap_or(0)
    }

    /// Resident (holder, block) pairs.
    pub fn holder_blocks(&self) -> u64 {
        self.holder_blocks
    }

    /// The holder's aggregate term and block count before an operation.
    pub(crate) fn snap(&self, h: u32) -> (u64, u32) {
        let holder = self.holders.at(h);
        (holder_term(&holder.key, holder.blocks, holder.digest), holder.blocks)
    }

    /// Carries the change of a holder's term since [`Self::snap`] into the aggregates. Done once
    /// per operation, not per block.
    pub(crate) fn settle(&mut self, h: u32, (old, blocks_before): (u64, u32)) {
        self.write_seq += 1;
        self.holders.at_mut(h).last_write = self.write_seq;
        self.holders.sync_card(h);
        let holder = self.holders.at(h);
        let new = holder_term(&holder.key, holder.blocks, holder.digest);
        let (group, blocks_after) = (holder.group as usize, holder.blocks);
        debug_assert!(
            self.holder_blocks >= u64::from(blocks_before),
            "the aggregate includes this holder's blocks"
        );
        self.digest = self.digest.wrapping_sub(old).wrapping_add(new);
        let g = &mut self.group_digests[group];
        *g = g.wrapping_sub(old).wrapping_add(new);
        self.holder_blocks = self.holder_blocks + u64::from(blocks_after) - u64::from(blocks_before);
    }

    /// Recomputes the aggregates from the holders (after a rebuild or an image read, and after
    /// a repair's transplant, so a damaged holder leaves no residue behind).
    pub(crate) fn recompute_aggregates(&mut self) {
        for h in 0..self.holders.slots.len() as u32 {
            if self.holders.slots[h as usize].is_some() {
                self.holders.sync_card(h);
            }
        }
        self.digest = 0;
        self.group_digests.iter_mut().for_each(|g| *g = 0);
        self.holder_blocks = 0;
        for h in self.holders.slots.iter().flatten() {
            let t = holder_term(&h.key, h.blocks, h.digest);
            self.digest = self.digest.wrapping_add(t);
            let g = &mut self.group_digests[h.group as usize];
            *g = g.wrapping_add(t);
            self.holder_blocks += u64::from(h.blocks);
        }
    }
}
