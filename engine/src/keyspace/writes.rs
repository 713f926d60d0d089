//! The write operations of a keyspace: store, remove, clear, place, and the capacity bound.
//!
//! Each is a deterministic function of its arguments and the current state (the only notion of
//! time is the log time passed in), and each visits only the holder it writes: it snaps the
//! holder's aggregate term first and settles the change once at the end (`aggregates`), and
//! does the membership work through `members`. A holder over its capacity loses its oldest
//! operations' blocks, down to 7/8 of the bound.

use super::holders::{Holder, Record};
use super::store_check::check_store;
use super::{Keyspace, PlaceOutcome};
use crate::trie::blocks::ROOT_BLOCK;
use crate::trie::ext_hash;
use crate::types::{partition_of, ApplyError, BlockHashes, HolderKey, InvalidStoreReason, LogTime, Tier};

/// How many blocks ahead a write prefetches ext-table slots.
const PREFETCH_AHEAD: usize = 12;

impl Keyspace {
    /// Extends the holder's chain ending at `parent_ext` (or the root) with `blocks`, given as
    /// `(ext, local)`. Re-storing held blocks is idempotent apart from refreshing their age.
    /// A store that names an ext twice or names its parent among its blocks is refused whole
    /// ([`ApplyError::InvalidStore`]): nothing changes but `stores_rejected`.
    pub fn store(
        &mut self,
        key: HolderKey,
        parent_ext: Option<u64>,
        blocks: &[BlockHashes],
        t: LogTime,
    ) -> Result<u32, ApplyError> {
        let mut scratch = std::mem::take(&mut self.ext_scratch);
        let checked = check_store(parent_ext, blocks, &mut scratch);
        self.ext_scratch = scratch;
        if let Err(reason) = checked {
            return Err(self.refuse_store(key, reason));
        }
        self.store_checked(key, parent_ext, blocks, t)
    }

    /// Counts a store refused by [`check_store`]; the state is otherwise unchanged.
    pub(crate) fn refuse_store(&mut self, holder: HolderKey, reason: InvalidStoreReason) -> ApplyError {
        self.stats.stores_rejected += 1;
        ApplyError::InvalidStore { holder, reason }
    }

    /// [`Self::store`] for a block list that passed [`check_store`] (the engine checks a whole
    /// store once, before cutting it into chunks).
    pub(crate) fn store_checked(
        &mut self,
        key: HolderKey,
        parent_ext: Option<u64>,
        blocks: &[BlockHashes],
        t: LogTime,
    ) -> Result<u32, ApplyError> {
        let h = match (self.holders.get(&key), parent_ext) {
            (Some(h), _) => h,
            (None, None) => self.holder_or_insert(key),
            // A tier's first blocks may hang off a parent another tier of the slot holds (a
            // block offloaded to the host while its parent stays on the GPU).
            (None, Some(p)) if self.resolve_in_slot(key, p).is_some() => self.holder_or_insert(key),
            // A holder that holds nothing cannot hold the parent: refused, and nothing is
            // created (the holder's existence never depends on refused writes).
            (None, Some(p)) => {
                self.stats.stores_rejected += 1;
                return Err(ApplyError::MissingParent { holder: key, parent_ext: p });
            }
        };
        let snap = self.snap(h);
        let r = self.store_inner(h, key, parent_ext, blocks, t);
        self.settle(h, snap);
        r
    }

