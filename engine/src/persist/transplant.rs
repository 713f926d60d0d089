//! Replacing one partition's holders with another keyspace's (anti-entropy repair).
//!
//! Holders of different partitions share trie blocks but never state, so a partition's holders
//! can be rebuilt elsewhere (checkpoint + replay of that partition) and moved in: drop ours,
//! enumerate theirs with only the blocks they reference ([`Keyspace::dump_partitions`]), and
//! graft that onto our trie chain by chain (by locals, so by path), with the same stamps,
//! records and ext resolution: the result digests, answers and evolves as if it had been
//! applied here.

use crate::keyspace::holders::{Holder, Record};
use crate::keyspace::Keyspace;
use crate::persist::dump::KeyspaceDump;
use crate::trie::blocks::ROOT_BLOCK;
use rustc_hash::FxHashMap;

impl Keyspace {
    /// Replaces every holder of partition `group` with `src`'s holders of that partition.
    ///
    /// A repair may run on a keyspace whose structures are damaged (the scrubber found a
    /// member no record justifies, or an aggregate that is not the sum of its holders), so
    /// after our holders are dropped by their records, members left without a holder are
    /// dropped too (before the graft can reuse their slots) and the aggregates are recomputed
    /// from the holders. On a consistent keyspace neither changes anything.
    pub fn replace_group(&mut self, group: u32, src: &Keyspace) {
        for h in self.holders.sorted() {
            if self.holders.at(h).group == group {
                let snap = self.snap(h);
                self.clear_blocks(h);
                self.settle(h, snap);
                self.holders.remove(h);
            }
        }
        self.drop_dangling_members();
        let theirs = src.dump_partitions(|g| g == group);
        if !theirs.holders.is_empty() {
            self.graft(&theirs);
        }
        self.recompute_aggregates();
    }

    /// Adds a dump's holders (none of which exist here) onto this trie.
    fn graft(&mut self, d: &KeyspaceDump) {
        let blocks = self.graft_nodes(d);
        for dh in &d.holders {
            let mut h =
                Holder::new(dh.key, crate::partition::partition_of(dh.key.worker, self.cfg.partitions));
            (h.fed, h.gapped, h.next_stamp, h.last_time) = (dh.fed, dh.gapped, dh.next_stamp, dh.last_time);
            let hi = self.holders.insert(h);
            let snap = self.snap(hi);
            self.graft_members(hi, &dh.members, &blocks);
            let override_of: FxHashMap<u32, u64> = dh.overrides.iter().map(|&(e, k)| (k, e)).collect();
            for &(k, _) in &dh.members {
                // The ext this holder resolves to the node in the source must resolve here too.
                let ext = override_of.get(&k).copied().or(d.nodes[k as usize - 1].ext);
                if let Some(e) = ext {
                    self.bind_or_override(hi, blocks[k as usize], e);
                }
            }
            for &(stamp, leaf, len, time) in &dh.records {
                let leaf = blocks[leaf as usize];
                if self.trie.runs[self.trie.run_of(leaf)].last() != leaf {
                    self.trie.split_before(leaf + 1);
                }
                self.push_record(hi, Record { stamp, leaf, len, time });
            }
            self.settle(hi, snap);
        }
    }

    /// The block here of every dump node (index 0 is the root), creating what is missing:
    /// each maximal chain of consecutive nodes is walked (and created) in one go.
    fn graft_nodes(&mut self, d: &KeyspaceDump) -> Vec<u32> {
        let n = d.nodes.len();
        let mut blocks = vec![ROOT_BLOCK; n + 1];
        let (mut locals, mut stretches) = (Vec::new(), Vec::new());
        let mut k = 1;
        while k <= n {
            let mut end = k;
            while end < n && d.nodes[end].parent as usize == end {
                end += 1;
            }
            locals.clear();
            locals.extend(d.nodes[k - 1..end].iter().map(|x| x.local));
            let parent = blocks[d.nodes[k - 1].parent as usize];
            self.trie.walk_create(parent, &locals, false, &mut stretches);
            let mut i = k;
            for st in &stretches {
                for b in st.first..st.first + st.count {
                    blocks[i] = b;
                    i += 1;
                }
            }
            k = end + 1;
        }
        blocks
    }

    /// The holder's memberships, stretch by stretch: consecutive members on consecutive blocks
    /// of one run with one stamp are added together.
    fn graft_members(&mut self, h: u32, members: &[(u32, u32)], blocks: &[u32]) {
        let mut i = 0;
        while i < members.len() {
            let (first, stamp) = (blocks[members[i].0 as usize], members[i].1);
            let run = self.trie.run_of(first);
            let mut count = 1;
            while let Some(&(k, s)) = members.get(i + count as usize) {
                let b = blocks[k as usize];
                if s != stamp || b != first + count || self.trie.run_of(b) != run {
                    break;
                }
                count += 1;
            }
            self.add_member_stretch(h, first, count, stamp, None);
            i += count as usize;
        }
    }

    /// Takes every member whose holder slot is empty off its run, releasing runs that nothing
    /// keeps any more. A consistent keyspace has none; after a holder with a member no record
    /// justified is removed (records are how a holder's blocks are found), that member would
    /// otherwise stay behind and be credited to whichever holder takes the slot next. One pass
    /// over the runs. Returns how many members it took off.
    fn drop_dangling_members(&mut self) -> usize {
        let mut emptied = Vec::new();
        let mut dropped = 0;
        for r in 1..self.trie.runs.slots() {
            let slots = &self.holders.slots;
            let run = &mut self.trie.runs[r];
            if !run.live() {
                continue;
            }
            let before = run.members.len();
            run.members.retain(|m| slots.get(m.holder as usize).is_some_and(Option::is_some));
            if run.members.len() != before {
                dropped += before - run.members.len();
                self.trie.holders_changed(r);
                emptied.push(r);
            }
        }
        for r in emptied {
            if self.trie.runs[r].live() {
                self.trie.release(r);
            }
        }
        dropped
    }
}
