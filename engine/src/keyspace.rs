//! One keyspace: the trie, its holders, and every write operation.
//!
//! Writes are deterministic functions of their arguments and the current state; the only
//! notion of time is the log time passed in. Matching lives in `matching.rs`, enumeration and
//! rebuild in `dump.rs`.

use crate::digest::{block_term, holder_term};
use crate::holder::{Holder, Holders, Record};
use crate::store_check::check_store;
use crate::trie::{Arena, Member, ROOT};
use crate::types::{
    partition_of, ApplyError, EngineConfig, HolderKey, InvalidStoreReason, KeyspaceId, KeyspaceStats, LogTime,
};

/// What a placement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlaceOutcome {
    /// Recorded as inferred state; `added` blocks were new.
    Placed { added: u32 },
    /// The holder has an event feed, whose truth placements never override.
    IgnoredFed,
}

/// Digest and counters of one holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HolderSummary {
    pub key: HolderKey,
    pub blocks: u32,
    pub digest: u64,
    pub fed: bool,
    pub gapped: bool,
    pub last_time: LogTime,
}

/// How many blocks ahead a write prefetches ext-table slots.
const PREFETCH_AHEAD: usize = 6;

pub struct Keyspace {
    pub(crate) id: KeyspaceId,
    pub(crate) cfg: EngineConfig,
    pub(crate) arena: Arena,
    pub(crate) holders: Holders,
    pub(crate) stats: KeyspaceStats,
    digest: u64,
    group_digests: Vec<u64>,
    holder_blocks: u64,
    window: Vec<u32>,
    /// Scratch set of [`check_store`].
    ext_scratch: Vec<u64>,
}

impl Keyspace {
    pub fn new(id: KeyspaceId, cfg: EngineConfig) -> Self {
        let groups = cfg.partitions.max(1) as usize;
        Self {
            id,
            cfg,
            arena: Arena::new(),
            holders: Holders::default(),
            stats: KeyspaceStats::default(),
            digest: 0,
            group_digests: vec![0; groups],
            holder_blocks: 0,
            window: Vec::new(),
            ext_scratch: Vec::new(),
        }
    }

    pub fn id(&self) -> &KeyspaceId {
        &self.id
    }

    /// Order-independent digest of every holder's block set.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Digest of the holders whose worker lives in log partition `p`.
    pub fn partition_digest(&self, p: u32) -> u64 {
        self.group_digests.get(p as usize).copied().unwrap_or(0)
    }

    pub fn stats(&self) -> &KeyspaceStats {
        &self.stats
    }

    /// Resident (holder, block) pairs.
    pub fn holder_blocks(&self) -> u64 {
        self.holder_blocks
    }

    pub fn holder_count(&self) -> usize {
        self.holders.len()
    }

    pub fn node_count(&self) -> usize {
        self.arena.len()
    }

    pub fn heap_bytes(&self) -> usize {
        self.arena.heap_bytes()
    }

    pub fn holder(&self, key: &HolderKey) -> Option<HolderSummary> {
        self.holders.get(key).map(|i| self.summary(i))
    }

    /// Every holder, in key order.
    pub fn holder_summaries(&self) -> Vec<HolderSummary> {
        self.holders.sorted().into_iter().map(|i| self.summary(i)).collect()
    }

    fn summary(&self, i: u32) -> HolderSummary {
        let h = self.holders.at(i);
        HolderSummary {
            key: h.key,
            blocks: h.blocks,
            digest: h.digest,
            fed: h.fed,
            gapped: h.gapped,
            last_time: h.last_time,
        }
    }

    /// Every chain of locals (root to block) the holder holds, sorted. For audits and tests.
    pub fn holder_chains(&self, key: &HolderKey) -> Vec<Vec<u64>> {
        let Some(h) = self.holders.get(key) else { return Vec::new() };
        let mut out: Vec<Vec<u64>> = (1..self.arena.nodes.len() as u32)
            .filter(|&n| {
                let node = &self.arena.nodes[n as usize];
                node.live() && node.member(h).is_some()
            })
            .map(|n| self.arena.chain_to(n))
            .collect();
        out.sort();
        out
    }