    fn store_inner(
        &mut self,
        h: u32,
        key: HolderKey,
        parent_ext: Option<u64>,
        blocks: &[BlockHashes],
        t: LogTime,
    ) -> Result<u32, ApplyError> {
        self.touch(h, t);
        self.ensure_fed(h);
        let parent = match parent_ext {
            None => ROOT_BLOCK,
            Some(p) => match self.resolve(h, p).or_else(|| self.resolve_in_slot(key, p)) {
                Some(b) => b,
                None => {
                    self.holders.at_mut(h).gapped = true;
                    self.stats.stores_rejected += 1;
                    return Err(ApplyError::MissingParent { holder: key, parent_ext: p });
                }
            },
        };
        if blocks.is_empty() {
            return Ok(0);
        }
        self.prefetch_exts(blocks.iter().map(|b| b.ext).take(PREFETCH_AHEAD));
        let mut locals = std::mem::take(&mut self.locals);
        locals.clear();
        locals.extend(blocks.iter().map(|b| b.local));
        let added = self.hold_chain(h, parent, &locals, t, |ks, i, b| {
            ks.prefetch_exts(blocks.get(i + PREFETCH_AHEAD).map(|b| b.ext));
            ks.bind_or_override(h, b, blocks[i].ext);
        });
        self.locals = locals;
        self.stats.blocks_stored += u64::from(added);
        self.after_write(h);
        Ok(added)
    }

    /// The body of a store or placement: walks (creating what is missing) from block `parent`
    /// along `locals`, makes the holder a member of every block with a fresh stamp, calls
    /// `each(self, i, block)` for the i-th block in order, and records the operation at log
    /// time `t`. Returns the blocks new to the holder.
    fn hold_chain(
        &mut self,
        h: u32,
        parent: u32,
        locals: &[u64],
        t: LogTime,
        mut each: impl FnMut(&mut Self, usize, u32),
    ) -> u32 {
        let stamp = self.take_stamp(h);
        let mut stretches = std::mem::take(&mut self.stretches);
        let inferred = !self.holders.at(h).fed;
        self.trie.walk_create(parent, locals, inferred, &mut stretches);
        let mut added = 0;
        for st in &stretches {
            added += self.add_member_stretch(h, st.first, st.count, stamp, st.new_terms);
        }
        let mut i = 0;
        for st in &stretches {
            for b in st.first..st.first + st.count {
                each(self, i, b);
                i += 1;
            }
        }
        let leaf = stretches.last().map(|st| st.first + st.count - 1).expect("a non-empty chain");
        self.stretches = stretches;
        self.push_record(h, Record { stamp, leaf, len: locals.len() as u32, time: t });
        added
    }

    /// Makes `ext` resolve to block `b` for the holder: the block's canonical ext when it has
    /// none and `ext` is free, else a holder-local override.
    ///
    /// An engine that names another block with an ext it used before rebinds the ext: the
    /// holder's override of it (if any) goes, so `overrides` and `override_of` stay inverse
    /// maps (a stale entry would later drop the override of another block, leaving a block
    /// that a removal can no longer name: an overcount).
    pub(crate) fn bind_or_override(&mut self, h: u32, b: u32, ext: u64) {
        if self.trie.bind_ext(b, ext) {
            let holder = self.holders.at_mut(h);
            if !holder.overrides.is_empty() {
                if let Some(old) = holder.overrides.remove(&ext) {
                    holder.override_of.remove(&old);
                }
            }
            return;
        }
        let holder = self.holders.at_mut(h);
        if let Some(prev) = holder.overrides.insert(ext, b) {
            if prev != b {
                holder.override_of.remove(&prev);
            }
        }
        if let Some(old) = holder.override_of.insert(b, ext) {
            if old != ext {
                holder.overrides.remove(&old);
            }
        }
    }

