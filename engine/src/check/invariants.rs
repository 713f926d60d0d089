//! [`Keyspace::check_invariants`]: recomputes everything the writes maintain by hand (pins,
//! counts, digests, run layout, table entries, free lists, override maps) and names the first
//! thing that disagrees. For tests (the differential test runs it after every step) and
//! audits; it costs a full pass over the state.

use crate::keyspace::holders::{Holder, Record};
use crate::keyspace::Keyspace;
use crate::partition::partition_of;
use crate::trie::{Segment, ROOT};
use crate::types::{ensure, InvariantError};
use rustc_hash::FxHashMap;

impl Keyspace {
    /// Recomputes every hand-maintained quantity and compares. `Ok` on a consistent state;
    /// otherwise the first disagreement found. Cost: a full pass over runs, blocks, tables
    /// and records.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        self.trie.check_structure()?;
        self.check_holder_index()?;
        let totals = self.member_totals()?;
        for (slot, h) in self.holders.slots.iter().enumerate() {
            let Some(h) = h else { continue };
            let slot = slot as u32;
            let (n, d) = totals.get(&slot).copied().unwrap_or((0, 0));
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
            self.check_card(slot, h)?;
            self.check_records(slot, h)?;
            self.check_overrides(slot, h)?;
        }
        self.check_pins()?;
        self.check_aggregates()
    }

    pub(crate) fn check_holder_index(&self) -> Result<(), InvariantError> {
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
        self.holders.check_derived().map_err(InvariantError::DerivedIndex)
    }

    /// The holder in `slot` against its card (the copy a match reads) and its partition (the
    /// one its worker maps to). The one check of a holder's card, for the full check and the
    /// scrub alike.
    pub(crate) fn check_card(&self, slot: u32, h: &Holder) -> Result<(), InvariantError> {
        let card = self.holders.card(slot);
        let synced = (card.key(), card.blocks, card.fed, card.gapped) == (h.key, h.blocks, h.fed, h.gapped);
        ensure(synced, || InvariantError::HolderIndex { slot, what: "card differs from the holder" })?;
        let expected = partition_of(h.key.worker, self.cfg.partitions);
        ensure(h.group == expected, || InvariantError::HolderPartition {
            holder: h.key,
            group: h.group,
            expected,
        })
    }

    /// Member `k` of live run `r`: a live holder, after the member before it in key order (the
    /// members before it are checked already). Returns the holder.
    pub(crate) fn check_member(&self, r: u32, k: usize) -> Result<&Holder, InvariantError> {
        let run = &self.trie.runs[r];
        let m = run.members[k];
        let member = |what| InvariantError::Member { run: r, holder: m.holder, what };
        let holder = self.holders.slots.get(m.holder as usize).and_then(Option::as_ref);
        let Some(holder) = holder else { return Err(member("member holder slot is empty")) };
        let before = k.checked_sub(1).map(|j| self.holders.slots[run.members[j].holder as usize].as_ref());
        let sorted = before.is_none_or(|p| p.is_some_and(|p| p.key < holder.key));
        ensure(sorted, || member("members not in strictly increasing holder key order"))?;
        Ok(holder)
    }

    /// Per holder slot: blocks held and the sum of their digest terms, from the runs.
    fn member_totals(&self) -> Result<FxHashMap<u32, (u32, u64)>, InvariantError> {
        let mut totals: FxHashMap<u32, (u32, u64)> = FxHashMap::default();
        let trie = &self.trie;
        for r in 1..trie.runs.slots() {
            let run = &trie.runs[r];
            if !run.live() {
                continue;
            }
            for (k, m) in run.members.iter().enumerate() {
                let holder = self.check_member(r, k)?;
                let t = totals.entry(m.holder).or_insert((0, 0));
                t.0 += run.len;
                t.1 = t.1.wrapping_add(trie.terms(r, 0, run.len, !holder.fed));
            }
        }
        Ok(totals)
    }

    /// Record order and ranges, and that every block lies in the window of its record.
    fn check_records(&self, slot: u32, h: &Holder) -> Result<(), InvariantError> {
        let (mut prev, mut owned) = (0u32, 0u32);
        let mut window = Vec::new();
        for r in &h.records {
            owned += self.check_record(slot, h, r, prev, owned, &mut window)?;
            prev = r.stamp;
        }
        ensure(owned == h.blocks, || InvariantError::Ownership { holder: h.key, owned, blocks: h.blocks })
    }

    /// One record of the holder in `slot`, after a record stamped `prev` (0: the first) and
    /// `owned` blocks counted so far: stamp order and range, leaf, window (left in `window`),
    /// and that it owns the runs of its stamp whole. Returns the blocks it owns.
    pub(crate) fn check_record(
        &self,
        slot: u32,
        h: &Holder,
        r: &Record,
        prev: u32,
        owned: u32,
        window: &mut Vec<Segment>,
    ) -> Result<u32, InvariantError> {
        let trie = &self.trie;
        let err = |stamp, what| InvariantError::Record { holder: h.key, stamp, what };
        ensure(r.stamp > prev, || err(r.stamp, "stamps not increasing"))?;
        ensure(r.stamp < h.next_stamp, || err(r.stamp, "stamp not below next_stamp"))?;
        ensure(r.len >= 1, || err(r.stamp, "empty window"))?;
        let leaf_run = (r.leaf < trie.blocks.top()).then(|| trie.run_of(r.leaf));
        let at_end =
            leaf_run.and_then(|lr| trie.runs.get(lr)).is_some_and(|run| run.live() && run.last() == r.leaf);
        ensure(at_end && r.leaf != 0, || err(r.stamp, "leaf is not the last block of a live run"))?;
        trie.window(r.leaf, r.len, window);
        let reach: u32 = window.iter().map(|s| s.2).sum();
        ensure(reach == r.len, || err(r.stamp, "window reaches past the root"))?;
        let mut mine = 0;
        for &(run, _, count) in window.iter() {
            if trie.runs[run].has(slot, r.stamp) {
                let whole = count == trie.runs[run].len;
                let owned = owned + mine;
                ensure(whole, || InvariantError::Ownership { holder: h.key, owned, blocks: h.blocks })?;
                mine += count;
            }
        }
        Ok(mine)
    }

    fn check_overrides(&self, slot: u32, h: &Holder) -> Result<(), InvariantError> {
        check_override_maps(h)?;
        for (&ext, &b) in &h.overrides {
            self.check_override(slot, h, ext, b)?;
        }
        Ok(())
    }

    /// One override of the holder in `slot`: it maps back, onto a held live block.
    pub(crate) fn check_override(
        &self,
        slot: u32,
        h: &Holder,
        ext: u64,
        b: u32,
    ) -> Result<(), InvariantError> {
        let trie = &self.trie;
        let err = |what| InvariantError::Override { holder: h.key, ext, what };
        ensure(h.override_of.get(&b) == Some(&ext), || err("override_of does not map back"))?;
        let run = (b < trie.blocks.top()).then(|| trie.run_of(b)).and_then(|r| trie.runs.get(r));
        let held = run.is_some_and(|run| run.live() && run.member(slot).is_some()) && b != 0;
        ensure(held, || err("override target is not a held live block"))
    }

    fn check_pins(&self) -> Result<(), InvariantError> {
        let mut leaves: FxHashMap<u32, u32> = FxHashMap::default();
        for h in self.holders.slots.iter().flatten() {
            for r in &h.records {
                *leaves.entry(r.leaf).or_insert(0) += 1;
            }
        }
        for r in 0..self.trie.runs.slots() {
            let run = &self.trie.runs[r];
            let (pins, records) = if run.live() && r != ROOT {
                (run.pins, leaves.get(&run.last()).copied().unwrap_or(0))
            } else {
                (run.pins, 0)
            };
            ensure(pins == records, || InvariantError::Pins { run: r, pins, records })?;
        }
        Ok(())
    }

    pub(crate) fn check_aggregates(&self) -> Result<(), InvariantError> {
        let groups = self.cfg.partitions.max(1) as usize;
        let (mut digest, mut parts, mut blocks) = (0u64, vec![0u64; groups], 0u64);
        for h in self.holders.slots.iter().flatten() {
            let t = crate::digest::holder_term(&h.key, h.blocks, h.digest);
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

/// A holder's two override maps are the same size (each entry is checked against the other
/// map by [`Keyspace::check_override`]).
pub(crate) fn check_override_maps(h: &Holder) -> Result<(), InvariantError> {
    let err = |what| InvariantError::Override { holder: h.key, ext: 0, what };
    ensure(h.overrides.len() == h.override_of.len(), || err("maps differ in size"))
}
