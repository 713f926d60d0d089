//! Enumerate and rebuild: the complete state of a keyspace as plain data.
//!
//! A dump carries everything that influences later behaviour — not only the block sets but
//! the operation records and stamps that decide future capacity eviction and TTL expiry —
//! so a rebuilt keyspace answers, digests and evolves exactly like the original.

use crate::holder::{Holder, Record};
use crate::keyspace::Keyspace;
use crate::trie::{Arena, Member, ROOT};
use crate::types::{partition_of, EngineConfig, HolderKey, KeyspaceId, KeyspaceStats, LogTime};

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

/// Dumps with fewer nodes rebuild on one thread (a thread costs more than it saves there).
const PARALLEL_FROM: usize = 100_000;

/// The node pass of a rebuild: every dump node `k` becomes arena node `k`, exts set but not
/// indexed (the ext table is built beside it).
fn rebuild_nodes(ks: &mut Keyspace, dump: &KeyspaceDump) -> Result<(), String> {
    for (i, n) in dump.nodes.iter().enumerate() {
        let num = (i + 1) as u32;
        if n.parent >= num {
            return Err(format!("node {num}: parent {} is not an earlier node", n.parent));
        }
        let before = ks.arena.len();
        let c = ks.arena.child_or_insert(n.parent, n.local);
        if ks.arena.len() == before {
            return Err(format!("node {num}: duplicate child of {}", n.parent));
        }
        if c != num {
            return Err(format!("node {num}: numbered {c} in the arena (rebuild into a used arena)"));
        }
        if let Some(e) = n.ext {
            ks.arena.set_ext_unindexed(c, e);
        }
    }
    Ok(())
}

