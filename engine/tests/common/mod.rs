//! A deliberately simple reference model of the engine's semantics, for differential tests.
//!
//! Per holder: the set of held paths (a path is the chain of locals from the root to a block,
//! so position and content are both explicit), the ext → path map, and the operation records
//! (stamp, paths, log time). No trie, no sharing, no tables: if the engine and this model
//! disagree, the engine is wrong (or this documentation is).

#![allow(dead_code)]

pub mod ops;
pub mod shrink;

use prefixlog_engine::digest::{block_term, child_path, holder_term, ROOT_PATH};
use prefixlog_engine::{
    partition_of, BlockHashes, EngineConfig, HolderKey, HolderMatch, KeyspaceStats, LogTime, MatchDetail,
    MatchOptions, Tier, TierDepth, TierRun,
};
use std::collections::{BTreeMap, HashMap, VecDeque};

type Path = Vec<u64>;

#[derive(Default)]
pub struct RefHolder {
    pub fed: bool,
    pub gapped: bool,
    pub last_time: LogTime,
    pub blocks: BTreeMap<Path, u64>,
    exts: HashMap<u64, Path>,
    records: VecDeque<(u64, Vec<Path>, LogTime)>,
    next_stamp: u64,
}

pub struct RefModel {
    pub cfg: EngineConfig,
    pub holders: BTreeMap<HolderKey, RefHolder>,
    pub stats: KeyspaceStats,
}

pub fn path_hash(path: &[u64]) -> u64 {
    path.iter().fold(ROOT_PATH, |h, &l| child_path(h, l))
}

impl RefHolder {
    fn clear(&mut self) -> u32 {
        let n = self.blocks.len() as u32;
        self.blocks.clear();
        self.exts.clear();
        self.records.clear();
        n
    }

    fn evict(&mut self, stamp: u64, paths: &[Path]) -> u32 {
        let mut n = 0;
        for p in paths {
            if self.blocks.get(p) == Some(&stamp) {
                self.blocks.remove(p);
                n += 1;
            }
        }
        n
    }

    fn resolve(&self, ext: u64) -> Option<Path> {
        self.exts.get(&ext).filter(|p| self.blocks.contains_key(*p)).cloned()
    }

    pub fn digest(&self) -> u64 {
        self.blocks.keys().fold(0u64, |d, p| d.wrapping_add(block_term(path_hash(p), !self.fed)))
    }
}

impl RefModel {
    pub fn new(cfg: EngineConfig) -> Self {
        Self { cfg, holders: BTreeMap::new(), stats: KeyspaceStats::default() }
    }

    fn after_write(&mut self, key: HolderKey) {
        let h = self.holders.get_mut(&key).unwrap();
        let cap = if h.fed { self.cfg.holder_capacity } else { self.cfg.inferred_capacity };
        if h.blocks.len() as u32 > cap {
            let low = cap - cap / 8;
            while h.blocks.len() as u32 > low {
                let Some((s, paths, _)) = h.records.pop_front() else { break };
                self.stats.evicted_capacity += u64::from(h.evict(s, &paths));
            }
        }
    }

    /// A store is a chain only if no ext repeats among its blocks and its parent is not one of
    /// them; otherwise it is refused whole (counted, nothing else changes).
    pub fn store_is_chain(parent_ext: Option<u64>, blocks: &[BlockHashes]) -> bool {
        let mut seen: std::collections::HashSet<u64> = parent_ext.into_iter().collect();
        blocks.iter().all(|b| seen.insert(b.ext))
    }

    pub fn store(
        &mut self,
        key: HolderKey,
        parent_ext: Option<u64>,
        blocks: &[BlockHashes],
        t: LogTime,
    ) -> bool {
        if !Self::store_is_chain(parent_ext, blocks) {
            self.stats.stores_rejected += 1;
            return false;
        }
        // The parent may be held on any tier of the slot (the holder's own first).
        let in_slot = |m: &Self, p: u64| {
            Tier::ALL
                .into_iter()
                .filter(|&t| t != key.tier)
                .find_map(|t| m.holders.get(&key.on(t)).and_then(|h| h.resolve(p)))
        };
        let other_tier_parent = parent_ext.and_then(|p| in_slot(self, p));
        // A holder that holds nothing cannot hold the parent: refused, nothing is created.
        if parent_ext.is_some() && other_tier_parent.is_none() && !self.holders.contains_key(&key) {
            self.stats.stores_rejected += 1;
            return false;
        }
        let h = self.holders.entry(key).or_default();
        h.last_time = h.last_time.max(t);
        if !h.fed {
            h.clear();
            h.fed = true;
        }
        let mut path = match parent_ext {
            None => Vec::new(),
            Some(p) => match h.resolve(p).or(other_tier_parent) {
                Some(path) => path,
                None => {
                    h.gapped = true;
                    self.stats.stores_rejected += 1;
                    return false;
                }
            },
        };
        if blocks.is_empty() {
            return true;
        }
        h.next_stamp += 1;
        let stamp = h.next_stamp;
        let mut paths = Vec::new();
        let mut added = 0;
        for &BlockHashes { ext, local } in blocks {
            path.push(local);
            if h.blocks.insert(path.clone(), stamp).is_none() {
                added += 1;
            }
            h.exts.insert(ext, path.clone());
            paths.push(path.clone());
        }
        h.records.push_back((stamp, paths, t));
        self.stats.blocks_stored += added;
        self.after_write(key);
        true
    }