    // ---- writes -------------------------------------------------------------------------

    /// Extends the holder's chain ending at `parent_ext` (or the root) with `blocks`, given as
    /// `(ext, local)`. Re-storing held blocks is idempotent apart from refreshing their age.
    /// A store that names an ext twice or names its parent among its blocks is refused whole
    /// ([`ApplyError::InvalidStore`]): nothing changes but `stores_rejected`.
    pub fn store(
        &mut self,
        key: HolderKey,
        parent_ext: Option<u64>,
        blocks: &[(u64, u64)],
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
        blocks: &[(u64, u64)],
        t: LogTime,
    ) -> Result<u32, ApplyError> {
        let h = self.holder_or_insert(key);
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
        blocks: &[(u64, u64)],
        t: LogTime,
    ) -> Result<u32, ApplyError> {
        self.touch(h, t);
        self.ensure_fed(h);
        let parent = match parent_ext {
            None => ROOT,
            Some(p) => match self.resolve(h, p) {
                Some(n) => n,
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
        let stamp = self.take_stamp(h);
        let mut cur = parent;
        let mut added = 0;
        self.prefetch_exts(blocks.iter().map(|b| b.0).take(PREFETCH_AHEAD));
        for (i, &(ext, local)) in blocks.iter().enumerate() {
            self.prefetch_exts(blocks.get(i + PREFETCH_AHEAD).map(|b| b.0));
            cur = self.arena.child_or_insert(cur, local);
            added += u32::from(self.add_member(h, cur, stamp));
            if !self.arena.bind_ext(cur, ext) {
                let holder = self.holders.at_mut(h);
                holder.overrides.insert(ext, cur);
                if let Some(old) = holder.override_of.insert(cur, ext) {
                    if old != ext {
                        holder.overrides.remove(&old);
                    }
                }
            }
        }
        self.push_record(h, Record { stamp, leaf: cur, len: blocks.len() as u32, time: t });
        self.stats.blocks_stored += u64::from(added);
        self.after_write(h);
        Ok(added)
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
        self.prefetch_exts(exts.iter().copied().take(PREFETCH_AHEAD));
        for (i, &ext) in exts.iter().enumerate() {
            self.prefetch_exts(exts.get(i + PREFETCH_AHEAD).copied());
            match self.resolve(h, ext) {
                Some(node) => {
                    self.remove_member(h, node);
                    self.arena.release(node);
                    removed += 1;
                }
                None => unknown += 1,
            }
        }
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
        self.holders.at_mut(h).fed = true;
        self.settle(h, snap);
        self.stats.blocks_removed += u64::from(n);
        n
    }

    /// Clears the holder's gap flag (after the ingest layer resynchronised it).
    pub fn set_gapped(&mut self, key: HolderKey, gapped: bool) {
        if let Some(h) = self.holders.get(&key) {
            self.holders.at_mut(h).gapped = gapped;
        }
    }

    /// Marks every holder of log partition `partition` (under this keyspace's
    /// `EngineConfig::partitions`) gapped: the log itself lost records of that partition, so
    /// any of its holders may be missing writes. Holders created later start ungapped.
    pub fn set_partition_gapped(&mut self, partition: u32) {
        for h in self.holders.slots.iter_mut().flatten() {
            if h.group == partition {
                h.gapped = true;
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
        if locals.is_empty() {
            self.gc_holder(h);
        }
        out
    }

    fn place_inner(&mut self, h: u32, locals: &[u64], t: LogTime) -> PlaceOutcome {
        self.touch(h, t);
        self.expire_holder(h, t);
        if locals.is_empty() {
            return PlaceOutcome::Placed { added: 0 };
        }
        let stamp = self.take_stamp(h);
        let mut cur = ROOT;
        let mut added = 0;
        for &local in locals {
            cur = self.arena.child_or_insert(cur, local);
            added += u32::from(self.add_member(h, cur, stamp));
        }
        self.push_record(h, Record { stamp, leaf: cur, len: locals.len() as u32, time: t });
        self.after_write(h);
        PlaceOutcome::Placed { added }
    }

    /// Removes every holder of `worker` (all dp ranks and lanes).
    pub fn drop_worker(&mut self, worker: u64) -> u32 {
        let victims: Vec<u32> =
            self.holders.sorted().into_iter().filter(|&i| self.holders.at(i).key.worker == worker).collect();
        let mut n = 0;
        for h in victims {
            let snap = self.snap(h);
            n += self.clear_blocks(h);
            self.settle(h, snap);
            self.holders.remove(h);
        }
        self.stats.blocks_removed += u64::from(n);
        n
    }

    /// Expires inferred blocks older than the placement TTL at log time `now`, for holders
    /// selected by `filter` (the caller passes the holders of the partition whose log time
    /// advanced). Returns the number of blocks expired.
    pub fn expire(&mut self, now: LogTime, filter: impl Fn(&HolderKey) -> bool) -> u64 {
        let mut n = 0;
        for h in self.holders.sorted() {
            let holder = self.holders.at(h);
            if holder.fed || !filter(&holder.key) {
                continue;
            }
            let snap = self.snap(h);
            n += self.expire_holder(h, now);
            self.settle(h, snap);
            self.gc_holder(h);
        }
        n
    }

    // ---- internals ----------------------------------------------------------------------

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
            self.holders.at_mut(h).fed = true;
        }
    }

    /// The node the holder stored under `ext`, if it still holds it.
    /// Ext-table lookups miss the cache about once per block: writes start them
    /// [`PREFETCH_AHEAD`] blocks early so the misses overlap (measured: single-thread writes
    /// 3.9 -> 5.0-7.6 M blocks/s on `make bench-engine`'s workload).
    fn prefetch_exts(&self, exts: impl IntoIterator<Item = u64>) {
        for e in exts {
            self.arena.prefetch_ext(e);
        }
    }

    fn resolve(&self, h: u32, ext: u64) -> Option<u32> {
        let holder = self.holders.at(h);
        if let Some(&n) = holder.overrides.get(&ext) {
            return Some(n);
        }
        let n = self.arena.by_ext(ext)?;
        self.arena.nodes[n as usize].member(h).map(|_| n)
    }

    fn take_stamp(&mut self, h: u32) -> u32 {
        if self.holders.at(h).next_stamp >= self.cfg.stamp_limit {
            self.renumber(h);
        }
        let holder = self.holders.at_mut(h);
        let s = holder.next_stamp;
        holder.next_stamp += 1;
        s
    }

    /// Reassigns stamps 1..=n to the holder's records in order. Records are in increasing stamp
    /// order, so a new stamp never collides with an old one not yet renamed.
    fn renumber(&mut self, h: u32) {
        self.compact(h);
        let mut records: Vec<Record> = self.holders.at(h).records.iter().copied().collect();
        let mut buf = std::mem::take(&mut self.window);
        for (i, rec) in records.iter_mut().enumerate() {
            let new = i as u32 + 1;
            self.arena.window(rec.leaf, rec.len, &mut buf);
            for &n in &buf {
                for m in self.arena.nodes[n as usize].members.iter_mut() {
                    if m.holder == h && m.stamp == rec.stamp {
                        m.stamp = new;
                    }
                }
            }
            rec.stamp = new;
        }
        self.window = buf;
        let holder = self.holders.at_mut(h);
        holder.next_stamp = records.len() as u32 + 1;
        holder.records = records.into();
        debug_assert!(
            holder.records.iter().enumerate().all(|(i, r)| r.stamp == i as u32 + 1),
            "renumbered stamps are 1..=n in record order"
        );
    }

    fn push_record(&mut self, h: u32, rec: Record) {
        debug_assert!(
            self.arena.nodes[rec.leaf as usize].live() && rec.len >= 1,
            "a record ends at a live node"
        );
        debug_assert!(
            self.holders.at(h).records.back().is_none_or(|r| r.stamp < rec.stamp),
            "records are in increasing stamp order (eviction and renumbering rely on it)"
        );
        self.arena.nodes[rec.leaf as usize].pins += 1;
        self.holders.at_mut(h).records.push_back(rec);
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

    /// Removes the holder's blocks that still carry `rec`'s stamp and unpins its leaf.
    fn evict_record(&mut self, h: u32, rec: Record) -> u32 {
        let mut buf = std::mem::take(&mut self.window);
        self.arena.window(rec.leaf, rec.len, &mut buf);
        let mut n = 0;
        for &node in &buf {
            let owned =
                self.arena.nodes[node as usize].members.iter().any(|m| m.holder == h && m.stamp == rec.stamp);
            if owned {
                self.remove_member(h, node);
                n += 1;
            }
        }
        self.window = buf;
        debug_assert!(self.arena.nodes[rec.leaf as usize].pins > 0, "a record's leaf is pinned by it");
        self.arena.nodes[rec.leaf as usize].pins -= 1;
        self.arena.release(rec.leaf);
        n
    }

    fn expire_holder(&mut self, h: u32, now: LogTime) -> u64 {
        let ttl = self.cfg.placement_ttl_ms;
        let mut n = 0;
        while let Some(&rec) = self.holders.at(h).records.front() {
            if rec.time.saturating_add(ttl) > now {
                break;
            }
            self.holders.at_mut(h).records.pop_front();
            n += u64::from(self.evict_record(h, rec));
        }
        self.stats.expired_ttl += n;
        n
    }

    /// Forgets an inferred holder that has no blocks left (its remaining records own nothing).
    fn gc_holder(&mut self, h: u32) {
        let holder = self.holders.at(h);
        if !holder.fed && holder.blocks == 0 {
            self.clear_blocks(h);
            self.holders.remove(h);
        }
    }

    fn clear_blocks(&mut self, h: u32) -> u32 {
        let mut n = 0;
        while let Some(rec) = self.holders.at_mut(h).records.pop_front() {
            n += self.evict_record(h, rec);
        }
        let holder = self.holders.at_mut(h);
        debug_assert_eq!(holder.blocks, 0, "every block belongs to a record");
        holder.overrides.clear();
        holder.override_of.clear();
        n
    }

    fn maybe_compact(&mut self, h: u32) {
        let holder = self.holders.at(h);
        if holder.records.len() > 2 * holder.blocks as usize + 16 {
            self.compact(h);
        }
    }

    /// Drops records that no longer own any block.
    fn compact(&mut self, h: u32) {
        let records = std::mem::take(&mut self.holders.at_mut(h).records);
        let mut keep = std::collections::VecDeque::with_capacity(records.len());
        let mut buf = std::mem::take(&mut self.window);
        for rec in records {
            self.arena.window(rec.leaf, rec.len, &mut buf);
            let owns = buf.iter().any(|&n| {
                self.arena.nodes[n as usize].members.iter().any(|m| m.holder == h && m.stamp == rec.stamp)
            });
            if owns {
                keep.push_back(rec);
            } else {
                debug_assert!(
                    self.arena.nodes[rec.leaf as usize].pins > 0,
                    "a record's leaf is pinned by it"
                );
                self.arena.nodes[rec.leaf as usize].pins -= 1;
                self.arena.release(rec.leaf);
            }
        }
        self.window = buf;
        self.holders.at_mut(h).records = keep;
    }

    /// Adds (or restamps) the holder's membership of `node`. Returns true if it is new.
    fn add_member(&mut self, h: u32, node: u32, stamp: u32) -> bool {
        debug_assert!(stamp < self.holders.at(h).next_stamp, "a stamp is taken before it is used");
        let n = &mut self.arena.nodes[node as usize];
        debug_assert!(n.live() && node != ROOT, "members join live, non-root nodes");
        if let Some(pos) = n.member(h) {
            n.members[pos].stamp = stamp;
            return false;
        }
        n.members.push(Member { holder: h, stamp });
        let path = n.path;
        let holder = self.holders.at_mut(h);
        holder.blocks += 1;
        holder.digest = holder.digest.wrapping_add(block_term(path, !holder.fed));
        true
    }

    /// Removes the holder's membership of `node`. If `node` was the last node of the
    /// operation record that stamped it, the record shrinks to its deepest block still owned
    /// (engines evict tail-first, so records shrink and vanish as their blocks go, and do not
    /// keep dead nodes pinned).
    fn remove_member(&mut self, h: u32, node: u32) {
        let n = &mut self.arena.nodes[node as usize];
        let Some(pos) = n.member(h) else { return };
        let stamp = n.members.swap_remove(pos).stamp;
        debug_assert!(n.member(h).is_none(), "a holder is listed once per node");
        let path = n.path;
        let holder = self.holders.at_mut(h);
        debug_assert!(holder.blocks > 0, "a member node is counted in the holder's blocks");
        holder.blocks -= 1;
        holder.digest = holder.digest.wrapping_sub(block_term(path, !holder.fed));
        if let Some(e) = holder.override_of.remove(&node) {
            holder.overrides.remove(&e);
        }
        let Ok(ri) = holder.records.binary_search_by_key(&stamp, |r| r.stamp) else { return };
        let mut rec = holder.records[ri];
        if rec.leaf != node {
            return;
        }
        let owned = |arena: &Arena, n: u32| {
            arena.nodes[n as usize].members.iter().any(|m| m.holder == h && m.stamp == stamp)
        };
        while rec.len > 0 && !owned(&self.arena, rec.leaf) {
            rec.leaf = self.arena.nodes[rec.leaf as usize].parent;
            rec.len -= 1;
        }
        debug_assert!(self.arena.nodes[node as usize].pins > 0, "a record's leaf is pinned by it");
        self.arena.nodes[node as usize].pins -= 1;
        let holder = self.holders.at_mut(h);
        if rec.len == 0 {
            holder.records.remove(ri);
        } else {
            holder.records[ri] = rec;
            self.arena.nodes[rec.leaf as usize].pins += 1;
        }
    }

    pub(crate) fn snap_term(&self, h: u32) -> (u64, u32) {
        self.snap(h)
    }

    pub(crate) fn settle_term(&mut self, h: u32, snap: (u64, u32)) {
        self.settle(h, snap)
    }

    pub(crate) fn clear_holder(&mut self, h: u32) -> u32 {
        self.clear_blocks(h)
    }

    /// Test-only fault hook: silently drops one block of a holder, as memory corruption or a
    /// bug would, so anti-entropy has a divergence to find. Returns whether a block was dropped.
    #[cfg(feature = "testing")]
    pub fn corrupt_for_test(&mut self, key: &HolderKey) -> bool {
        let Some(h) = self.holders.get(key) else { return false };
        let node = (1..self.arena.nodes.len() as u32).find(|&n| {
            self.arena.nodes[n as usize].live() && self.arena.nodes[n as usize].member(h).is_some()
        });
        let Some(node) = node else { return false };
        let snap = self.snap(h);
        self.remove_member(h, node);
        self.settle(h, snap);
        true
    }

    /// The holder's aggregate term and block count before an operation.
    fn snap(&self, h: u32) -> (u64, u32) {
        let holder = self.holders.at(h);
        (holder_term(&holder.key, holder.blocks, holder.digest), holder.blocks)
    }

    /// Carries the change of a holder's term since [`Self::snap`] into the aggregates. Done once
    /// per operation, not per block.
    fn settle(&mut self, h: u32, (old, blocks_before): (u64, u32)) {
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

    /// Recomputes the aggregates from the holders (after a rebuild).
    pub(crate) fn recompute_aggregates(&mut self) {
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