    /// Evicts the holder's blocks named by ext. Returns `(removed, unknown)`; exts the holder
    /// does not hold (never seen, or already gone) are counted, not errors.
    pub fn remove(&mut self, key: HolderKey, exts: &[u64], t: LogTime) -> (u32, u32) {
        let Some(h) = self.holders.get(&key) else {
            self.stats.removes_unknown += exts.len() as u64;
            return (0, exts.len() as u32);
        };
        let snap = self.snap(h);
        self.touch(h, t);
        self.ensure_fed(h);
        let (mut removed, mut unknown) = (0, 0);
        // Hashed once: the same hash starts a slot early and then finds it.
        let mut hashes = std::mem::take(&mut self.hash_scratch);
        hashes.clear();
        hashes.extend(exts.iter().map(|&e| ext_hash(e)));
        self.prefetch_hashes(&hashes[..hashes.len().min(PREFETCH_AHEAD)]);
        let (mut prev, mut i) = (None, 0);
        while i < exts.len() {
            let Some(b) = self.resolve_after(h, exts[i], prev) else {
                self.prefetch_hashes(hashes.get(i + PREFETCH_AHEAD));
                unknown += 1;
                i += 1;
                continue;
            };
            let n = self.remove_named(h, b, &exts[i..], &hashes[i..]);
            // Exts up to `i + PREFETCH_AHEAD` were started already and those up to `i + n` are
            // gone (a tail removal starts its own slots as it walks, and a few past its run):
            // start only the ones after both (measured: a tail removal used to start `n` slots
            // it had just dropped).
            let ahead = i + PREFETCH_AHEAD;
            self.prefetch_hashes(hashes.iter().take(ahead + n as usize).skip(ahead.max(i + n as usize)));
            removed += n;
            prev = Some(b + 1 - n);
            i += n as usize;
        }
        self.hash_scratch = hashes;
        self.stats.blocks_removed += u64::from(removed);
        self.stats.removes_unknown += u64::from(unknown);
        self.maybe_compact(h);
        self.settle(h, snap);
        (removed, unknown)
    }

    /// Drops every block of the holder (its engine cleared its cache or restarted).
    pub fn clear(&mut self, key: HolderKey, t: LogTime) -> u32 {
        let Some(h) = self.holders.get(&key) else { return 0 };
        let snap = self.snap(h);
        self.touch(h, t);
        let n = self.clear_blocks(h);
        self.become_fed(h);
        self.settle(h, snap);
        self.stats.blocks_removed += u64::from(n);
        n
    }

    /// Clears the holder's gap flag (after the ingest layer resynchronised it).
    pub fn set_gapped(&mut self, key: HolderKey, gapped: bool) {
        if let Some(h) = self.holders.get(&key) {
            self.holders.at_mut(h).gapped = gapped;
            self.holders.sync_card(h);
        }
    }

    /// Marks every holder of log partition `partition` (under this keyspace's
    /// `EngineConfig::partitions`) gapped: the log itself lost records of that partition, so
    /// any of its holders may be missing writes. Holders created later start ungapped.
    pub fn set_partition_gapped(&mut self, partition: u32) {
        for h in 0..self.holders.slots.len() as u32 {
            if self.holders.slots[h as usize].as_ref().is_some_and(|x| x.group == partition) {
                self.holders.at_mut(h).gapped = true;
                self.holders.sync_card(h);
            }
        }
    }

    /// A gateway routed `locals` (a chain from the root) to the holder: unless the holder has
    /// an event feed, assume it now holds the chain, until the TTL or capacity drops it.
    pub fn place(&mut self, key: HolderKey, locals: &[u64], t: LogTime) -> PlaceOutcome {
        let h = self.holder_or_insert(key);
        if self.holders.at(h).fed {
            self.stats.placements_ignored += 1;
            return PlaceOutcome::IgnoredFed;
        }
        let snap = self.snap(h);
        let out = self.place_inner(h, locals, t);
        self.settle(h, snap);
        // Nothing left (an empty placement, or one longer than the capacity evicted itself):
        // the holder goes now, so that every inferred holder holds a block between writes.
        self.gc_holder(h);
        out
    }

    fn place_inner(&mut self, h: u32, locals: &[u64], t: LogTime) -> PlaceOutcome {
        self.touch(h, t);
        self.expire_holder(h, t);
        if locals.is_empty() {
            return PlaceOutcome::Placed { added: 0 };
        }
        let added = self.hold_chain(h, ROOT_BLOCK, locals, t, |_, _, _| {});
        self.after_write(h);
        PlaceOutcome::Placed { added }
    }