    pub fn remove(&mut self, key: HolderKey, exts: &[u64], t: LogTime) {
        let Some(h) = self.holders.get_mut(&key) else {
            self.stats.removes_unknown += exts.len() as u64;
            return;
        };
        h.last_time = h.last_time.max(t);
        if !h.fed {
            h.clear();
            h.fed = true;
        }
        for e in exts {
            match h.resolve(*e) {
                Some(p) => {
                    h.blocks.remove(&p);
                    self.stats.blocks_removed += 1;
                }
                None => self.stats.removes_unknown += 1,
            }
        }
    }

    pub fn clear(&mut self, key: HolderKey, t: LogTime) {
        if let Some(h) = self.holders.get_mut(&key) {
            h.last_time = h.last_time.max(t);
            self.stats.blocks_removed += u64::from(h.clear());
            h.fed = true;
        }
    }

    pub fn drop_worker(&mut self, worker: u64) {
        let keys: Vec<HolderKey> = self.holders.keys().filter(|k| k.worker == worker).copied().collect();
        for k in keys {
            let mut h = self.holders.remove(&k).unwrap();
            self.stats.blocks_removed += u64::from(h.clear());
        }
    }

    fn expire_holder(&mut self, key: HolderKey, now: LogTime) {
        let ttl = self.cfg.placement_ttl_ms;
        let h = self.holders.get_mut(&key).unwrap();
        while let Some((s, paths, time)) = h.records.front().cloned() {
            if time.saturating_add(ttl) > now {
                break;
            }
            h.records.pop_front();
            self.stats.expired_ttl += u64::from(h.evict(s, &paths));
        }
    }

    fn gc(&mut self, key: HolderKey) {
        let h = &self.holders[&key];
        if !h.fed && h.blocks.is_empty() {
            self.holders.remove(&key);
        }
    }

    /// Returns false when ignored because the holder is event-fed.
    pub fn place(&mut self, key: HolderKey, locals: &[u64], t: LogTime) -> bool {
        let h = self.holders.entry(key).or_default();
        if h.fed {
            self.stats.placements_ignored += 1;
            return false;
        }
        h.last_time = h.last_time.max(t);
        self.expire_holder(key, t);
        if locals.is_empty() {
            self.gc(key);
            return true;
        }
        let h = self.holders.get_mut(&key).unwrap();
        h.next_stamp += 1;
        let stamp = h.next_stamp;
        let mut paths = Vec::new();
        for i in 0..locals.len() {
            let p = locals[..=i].to_vec();
            h.blocks.insert(p.clone(), stamp);
            paths.push(p);
        }
        h.records.push_back((stamp, paths, t));
        self.after_write(key);
        // A placement longer than the capacity can evict itself: an inferred holder with
        // nothing left is forgotten at once.
        self.gc(key);
        true
    }