impl Keyspace {
    /// Enumerates the full state. Nodes are numbered in depth-first preorder from the root,
    /// children by (local), so the numbering depends only on the trie's content.
    ///
    /// Depth-first because a rebuild then visits memory in order: a node's parent is almost
    /// always the node just created, each holder's members are runs of consecutive numbers,
    /// and the rebuilt arena lays every chain out contiguously (matching walks chains).
    /// Flat arrays only (children as one CSR array, renumbering as a `Vec`): this runs while
    /// ingest is paused for a checkpoint, over tens of millions of nodes.
    pub fn dump(&self) -> KeyspaceDump {
        let nodes_in = &self.arena.nodes;
        let n = nodes_in.len();
        // Children of every node, CSR: start[p]..start[p+1] in `kids`.
        let mut start = vec![0u32; n + 1];
        for node in nodes_in.iter().skip(1).filter(|x| x.live()) {
            start[node.parent as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut kids = vec![0u32; start[n] as usize];
        for (i, node) in nodes_in.iter().enumerate().skip(1) {
            if node.live() {
                let f = &mut fill[node.parent as usize];
                kids[*f as usize] = i as u32;
                *f += 1;
            }
        }
        const NONE: u32 = u32::MAX;
        let mut number = vec![NONE; n];
        number[ROOT as usize] = 0;
        let mut nodes = Vec::with_capacity(kids.len());
        let mut members: Vec<Vec<(u32, u32)>> = vec![Vec::new(); self.holders.slots.len()];
        // Children sorted by local, pushed in reverse so the smallest is numbered first.
        let mut push_children = |p: usize, stack: &mut Vec<u32>| {
            let ch = &mut kids[start[p] as usize..start[p + 1] as usize];
            ch.sort_unstable_by_key(|&c| nodes_in[c as usize].local);
            stack.extend(ch.iter().rev());
        };
        let mut stack = Vec::new();
        push_children(ROOT as usize, &mut stack);
        while let Some(c) = stack.pop() {
            let node = &nodes_in[c as usize];
            nodes.push(DumpNode {
                parent: number[node.parent as usize],
                local: node.local,
                ext: node.has_ext().then_some(node.ext),
            });
            let num = nodes.len() as u32;
            number[c as usize] = num;
            for m in node.members.iter() {
                members[m.holder as usize].push((num, m.stamp));
            }
            push_children(c as usize, &mut stack);
        }
        let holders = self
            .holders
            .sorted()
            .into_iter()
            .map(|hi| {
                let h = self.holders.at(hi);
                let mut overrides: Vec<(u64, u32)> =
                    h.overrides.iter().map(|(&e, &n)| (e, number[n as usize])).collect();
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
                        .map(|r| (r.stamp, number[r.leaf as usize], r.len, r.time))
                        .collect(),
                    members: std::mem::take(&mut members[hi as usize]),
                    overrides,
                }
            })
            .collect();
        KeyspaceDump { id: self.id.clone(), nodes, holders, stats: self.stats.clone() }
    }

    /// Rebuilds a keyspace from a dump. Fails on a dump that is not internally consistent
    /// (a forward or out-of-range node reference, a duplicate child), never panics.
    pub fn rebuild(dump: &KeyspaceDump, cfg: EngineConfig) -> Result<Keyspace, String> {
        let mut ks = Keyspace::new(dump.id.clone(), cfg);
        // Children beyond their parent's first go into the edge table: count them to reserve.
        let mut has_child = vec![false; dump.nodes.len() + 1];
        let mut edges = 0;
        for n in &dump.nodes {
            if let Some(seen) = has_child.get_mut(n.parent as usize) {
                edges += usize::from(std::mem::replace(seen, true));
            }
        }
        drop(has_child);
        ks.arena.reserve(dump.nodes.len(), 0, edges);
        // In a fresh arena dump node k becomes arena node k (checked below), so the ext table
        // can be built from the dump alone, on the other core, while this one builds nodes.
        let ext_count = dump.nodes.iter().filter(|n| n.ext.is_some()).count();
        let ext_table = || {
            let entries = dump.nodes.iter().enumerate().filter_map(|(i, n)| Some(((i + 1) as u32, n.ext?)));
            Arena::ext_table(entries, ext_count, |k| dump.nodes[k as usize - 1].ext)
                .map_err(|(k, e)| format!("node {k}: ext {e:#x} bound twice"))
        };
        let table = if dump.nodes.len() < PARALLEL_FROM {
            ext_table().and_then(|t| rebuild_nodes(&mut ks, dump).map(|()| t))
        } else {
            std::thread::scope(|s| {
                let table = s.spawn(ext_table);
                let built = rebuild_nodes(&mut ks, dump);
                let table = table.join().map_err(|_| "ext table builder panicked".to_string())?;
                built.and(table)
            })
        }?;
        ks.arena.install_exts(table);
        let len = dump.nodes.len();
        let node = |r: u32| -> Result<u32, String> {
            (r >= 1 && r as usize <= len).then_some(r).ok_or_else(|| format!("bad node reference {r}"))
        };
        for dh in &dump.holders {
            if ks.holders.get(&dh.key).is_some() {
                return Err(format!("{}: duplicate holder", dh.key));
            }
            let mut h = Holder::new(dh.key, partition_of(dh.key.worker, ks.cfg.partitions));
            h.fed = dh.fed;
            h.gapped = dh.gapped;
            h.next_stamp = dh.next_stamp;
            h.last_time = dh.last_time;
            for &(ext, n) in &dh.overrides {
                let n = node(n)?;
                h.overrides.insert(ext, n);
                h.override_of.insert(n, ext);
            }
            let hi = ks.holders.insert(h);
            let mut blocks = 0u32;
            let mut digest = 0u64;
            for &(n, stamp) in &dh.members {
                let n = node(n)?;
                let nd = &mut ks.arena.nodes[n as usize];
                if nd.member(hi).is_some() {
                    return Err(format!("{}: duplicate member", dh.key));
                }
                nd.members.push(Member { holder: hi, stamp });
                blocks += 1;
                digest = digest.wrapping_add(crate::digest::block_term(nd.path, !dh.fed));
            }
            for &(stamp, leaf, len, time) in &dh.records {
                let leaf = node(leaf)?;
                ks.arena.nodes[leaf as usize].pins += 1;
                ks.holders.at_mut(hi).records.push_back(Record { stamp, leaf, len, time });
            }
            let h = ks.holders.at_mut(hi);
            h.blocks = blocks;
            h.digest = digest;
        }
        ks.stats = dump.stats.clone();
        ks.recompute_aggregates();
        Ok(ks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::mix64;

    /// A dump large enough for the two-thread rebuild: the rebuilt keyspace dumps identically,
    /// resolves every ext to its node, rejects an ext bound twice, and keeps evolving like
    /// the original (removals by ext go through the table built on the other thread).
    #[test]
    fn parallel_rebuild_matches_and_resolves_every_ext() {
        let cfg = EngineConfig::default();
        let mut ks = Keyspace::new(KeyspaceId::new("m", 16, 1), cfg.clone());
        let mut t = 0;
        for chain in 0..2_000u64 {
            // Chains of 80 blocks under 50 shared heads: branching plus long runs.
            let blocks: Vec<(u64, u64)> = (0..80u64)
                .map(|i| {
                    let c = if i < 3 { chain % 50 } else { chain };
                    (mix64(c << 8 | i), mix64(c << 8 | i) ^ 1)
                })
                .collect();
            t += 1;
            ks.store(HolderKey::new(chain % 37, 0, 0), None, &blocks, t).unwrap();
        }
        let dump = ks.dump();
        assert!(dump.nodes.len() >= PARALLEL_FROM, "{} nodes: the parallel path runs", dump.nodes.len());
        let mut rebuilt = Keyspace::rebuild(&dump, cfg.clone()).unwrap();
        assert_eq!(rebuilt.dump(), dump);
        assert_eq!(rebuilt.digest(), ks.digest());
        for (i, n) in dump.nodes.iter().enumerate() {
            if let Some(e) = n.ext {
                assert_eq!(rebuilt.arena.by_ext(e), Some((i + 1) as u32), "ext of node {}", i + 1);
            }
        }
        for chain in (0..2_000u64).step_by(7) {
            let exts: Vec<u64> = (40..80u64).map(|i| mix64(chain << 8 | i)).collect();
            let key = HolderKey::new(chain % 37, 0, 0);
            assert_eq!(rebuilt.remove(key, &exts, t + 1), ks.remove(key, &exts, t + 1));
        }
        assert_eq!(rebuilt.dump(), ks.dump());

        let mut bad = dump.clone();
        let dup = bad.nodes[10].ext.expect("stored nodes have exts");
        let last = bad.nodes.len() - 1;
        bad.nodes[last].ext = Some(dup);
        let err = Keyspace::rebuild(&bad, cfg).err().expect("an ext bound twice is refused");
        assert!(err.contains("bound twice"), "{err}");
    }
}