    fn holder_or_insert(&mut self, key: HolderKey) -> u32 {
        match self.holders.get(&key) {
            Some(i) => i,
            None => {
                let group = partition_of(key.worker, self.cfg.partitions);
                self.holders.insert(Holder::new(key, group))
            }
        }
    }

    fn touch(&mut self, h: u32, t: LogTime) {
        let holder = self.holders.at_mut(h);
        holder.last_time = holder.last_time.max(t);
    }

    /// Event-fed truth replaces inferred state: the first event for a holder drops its
    /// placements.
    fn ensure_fed(&mut self, h: u32) {
        if !self.holders.at(h).fed {
            self.clear_blocks(h);
            self.become_fed(h);
        }
    }

    /// Marks the holder event-fed: placements no longer touch it, and it never expires.
    fn become_fed(&mut self, h: u32) {
        self.holders.at_mut(h).fed = true;
        self.holders.unqueue(h);
    }

    /// Starts the ext-table slots of exts hashed by [`ext_hash`].
    fn prefetch_hashes<'a>(&self, hashes: impl IntoIterator<Item = &'a u64>) {
        for &h in hashes {
            self.trie.prefetch_ext_hash(h);
        }
    }

    /// Ext-table lookups miss the cache about once per block: writes start them
    /// [`PREFETCH_AHEAD`] blocks early so the misses overlap (measured: single-thread writes
    /// 3.9 -> 5.0-7.6 M blocks/s on `make bench-engine`'s workload).
    fn prefetch_exts(&self, exts: impl IntoIterator<Item = u64>) {
        for e in exts {
            self.trie.prefetch_ext(e);
        }
    }

    /// The block the holder stored under `ext`, if it still holds it.
    fn resolve(&self, h: u32, ext: u64) -> Option<u32> {
        let holder = self.holders.at(h);
        if let Some(&b) = holder.overrides.get(&ext) {
            return Some(b);
        }
        let b = self.trie.by_ext(ext)?;
        self.member_pos(self.trie.run_of(b), h).map(|_| b)
    }

    /// The block `ext` names for another tier's event-fed holder of `key`'s slot: a store's
    /// parent may be held on any tier of the worker (each tier's positions count on their own
    /// in a match). Placements (inferred holders) name no exts, so they are never a parent.
    fn resolve_in_slot(&self, key: HolderKey, ext: u64) -> Option<u32> {
        if self.holders.off_gpu() == 0 && key.tier == Tier::Gpu {
            return None; // no other tier holds anything
        }
        Tier::ALL
            .into_iter()
            .filter(|&t| t != key.tier)
            .filter_map(|t| self.holders.get(&key.on(t)))
            .filter(|&h| self.holders.card(h).fed)
            .find_map(|h| self.resolve(h, ext))
    }

    /// [`Self::resolve`], trying first the block before `prev` (the previous removal): engines
    /// evict a chain tail-first, so that block's ext is usually the next one named, and its
    /// meta is already in cache. Canonical exts are unique, so a match there is the answer.
    fn resolve_after(&self, h: u32, ext: u64, prev: Option<u32>) -> Option<u32> {
        if let Some(p) = prev.filter(|&p| p > 1) {
            if self.holders.at(h).overrides.is_empty() && self.trie.blocks.meta(p - 1).ext() == Some(ext) {
                let b = p - 1;
                return self.member_pos(self.trie.run_of(b), h).map(|_| b);
            }
        }
        self.resolve(h, ext)
    }

    fn after_write(&mut self, h: u32) {
        let holder = self.holders.at(h);
        let cap = if holder.fed { self.cfg.holder_capacity } else { self.cfg.inferred_capacity };
        if holder.blocks > cap {
            // Hysteresis: cut down to 7/8 of the bound so a holder at the bound does not evict
            // on every write.
            let low = cap - cap / 8;
            while self.holders.at(h).blocks > low {
                let Some(rec) = self.holders.at_mut(h).records.pop_front() else { break };
                let n = self.evict_record(h, rec);
                self.stats.evicted_capacity += u64::from(n);
            }
        }
        self.maybe_compact(h);
    }
}
