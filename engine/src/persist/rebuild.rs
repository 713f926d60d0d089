//! Rebuild: a keyspace from a [`KeyspaceDump`], with maximal runs.
//!
//! Dump node `k` becomes block `k` (the dump is depth-first, so every chain is a stretch of
//! consecutive numbers, and block 0 is the root in both). Consecutive nodes form one run while
//! each is the only child of the one before, carries the same members and stamps, and no
//! record ends inside; runs are also cut at `MAX_RUN` and at chunk boundaries. Because the
//! numbering is known up front, the ext table is built from the dump alone, on the other core,
//! while this one lays out blocks and runs.

use crate::digest::{block_term, child_path, ROOT_PATH};
use crate::keyspace::holders::{Holder, Record};
use crate::keyspace::Keyspace;
use crate::persist::dump::KeyspaceDump;
use crate::trie::blocks::CHUNK;
use crate::trie::table::NodeTable;
use crate::trie::{ext_hash, max_run, Member, Members};
use crate::types::{partition_of, EngineConfig, HolderKey};

/// Dumps with fewer nodes rebuild on one thread (a thread costs more than it saves there).
pub(crate) const PARALLEL_FROM: usize = 100_000;

/// Why a dump was refused: what in it is not internally consistent (node numbers are the
/// dump's, from 1).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RebuildError {
    #[error("node {node}: parent {parent} is not an earlier node")]
    ParentNotEarlier { node: u32, parent: u32 },
    #[error("bad node reference {node} (the dump has {nodes} nodes)")]
    NoSuchNode { node: u32, nodes: usize },
    #[error("{holder}: duplicate or unordered member {node}")]
    UnorderedMember { holder: HolderKey, node: u32 },
    #[error("node {node}: ext {ext:#x} bound twice")]
    ExtBoundTwice { node: u32, ext: u64 },
    #[error("node {node}: duplicate child of {parent}")]
    DuplicateChild { node: u32, parent: u32 },
    #[error("{holder}: duplicate holder")]
    DuplicateHolder { holder: HolderKey },
    /// The thread building the ext table beside the run pass panicked (a bug, not the dump).
    #[error("ext table builder panicked")]
    ExtTablePanicked,
}

/// Per node: its members (holder slot = dump order, stamp) as CSR, and its pin count.
struct NodeMembers {
    start: Vec<u32>,
    entries: Vec<Member>,
    pins: Vec<u32>,
}

impl NodeMembers {
    fn of(&self, k: usize) -> &[Member] {
        &self.entries[self.start[k] as usize..self.start[k + 1] as usize]
    }
}

fn node_ref(r: u32, len: usize) -> Result<u32, RebuildError> {
    (r >= 1 && r as usize <= len).then_some(r).ok_or(RebuildError::NoSuchNode { node: r, nodes: len })
}

/// Transposes the holders' member lists to per-node lists and counts record ends.
fn node_members(dump: &KeyspaceDump) -> Result<NodeMembers, RebuildError> {
    let n = dump.nodes.len();
    let mut start = vec![0u32; n + 2];
    let mut pins = vec![0u32; n + 1];
    for h in &dump.holders {
        let mut prev = 0;
        for &(k, _) in &h.members {
            let k = node_ref(k, n)?;
            if k <= prev {
                return Err(RebuildError::UnorderedMember { holder: h.key, node: k });
            }
            prev = k;
            start[k as usize + 1] += 1;
        }
        for r in &h.records {
            pins[node_ref(r.1, n)? as usize] += 1;
        }
    }
    for k in 0..=n {
        start[k + 1] += start[k];
    }
    let mut fill = start.clone();
    let mut entries = vec![Member { holder: 0, stamp: 0 }; start[n + 1] as usize];
    // Holder key order, so every run's member list comes out sorted by key (the order
    // matching relies on), whatever order the dump lists its holders in.
    let mut by_key: Vec<usize> = (0..dump.holders.len()).collect();
    by_key.sort_by_key(|&i| dump.holders[i].key);
    for (slot, h) in by_key.into_iter().map(|i| (i, &dump.holders[i])) {
        for &(k, stamp) in &h.members {
            let f = &mut fill[k as usize];
            entries[*f as usize] = Member { holder: slot as u32, stamp };
            *f += 1;
        }
    }
    Ok(NodeMembers { start, entries, pins })
}

