//! Enumerate and rebuild: the complete state of a keyspace as plain data.
//!
//! A dump carries everything that influences later behaviour — not only the block sets but
//! the operation records and stamps that decide future capacity eviction and TTL expiry —
//! so a rebuilt keyspace answers, digests and evolves exactly like the original.

use crate::keyspace::holders::Holder;
use crate::keyspace::Keyspace;
use crate::trie::blocks::ROOT_BLOCK;
use crate::trie::ROOT;
use crate::types::{partition_of, HolderKey, KeyspaceId, KeyspaceStats, LogTime};

/// A node; `parent` is an index into [`KeyspaceDump::nodes`] plus one (0 is the root), and
/// always refers to an earlier entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpNode {
    pub parent: u32,
    pub local: u64,
    pub ext: Option<u64>,
}

/// A holder; node references use the same numbering as [`DumpNode::parent`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpHolder {
    pub key: HolderKey,
    pub fed: bool,
    pub gapped: bool,
    pub next_stamp: u32,
    pub last_time: LogTime,
    /// `(stamp, leaf, len, time)` in record order.
    pub records: Vec<(u32, u32, u32, LogTime)>,
    /// `(node, stamp)`, ascending by node.
    pub members: Vec<(u32, u32)>,
    /// `(ext, node)`, ascending by ext.
    pub overrides: Vec<(u64, u32)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyspaceDump {
    pub id: KeyspaceId,
    pub nodes: Vec<DumpNode>,
    pub holders: Vec<DumpHolder>,
    pub stats: KeyspaceStats,
}

impl KeyspaceDump {
    /// Resident (holder, block) pairs in the dump.
    pub fn holder_blocks(&self) -> u64 {
        self.holders.iter().map(|h| h.members.len() as u64).sum()
    }

    /// The dump of only the holders whose worker lives in a kept log partition
    /// (`keep(partition_of(worker, partitions))`), with only the nodes they reference (members,
    /// record leaves, override targets) and those nodes' ancestors, renumbered in the same
    /// canonical order. [`Keyspace::rebuild`] of the result answers, digests and evolves like
    /// the original restricted to those partitions, as long as every holder names a block by
    /// one ext (which a chained hash guarantees): exts bound only by dropped holders' nodes
    /// are gone, which can change which nodes later stores bind canonically, never what a
    /// kept holder's ext resolves to.
    ///
    /// `stats` are keyspace-wide counters and are copied unchanged. References outside the
    /// dump (a corrupt input) come out as `u32::MAX`, which rebuild refuses.
    pub fn retain_partitions(&self, keep: impl Fn(u32) -> bool, partitions: u32) -> KeyspaceDump {
        let holders: Vec<&DumpHolder> =
            self.holders.iter().filter(|h| keep(partition_of(h.key.worker, partitions))).collect();
        let len = self.nodes.len();
        let mut used = vec![false; len + 1];
        let mut mark = |n: u32| {
            if let Some(u) = used.get_mut(n as usize) {
                *u = true;
            }
        };
        for h in &holders {
            h.members.iter().for_each(|m| mark(m.0));
            h.records.iter().for_each(|r| mark(r.1));
            h.overrides.iter().for_each(|o| mark(o.1));
        }
        // Parents come before children, so one backward pass closes the set under ancestors.
        for k in (1..=len).rev() {
            let p = self.nodes[k - 1].parent as usize;
            if used[k] && p < k {
                used[p] = true;
            }
        }
        let mut number = vec![u32::MAX; len + 1];
        number[ROOT as usize] = ROOT;
        let mut nodes = Vec::new();
        for (k, n) in self.nodes.iter().enumerate().map(|(i, n)| (i + 1, n)) {
            if used[k] {
                let parent = number.get(n.parent as usize).copied().unwrap_or(u32::MAX);
                nodes.push(DumpNode { parent, ..n.clone() });
                number[k] = nodes.len() as u32;
            }
        }
        let renumber = |n: u32| number.get(n as usize).copied().filter(|&m| n != ROOT && m != 0);
        let renumber = |n: u32| renumber(n).unwrap_or(u32::MAX);
        let holders = holders
            .into_iter()
            .map(|h| DumpHolder {
                key: h.key,
                fed: h.fed,
                gapped: h.gapped,
                next_stamp: h.next_stamp,
                last_time: h.last_time,
                records: h.records.iter().map(|&(s, leaf, l, t)| (s, renumber(leaf), l, t)).collect(),
                members: h.members.iter().map(|&(n, s)| (renumber(n), s)).collect(),
                overrides: h.overrides.iter().map(|&(e, n)| (e, renumber(n))).collect(),
            })
            .collect();
        KeyspaceDump { id: self.id.clone(), nodes, holders, stats: self.stats.clone() }
    }
}

impl Keyspace {
    /// Enumerates the full state, one [`DumpNode`] per block position. Nodes are numbered in
    /// depth-first preorder from the root, children by (local), so the numbering depends only
    /// on the trie's content, not on how it is cut into runs.
    ///
    /// Depth-first because a rebuild then visits memory in order: a node's parent is almost
    /// always the node just created, each holder's members are runs of consecutive numbers,
    /// and the rebuilt runs lay every chain out contiguously. A run's blocks get consecutive
    /// numbers. Flat arrays only (child runs as one CSR array): this runs while ingest is
    /// paused for a checkpoint, over tens of millions of blocks.
    pub fn dump(&self) -> KeyspaceDump {
        self.dump_where(None)
    }