    /// Expires the inferred holders of log partition `p` and forgets those left empty.
    pub fn expire(&mut self, now: LogTime, p: u32) {
        let parts = self.cfg.partitions;
        let keys: Vec<HolderKey> = self
            .holders
            .iter()
            .filter(|(k, h)| !h.fed && partition_of(k.worker, parts) == p)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            self.expire_holder(k, now);
            self.gc(k);
        }
    }

    /// Marks every holder of the partition gapped.
    pub fn set_partition_gapped(&mut self, p: u32) {
        for (k, h) in self.holders.iter_mut() {
            if partition_of(k.worker, self.cfg.partitions) == p {
                h.gapped = true;
            }
        }
    }

    pub fn set_gapped(&mut self, key: HolderKey, gapped: bool) {
        if let Some(h) = self.holders.get_mut(&key) {
            h.gapped = gapped;
        }
    }

    fn reported(opts: &MatchOptions, key: &HolderKey, h: &RefHolder) -> bool {
        opts.lane.is_none_or(|l| l == key.lane)
            && opts.tier_order().contains(&key.tier)
            && !(opts.exclude_gapped && h.gapped)
            && opts.candidates.as_ref().is_none_or(|c| c.contains(&key.worker))
    }

    /// Per slot (worker, dp rank, lane): a position counts if some counted tier's holder holds
    /// its path, and it is credited to the first such tier in preference order. Position by
    /// position, no intervals, no trie: the definition itself.
    pub fn match_chain(&self, locals: &[u64], opts: &MatchOptions) -> Vec<HolderMatch> {
        let order = opts.tier_order();
        let any_off_gpu = self.holders.keys().any(|k| k.tier != Tier::Gpu);
        let mut slots: BTreeMap<HolderKey, Vec<(HolderKey, &RefHolder)>> = BTreeMap::new();
        for (key, h) in &self.holders {
            if Self::reported(opts, key, h) {
                slots.entry(key.on(Tier::Gpu)).or_default().push((*key, h));
            }
        }
        let mut out = Vec::new();
        for (slot, mut held) in slots {
            held.sort_by_key(|(k, _)| order.iter().position(|&t| t == k.tier));
            let holds = |h: &RefHolder, i: usize| h.blocks.contains_key(&locals[..=i]);
            let mut runs: Vec<TierRun> = Vec::new();
            let mut depth = 0u32;
            while (depth as usize) < locals.len() {
                let Some((k, _)) = held.iter().find(|(_, h)| holds(h, depth as usize)) else { break };
                match runs.last_mut() {
                    Some(r) if r.tier == k.tier => r.blocks += 1,
                    _ => runs.push(TierRun { tier: k.tier, blocks: 1 }),
                }
                depth += 1;
            }
            let covered: Vec<bool> =
                (0..locals.len()).map(|i| held.iter().any(|(_, h)| holds(h, i))).collect();
            let mut intervals: Vec<(u32, u32)> = Vec::new();
            for (i, _) in covered.iter().enumerate().filter(|(_, c)| **c) {
                let i = i as u32;
                match intervals.last_mut() {
                    Some(last) if last.1 == i => last.1 = i + 1,
                    _ => intervals.push((i, i + 1)),
                }
            }
            let report = if opts.intervals { !intervals.is_empty() } else { depth > 0 };
            if !report {
                continue;
            }
            let own_depth = |h: &RefHolder| (0..locals.len()).take_while(|&i| holds(h, i)).count() as u32;
            let tiers: Vec<TierDepth> = if any_off_gpu {
                held.iter()
                    .map(|(k, h)| TierDepth {
                        tier: k.tier,
                        depth: own_depth(h),
                        total: h.blocks.len() as u32,
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let weighted = opts.tier_weights.map(|w| {
                runs.iter().map(|r| u64::from(r.blocks) * u64::from(w[r.tier.code() as usize])).sum()
            });
            out.push(
                HolderMatch {
                    holder: slot,
                    depth,
                    total: held.iter().map(|(_, h)| h.blocks.len() as u32).sum(),
                    inferred: held.iter().all(|(_, h)| !h.fed),
                    gapped: held.iter().any(|(_, h)| h.gapped),
                    weighted,
                    detail: None,
                }
                .with_detail(MatchDetail {
                    intervals: if opts.intervals { intervals.into() } else { Default::default() },
                    runs: if any_off_gpu { runs.into() } else { Default::default() },
                    tiers: tiers.into(),
                }),
            );
        }
        out.sort_by(|a, b| {
            b.weighted.cmp(&a.weighted).then(b.depth.cmp(&a.depth)).then(a.holder.cmp(&b.holder))
        });
        if let Some(k) = opts.top_k {
            out.truncate(k);
        }
        out
    }

    pub fn digest(&self) -> u64 {
        self.holders
            .iter()
            .fold(0u64, |d, (k, h)| d.wrapping_add(holder_term(k, h.blocks.len() as u32, h.digest())))
    }

    pub fn partition_digest(&self, p: u32) -> u64 {
        self.holders
            .iter()
            .filter(|(k, _)| partition_of(k.worker, self.cfg.partitions) == p)
            .fold(0u64, |d, (k, h)| d.wrapping_add(holder_term(k, h.blocks.len() as u32, h.digest())))
    }

    pub fn holder_blocks(&self) -> u64 {
        self.holders.values().map(|h| h.blocks.len() as u64).sum()
    }

    /// Held paths of a holder, as the engine's `holder_chains` reports them.
    pub fn chains(&self, key: &HolderKey) -> Vec<Path> {
        self.holders.get(key).map(|h| h.blocks.keys().cloned().collect()).unwrap_or_default()
    }

    pub fn held_paths(&self, key: &HolderKey) -> Vec<Path> {
        self.chains(key)
    }

    pub fn held_count(&self, key: &HolderKey) -> usize {
        self.holders.get(key).map_or(0, |h| h.blocks.len())
    }

    /// The `i`-th held path of the holder in path order (without copying the others).
    pub fn held_nth(&self, key: &HolderKey, i: usize) -> Path {
        self.holders[key].blocks.keys().nth(i).expect("i < held_count").clone()
    }
}