/// Where a new run must begin: node `k` cannot continue node `k - 1`'s run of `len` blocks.
fn starts_run(dump: &KeyspaceDump, children: &[u32], m: &NodeMembers, k: usize, len: u32) -> bool {
    k == 1
        || dump.nodes[k - 1].parent as usize != k - 1
        || children[k - 1] != 1
        || m.pins[k - 1] > 0
        || len >= max_run()
        || k.is_multiple_of(CHUNK)
        || m.of(k) != m.of(k - 1)
}

impl Keyspace {
    /// Rebuilds a keyspace from a dump. Fails on a dump that is not internally consistent
    /// (a forward or out-of-range node reference, a duplicate child or member, an ext bound
    /// twice), never panics.
    pub fn rebuild(dump: &KeyspaceDump, cfg: EngineConfig) -> Result<Keyspace, RebuildError> {
        let n = dump.nodes.len();
        let mut children = vec![0u32; n + 1];
        for (i, node) in dump.nodes.iter().enumerate() {
            if node.parent as usize > i {
                return Err(RebuildError::ParentNotEarlier { node: i as u32 + 1, parent: node.parent });
            }
            children[node.parent as usize] += 1;
        }
        let members = node_members(dump)?;
        let mut ks = Keyspace::new(dump.id.clone(), cfg);
        let edges = children.iter().map(|&c| c.saturating_sub(1) as usize).sum();
        ks.trie.edges.reserve(edges);
        let ext_count = dump.nodes.iter().filter(|x| x.ext.is_some()).count();
        let ext_table = || {
            let entries = dump.nodes.iter().enumerate().filter_map(|(i, x)| Some(((i + 1) as u32, x.ext?)));
            ext_table(entries, ext_count, |k| dump.nodes[k as usize - 1].ext)
                .map_err(|(node, ext)| RebuildError::ExtBoundTwice { node, ext })
        };
        let table = if n < PARALLEL_FROM {
            ext_table().and_then(|t| ks.rebuild_runs(dump, &children, &members).map(|()| t))
        } else {
            std::thread::scope(|s| {
                let table = s.spawn(ext_table);
                let built = ks.rebuild_runs(dump, &children, &members);
                let table = table.join().map_err(|_| RebuildError::ExtTablePanicked)?;
                built.and(table)
            })
        }?;
        ks.trie.install_exts(table);
        ks.rebuild_holders(dump)?;
        ks.holders.rebuild_derived();
        ks.stats = dump.stats.clone();
        ks.recompute_aggregates();
        Ok(ks)
    }

    /// Blocks (node k = block k) and runs, with each holder's blocks and digest.
    fn rebuild_runs(
        &mut self,
        dump: &KeyspaceDump,
        children: &[u32],
        m: &NodeMembers,
    ) -> Result<(), RebuildError> {
        let n = dump.nodes.len();
        self.trie.blocks.reserve_chunks(n + 1);
        self.trie.blocks.set_top(n as u32 + 1);
        for (i, node) in dump.nodes.iter().enumerate() {
            let b = i as u32 + 1;
            self.trie.blocks.locals_mut(b, 1)[0] = node.local;
            if let Some(e) = node.ext {
                self.trie.blocks.set_ext(b, e);
            }
        }
        for dh in &dump.holders {
            let mut h = Holder::new(dh.key, partition_of(dh.key.worker, self.cfg.partitions));
            h.fed = dh.fed;
            self.holders.insert(h);
        }
        let mut k = 1;
        while k <= n {
            let mut len = 1;
            while k + (len as usize) <= n && !starts_run(dump, children, m, k + len as usize, len) {
                len += 1;
            }
            self.rebuild_run(dump, m, k as u32, len)?;
            k += len as usize;
        }
        Ok(())
    }

