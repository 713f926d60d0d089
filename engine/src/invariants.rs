//! [`Keyspace::check_invariants`]: recomputes everything the writes maintain by hand (pins,
//! counts, digests, table entries, the free list, override maps) and names the first thing
//! that disagrees. For tests (the differential test runs it after every step) and audits;
//! it costs a full pass over the state.

use crate::digest::{block_term, child_path, holder_term};
use crate::keyspace::Keyspace;
use crate::partition::partition_of;
use crate::trie::ROOT;
use crate::types::HolderKey;
use rustc_hash::FxHashMap;

/// What broke. Node and holder numbers are internal indices (arena slots, holder slots).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvariantError {
    /// A node's pin count is not the number of operation records whose window ends there.
    #[error("node {node}: {pins} pins, but {records} records end there")]
    Pins { node: u32, pins: u32, records: u32 },
    /// A holder's block count is not the number of nodes it is a member of.
    #[error("{holder}: counts {counted} blocks, is a member of {members} nodes")]
    HolderBlocks { holder: HolderKey, counted: u32, members: u32 },
    /// A holder's digest is not the sum of its blocks' terms.
    #[error("{holder}: digest {stored:#x}, its blocks sum to {recomputed:#x}")]
    HolderDigest { holder: HolderKey, stored: u64, recomputed: u64 },
    /// A keyspace-level aggregate (`digest`, `partition N digest`, `holder_blocks`) is not
    /// the sum over its holders.
    #[error("{what}: stored {stored:#x}, recomputed {recomputed:#x}")]
    Aggregate { what: String, stored: u64, recomputed: u64 },
    /// A holder is filed under another partition than its worker maps to.
    #[error("{holder}: filed in partition {group}, belongs in {expected}")]
    HolderPartition { holder: HolderKey, group: u32, expected: u32 },
    /// The holder index and the holder slots disagree.
    #[error("holder slot {slot}: {what}")]
    HolderIndex { slot: u32, what: &'static str },
    /// A node's place in the trie: parent, child count, first child, path hash, lookup.
    #[error("node {node}: {what}")]
    Link { node: u32, what: &'static str },
    /// The ext table: a bound ext that does not resolve to its node, or an entry for no node.
    #[error("node {node}: {what}")]
    Ext { node: u32, what: &'static str },
    /// The edge table holds an entry that is not a live non-first child.
    #[error("node {node}: {what}")]
    Edge { node: u32, what: &'static str },
    /// The free list and node liveness disagree.
    #[error("node {node}: {what}")]
    FreeList { node: u32, what: &'static str },
    /// A node's membership list: a dead holder, or a holder listed twice.
    #[error("node {node}, holder slot {holder}: {what}")]
    Member { node: u32, holder: u32, what: &'static str },
    /// A holder's operation records: stamp order, stamp range, dead leaf, empty window.
    #[error("{holder}, record stamp {stamp}: {what}")]
    Record { holder: HolderKey, stamp: u32, what: &'static str },
    /// Some member block of the holder is not inside the window of the record whose stamp it
    /// carries (every block belongs to exactly one record).
    #[error("{holder}: {owned} of {blocks} blocks lie in the window of the record that stamped them")]
    Ownership { holder: HolderKey, owned: u32, blocks: u32 },
    /// `overrides` and `override_of` are not inverse maps of live, held nodes.
    #[error("{holder}, ext {ext:#x}: {what}")]
    Override { holder: HolderKey, ext: u64, what: &'static str },
}

/// `Ok` if `ok`, else the error `err` builds.
pub(crate) fn ensure(ok: bool, err: impl FnOnce() -> InvariantError) -> Result<(), InvariantError> {
    if ok {
        Ok(())
    } else {
        Err(err())
    }
}

impl Keyspace {
    /// Recomputes every hand-maintained quantity and compares. `Ok` on a consistent state;
    /// otherwise the first disagreement found. Cost: a full pass over nodes, tables and records.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        self.arena.check_structure()?;
        self.check_nodes()?;
        self.check_holder_index()?;
        let (blocks, digests) = self.member_totals()?;
        for (slot, h) in self.holders.slots.iter().enumerate() {
            let Some(h) = h else { continue };
            let slot = slot as u32;
            let (n, d) = (blocks.get(&slot).copied().unwrap_or(0), digests.get(&slot).copied().unwrap_or(0));
            ensure(h.blocks == n, || InvariantError::HolderBlocks {
                holder: h.key,
                counted: h.blocks,
                members: n,
            })?;
            ensure(h.digest == d, || InvariantError::HolderDigest {
                holder: h.key,
                stored: h.digest,
                recomputed: d,
            })?;
            let expected = partition_of(h.key.worker, self.cfg.partitions);
            ensure(h.group == expected, || InvariantError::HolderPartition {
                holder: h.key,
                group: h.group,
                expected,
            })?;
            self.check_records(slot)?;
            self.check_overrides(slot)?;
        }
        self.check_pins()?;
        self.check_aggregates()
    }

    /// Paths and membership lists of every live node.
    fn check_nodes(&self) -> Result<(), InvariantError> {
        for (i, n) in self.arena.nodes.iter().enumerate().skip(1) {
            if !n.live() {
                continue;
            }
            let node = i as u32;
            let want = child_path(self.arena.nodes[n.parent as usize].path, n.local);
            ensure(n.path == want, || InvariantError::Link {
                node,
                what: "path hash is not its parent's chained with its local",
            })?;
            for (k, m) in n.members.iter().enumerate() {
                let live = self.holders.slots.get(m.holder as usize).is_some_and(Option::is_some);
                ensure(live, || InvariantError::Member {
                    node,
                    holder: m.holder,
                    what: "member holder slot is empty",
                })?;
                let dup = n.members[..k].iter().any(|o| o.holder == m.holder);
                ensure(!dup, || InvariantError::Member {
                    node,
                    holder: m.holder,
                    what: "holder listed twice",
                })?;
            }
        }
        Ok(())
    }

    fn check_holder_index(&self) -> Result<(), InvariantError> {
        let live = self.holders.slots.iter().filter(|s| s.is_some()).count();
        ensure(live == self.holders.index.len(), || InvariantError::HolderIndex {
            slot: u32::MAX,
            what: "index size differs from the live slot count",
        })?;
        for (slot, h) in self.holders.slots.iter().enumerate() {
            if let Some(h) = h {
                let indexed = self.holders.index.get(&h.key) == Some(&(slot as u32));
                ensure(indexed, || InvariantError::HolderIndex {
                    slot: slot as u32,
                    what: "key not indexed to its slot",
                })?;
            }
        }
        Ok(())
    }

    /// Per holder slot: memberships and the sum of their digest terms.
    #[allow(clippy::type_complexity)]
    fn member_totals(&self) -> Result<(FxHashMap<u32, u32>, FxHashMap<u32, u64>), InvariantError> {
        let (mut blocks, mut digests) = (FxHashMap::default(), FxHashMap::default());
        for n in self.arena.nodes.iter().skip(1).filter(|n| n.live()) {
            for m in n.members.iter() {
                let fed = self.holders.at(m.holder).fed;
                *blocks.entry(m.holder).or_insert(0u32) += 1;
                let d = digests.entry(m.holder).or_insert(0u64);
                *d = d.wrapping_add(block_term(n.path, !fed));
            }
        }
        Ok((blocks, digests))
    }

    /// Record order and ranges, and that every block lies in the window of its record.
    fn check_records(&self, slot: u32) -> Result<(), InvariantError> {
        let h = self.holders.at(slot);
        let err = |stamp, what| InvariantError::Record { holder: h.key, stamp, what };
        let mut prev = 0u32;
        let mut owned = 0u32;
        let mut window = Vec::new();
        for r in &h.records {
            ensure(r.stamp > prev, || err(r.stamp, "stamps not increasing"))?;
            ensure(r.stamp < h.next_stamp, || err(r.stamp, "stamp not below next_stamp"))?;
            ensure(r.len >= 1, || err(r.stamp, "empty window"))?;
            let leaf_live =
                (r.leaf as usize) < self.arena.nodes.len() && self.arena.nodes[r.leaf as usize].live();
            ensure(leaf_live && r.leaf != ROOT, || err(r.stamp, "leaf is not a live node"))?;
            prev = r.stamp;
            self.arena.window(r.leaf, r.len, &mut window);
            ensure(window.len() == r.len as usize, || err(r.stamp, "window reaches past the root"))?;
            owned += window
                .iter()
                .filter(|&&n| {
                    self.arena.nodes[n as usize]
                        .members
                        .iter()
                        .any(|m| m.holder == slot && m.stamp == r.stamp)
                })
                .count() as u32;
        }
        ensure(owned == h.blocks, || InvariantError::Ownership { holder: h.key, owned, blocks: h.blocks })
    }

    fn check_overrides(&self, slot: u32) -> Result<(), InvariantError> {
        let h = self.holders.at(slot);
        let err = |ext, what| InvariantError::Override { holder: h.key, ext, what };
        ensure(h.overrides.len() == h.override_of.len(), || err(0, "maps differ in size"))?;
        for (&ext, &node) in &h.overrides {
            ensure(h.override_of.get(&node) == Some(&ext), || err(ext, "override_of does not map back"))?;
            let held = (node as usize) < self.arena.nodes.len()
                && self.arena.nodes[node as usize].live()
                && self.arena.nodes[node as usize].member(slot).is_some();
            ensure(held, || err(ext, "override target is not a held live node"))?;
        }
        Ok(())
    }

    fn check_pins(&self) -> Result<(), InvariantError> {
        let mut leaves: FxHashMap<u32, u32> = FxHashMap::default();
        for h in self.holders.slots.iter().flatten() {
            for r in &h.records {
                *leaves.entry(r.leaf).or_insert(0) += 1;
            }
        }
        for (i, n) in self.arena.nodes.iter().enumerate().skip(1) {
            let records = leaves.get(&(i as u32)).copied().unwrap_or(0);
            let pins = if n.live() { n.pins } else { 0 };
            ensure(pins == records, || InvariantError::Pins { node: i as u32, pins, records })?;
        }
        Ok(())
    }

    fn check_aggregates(&self) -> Result<(), InvariantError> {
        let groups = self.cfg.partitions.max(1) as usize;
        let (mut digest, mut parts, mut blocks) = (0u64, vec![0u64; groups], 0u64);
        for h in self.holders.slots.iter().flatten() {
            let t = holder_term(&h.key, h.blocks, h.digest);
            digest = digest.wrapping_add(t);
            parts[h.group as usize] = parts[h.group as usize].wrapping_add(t);
            blocks += u64::from(h.blocks);
        }
        let agg = |what: String, stored: u64, recomputed: u64| {
            ensure(stored == recomputed, || InvariantError::Aggregate { what, stored, recomputed })
        };
        agg("keyspace digest".into(), self.digest(), digest)?;
        for (p, &d) in parts.iter().enumerate() {
            agg(format!("partition {p} digest"), self.partition_digest(p as u32), d)?;
        }
        agg("holder_blocks".into(), self.holder_blocks(), blocks)
    }
}