    /// The dump of only the holders whose worker lives in a kept log partition (under this
    /// keyspace's `EngineConfig::partitions`), with only the blocks they reference: equal to
    /// `dump().retain_partitions(keep, partitions)`, without enumerating the rest.
    pub fn dump_partitions(&self, keep: impl Fn(u32) -> bool) -> KeyspaceDump {
        self.dump_where(Some(&|h: &Holder| keep(h.group)))
    }

    /// Runs to enumerate: every live run, or those with a kept holder's members or record end,
    /// and their ancestors.
    fn needed_runs(&self, keep: Option<&dyn Fn(&Holder) -> bool>) -> Vec<bool> {
        let trie = &self.trie;
        let slots = trie.runs.slots();
        let live = |r: u32| r != ROOT && trie.runs[r].live();
        let Some(keep) = keep else { return (0..slots).map(live).collect() };
        let kept: Vec<bool> = self.holders.slots.iter().map(|h| h.as_ref().is_some_and(keep)).collect();
        let mut needed = vec![false; slots as usize];
        let mark = |mut r: u32, needed: &mut Vec<bool>| {
            while r != ROOT && !std::mem::replace(&mut needed[r as usize], true) {
                r = trie.run_of(trie.runs[r].parent);
            }
        };
        for r in (0..slots).filter(|&r| live(r)) {
            if trie.runs[r].members.iter().any(|m| kept[m.holder as usize]) {
                mark(r, &mut needed);
            }
        }
        for h in self.holders.slots.iter().flatten().filter(|h| keep(h)) {
            h.records.iter().for_each(|rec| mark(trie.run_of(rec.leaf), &mut needed));
        }
        needed
    }

    fn dump_where(&self, keep: Option<&dyn Fn(&Holder) -> bool>) -> KeyspaceDump {
        let trie = &self.trie;
        let slots = trie.runs.slots() as usize;
        let needed = self.needed_runs(keep);
        // Child runs of every run (of its last block), CSR: start[r]..start[r + 1] in `kids`.
        let mut start = vec![0u32; slots + 1];
        let live = |r: u32| needed[r as usize];
        for r in (0..slots as u32).filter(|&r| live(r)) {
            start[trie.run_of(trie.runs[r].parent) as usize + 1] += 1;
        }
        for i in 0..slots {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut kids = vec![0u32; start[slots] as usize];
        for r in (0..slots as u32).filter(|&r| live(r)) {
            let f = &mut fill[trie.run_of(trie.runs[r].parent) as usize];
            kids[*f as usize] = r;
            *f += 1;
        }
        const NONE: u32 = u32::MAX;
        // Dump number of each run's first block (its blocks follow consecutively).
        let mut first = vec![NONE; slots];
        let number = |first: &[u32], b: u32| -> u32 {
            if b == ROOT_BLOCK {
                return 0;
            }
            let r = trie.run_of(b);
            first[r as usize] + (b - trie.runs[r].start)
        };
        let mut nodes = Vec::with_capacity(trie.live_blocks());
        let mut members: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.holders.slots.len()];
        let mut push_children = |r: u32, stack: &mut Vec<u32>| {
            let ch = &mut kids[start[r as usize] as usize..start[r as usize + 1] as usize];
            ch.sort_unstable_by_key(|&c| trie.runs[c].first_local);
            stack.extend(ch.iter().rev());
        };
        let mut stack = Vec::new();
        push_children(ROOT, &mut stack);
        while let Some(r) = stack.pop() {
            let run = &trie.runs[r];
            let base = nodes.len() as u32 + 1;
            let parent = number(&first, run.parent);
            first[r as usize] = base;
            for (i, &local) in trie.blocks.locals(run.start, run.len).iter().enumerate() {
                let i = i as u32;
                let ext = trie.blocks.meta(run.start + i).ext();
                nodes.push(DumpNode { parent: if i == 0 { parent } else { base + i - 1 }, local, ext });
            }
            for m in run.members.iter().filter(|m| keep.is_none_or(|k| k(self.holders.at(m.holder)))) {
                members[m.holder as usize].extend((0..run.len).map(|i| (base + i, m.stamp)));
            }
            push_children(r, &mut stack);
        }
        let holders = self
            .holders
            .sorted()
            .into_iter()
            .filter(|&hi| keep.is_none_or(|k| k(self.holders.at(hi))))
            .map(|hi| {
                let h = self.holders.at(hi);
                let mut overrides: Vec<(u64, u32)> =
                    h.overrides.iter().map(|(&e, &b)| (e, number(&first, b))).collect();
                overrides.sort_unstable();
                DumpHolder {
                    key: h.key,
                    fed: h.fed,
                    gapped: h.gapped,
                    next_stamp: h.next_stamp,
                    last_time: h.last_time,
                    records: h
                        .records
                        .iter()
                        .map(|r| (r.stamp, number(&first, r.leaf), r.len, r.time))
                        .collect(),
                    members: std::mem::take(&mut members[hi as usize]),
                    overrides,
                }
            })
            .collect();
        KeyspaceDump { id: self.id.clone(), nodes, holders, stats: self.stats.clone() }
    }
}