    /// One run over nodes `first..first + len`: paths, members, digests, pins, link.
    fn rebuild_run(
        &mut self,
        dump: &KeyspaceDump,
        m: &NodeMembers,
        first: u32,
        len: u32,
    ) -> Result<(), RebuildError> {
        let parent = dump.nodes[first as usize - 1].parent;
        let parent_path =
            if parent == 0 { ROOT_PATH } else { self.trie.runs[self.trie.run_of(parent)].end_path };
        let fed: Vec<bool> = m.of(first as usize).iter().map(|x| self.holders.at(x.holder).fed).collect();
        let (need_fed, need_inferred) = (fed.iter().any(|&f| f), fed.iter().any(|&f| !f));
        let (mut path, mut start_path) = (parent_path, 0);
        let (mut fed_sum, mut inferred_sum) = (0u64, 0u64);
        for i in 0..len {
            path = child_path(path, self.trie.blocks.local(first + i));
            self.trie.blocks.set_path(first + i, path);
            if i == 0 {
                start_path = path;
            }
            if need_fed {
                fed_sum = fed_sum.wrapping_add(block_term(path, false));
            }
            if need_inferred {
                inferred_sum = inferred_sum.wrapping_add(block_term(path, true));
            }
        }
        let members: Members = m.of(first as usize).iter().copied().collect();
        for (x, &is_fed) in members.iter().zip(&fed) {
            let h = self.holders.at_mut(x.holder);
            h.blocks += len;
            h.digest = h.digest.wrapping_add(if is_fed { fed_sum } else { inferred_sum });
        }
        let r = self.trie.adopt_run(first, len, parent, (start_path, path), members);
        self.trie.runs[r].pins = m.pins[(first + len - 1) as usize];
        if !self.trie.link_checked(r) {
            return Err(RebuildError::DuplicateChild { node: first, parent });
        }
        Ok(())
    }

    /// Holder fields, records and overrides (blocks and digests came with the runs).
    fn rebuild_holders(&mut self, dump: &KeyspaceDump) -> Result<(), RebuildError> {
        let n = dump.nodes.len();
        for (slot, dh) in dump.holders.iter().enumerate() {
            let slot = slot as u32;
            if self.holders.get(&dh.key) != Some(slot) {
                return Err(RebuildError::DuplicateHolder { holder: dh.key });
            }
            let h = self.holders.at_mut(slot);
            (h.gapped, h.next_stamp, h.last_time) = (dh.gapped, dh.next_stamp, dh.last_time);
            for &(ext, k) in &dh.overrides {
                let k = node_ref(k, n)?;
                h.overrides.insert(ext, k);
                h.override_of.insert(k, ext);
            }
            for &(stamp, leaf, len, time) in &dh.records {
                h.records.push_back(Record { stamp, leaf: node_ref(leaf, n)?, len, time });
            }
        }
        Ok(())
    }
}

/// An ext table for `(block, ext)` pairs read from a dump, built beside the run pass (on
/// another core); `ext_of` reads a candidate block's ext back from the same dump. Fails with
/// the first pair whose ext is already taken.
fn ext_table(
    entries: impl Iterator<Item = (u32, u64)>,
    count: usize,
    ext_of: impl Fn(u32) -> Option<u64>,
) -> Result<NodeTable, (u32, u64)> {
    let mut t = NodeTable::default();
    t.reserve(count);
    for (b, ext) in entries {
        let h = ext_hash(ext);
        if t.find(h, |k| ext_of(k) == Some(ext)).is_some() {
            return Err((b, ext));
        }
        t.insert(h, b);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::mix64;
    use crate::types::{BlockHashes, HolderKey, KeyspaceId};

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
            let blocks: Vec<BlockHashes> = (0..80u64)
                .map(|i| {
                    let c = if i < 3 { chain % 50 } else { chain };
                    BlockHashes::new(mix64(c << 8 | i), mix64(c << 8 | i) ^ 1)
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
                assert_eq!(rebuilt.trie.by_ext(e), Some((i + 1) as u32), "ext of node {}", i + 1);
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
        assert_eq!(err, RebuildError::ExtBoundTwice { node: bad.nodes.len() as u32, ext: dup });
    }
}
