//! Per-holder bookkeeping: counts, digest, and the operation records that drive eviction.
//!
//! Every store or placement gets a per-holder stamp; each block it touches is (re)stamped with
//! it and a [`Record`] remembers the operation's window (its last node and length). A block
//! belongs to exactly one record: the one whose stamp it carries. Clearing a holder, evicting
//! its least-recently-stored blocks for capacity, and expiring placements all walk records,
//! so no per-holder block list is needed.
//!
//! Besides the slab and its key → index map, [`Holders`] keeps three derived indices, so that
//! no single write costs work proportional to every holder: the holders in key order (a
//! worker's holders are one range: `WorkerRemoved`), the live holders per partition group (the
//! applier's per-partition limits), and the expiry queue: every inferred holder under a time at
//! or before its oldest record's, by group, so expiry visits only the holders that may have
//! something due. The queue is revalidated lazily: a holder whose oldest record went (evicted
//! for capacity, compacted) keeps its earlier entry until that entry comes due, and is then
//! queued again under its true oldest record. None of the three is in images: they are
//! rebuilt from the holders on read ([`Holders::rebuild_derived`]).

use crate::image_format::{put_u32, put_u64, tag, ImageError, ImageReader, ImageWriter};
use crate::types::{HolderKey, LogTime, Tier};
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// One store or placement operation of a holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub stamp: u32,
    /// Last block of the window: always the last block of a run, whose `pins` count this
    /// record while it exists.
    pub leaf: u32,
    /// Blocks in the window, counted from `leaf` towards the root.
    pub len: u32,
    pub time: LogTime,
}

#[derive(Clone)]
pub struct Holder {
    pub key: HolderKey,
    pub group: u32,
    pub blocks: u32,
    /// Sum of the held blocks' digest terms.
    pub digest: u64,
    /// Fed by its engine's KV events (truth) rather than by placements (inferred).
    pub fed: bool,
    /// A store referenced a parent this holder does not hold.
    pub gapped: bool,
    pub next_stamp: u32,
    pub records: VecDeque<Record>,
    /// Latest log time of any write to this holder.
    pub last_time: LogTime,
    /// ext → block for blocks this holder stored under an ext that is not the block's
    /// canonical one (engines with per-process hash seeds). Empty in the common case.
    pub overrides: FxHashMap<u64, u32>,
    pub override_of: FxHashMap<u32, u64>,
    /// The time this holder is filed under in [`Holders::expiry`] (inferred holders only).
    pub queued: Option<LogTime>,
    /// The keyspace's write sequence at this holder's last operation: a scrub whose check of
    /// the holder spans steps tells by it that the holder (or the holder in its slot) changed
    /// in between. Not state: neither digested nor written to images (a restored keyspace is
    /// another instance to a scrub).
    pub last_write: u64,
}

impl Holder {
    pub fn new(key: HolderKey, group: u32) -> Self {
        Self {
            key,
            group,
            blocks: 0,
            digest: 0,
            fed: false,
            gapped: false,
            next_stamp: 1,
            records: VecDeque::new(),
            last_time: 0,
            overrides: FxHashMap::default(),
            override_of: FxHashMap::default(),
            queued: None,
            last_write: 0,
        }
    }
}

/// What a match reads of a holder, packed in one dense array beside the slots: a match that
/// lists hundreds of holders reads a few cache lines of cards instead of one line (or two) of
/// each holder. A copy, refreshed by [`Holders::sync_card`] at the end of every operation.
/// The key is stored field by field so the tier fits in the padding: 24 bytes, as before tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Card {
    worker: u64,
    dp_rank: u32,
    lane: u32,
    pub blocks: u32,
    pub fed: bool,
    pub gapped: bool,
    tier: Tier,
}

const _: () = assert!(std::mem::size_of::<Card>() == 24);

impl Card {
    fn of(h: &Holder) -> Self {
        let k = h.key;
        Self {
            worker: k.worker,
            dp_rank: k.dp_rank,
            lane: k.lane,
            blocks: h.blocks,
            fed: h.fed,
            gapped: h.gapped,
            tier: k.tier,
        }
    }

    /// The holder's key.
    #[inline]
    pub fn key(&self) -> HolderKey {
        HolderKey { worker: self.worker, dp_rank: self.dp_rank, lane: self.lane, tier: self.tier }
    }
}

/// An entry of [`Holders::expiry`]: partition group, time, holder.
type Due = (u32, LogTime, HolderKey);

/// Holders of a keyspace: a slab indexed by `u32` plus a key → index map, and the derived
/// indices of the module doc.
#[derive(Clone, Default)]
pub struct Holders {
    pub slots: Vec<Option<Holder>>,
    /// Per slot, the live holder's [`Card`].
    cards: Vec<Card>,
    free: Vec<u32>,
    pub index: FxHashMap<HolderKey, u32>,
    /// Derived: the same map in key order.
    by_key: BTreeMap<HolderKey, u32>,
    /// Derived: live holders per partition group (indexed by group, grown on demand).
    per_group: Vec<u32>,
    /// Derived: inferred holders by group and the time of [`Holder::queued`].
    expiry: BTreeSet<Due>,
    /// Derived: live holders on a tier other than the GPU. While it is 0, a match takes the
    /// one-tier path (every holder is its slot's only one).
    off_gpu: u32,
    /// Derived, per slab index: the index of the holder that stands for its slot (worker, dp
    /// rank, lane) in a match, the slot's holder on the lowest [`Tier::code`] it has. A
    /// match that combines tiers keeps one progress entry per slot, indexed by it.
    leaders: Vec<u32>,
    /// Derived, at each leader's index: the slot's holder on each tier (`u32::MAX`: none), by
    /// [`Tier::code`].
    slot_tiers: Vec<[u32; 4]>,
}

const FIRST_KEY: HolderKey = HolderKey::range_of_worker(0).0;
const LAST_KEY: HolderKey = HolderKey::range_of_worker(u64::MAX).1;

impl Holders {
    pub fn get(&self, key: &HolderKey) -> Option<u32> {
        self.index.get(key).copied()
    }

    pub fn insert(&mut self, h: Holder) -> u32 {
        let key = h.key;
        debug_assert!(h.queued.is_none(), "a holder is queued for expiry once it is in the slab");
        self.count_group(h.group, true);
        let card = Card::of(&h);
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(h);
                self.cards[i as usize] = card;
                i
            }
            None => {
                self.slots.push(Some(h));
                self.cards.push(card);
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(key, idx);
        self.by_key.insert(key, idx);
        self.off_gpu += u32::from(key.tier != Tier::Gpu);
        self.lead(key);
        idx
    }

    pub fn remove(&mut self, idx: u32) -> Option<Holder> {
        self.unqueue(idx);
        let h = self.slots[idx as usize].take()?;
        self.index.remove(&h.key);
        self.by_key.remove(&h.key);
        self.off_gpu -= u32::from(h.key.tier != Tier::Gpu);
        self.count_group(h.group, false);
        self.free.push(idx);
        self.lead(h.key);
        Some(h)
    }

    /// The holder that stands for `idx`'s slot in a match (`leaders`).
    #[inline]
    pub fn leader(&self, idx: u32) -> u32 {
        self.leaders[idx as usize]
    }

    /// The holder of `leader`'s slot on `tier`, if any.
    #[inline]
    pub fn on_tier(&self, leader: u32, tier: Tier) -> Option<u32> {
        Some(self.slot_tiers[leader as usize][tier.code() as usize]).filter(|&i| i != u32::MAX)
    }

    /// The live holders of `key`'s slot, by [`Tier::code`] (`u32::MAX`: none).
    fn slot_holders(&self, key: HolderKey) -> [u32; 4] {
        let mut out = [u32::MAX; 4];
        for t in Tier::ALL {
            out[t.code() as usize] = self.get(&key.on(t)).unwrap_or(u32::MAX);
        }
        out
    }

    /// Points every holder of `key`'s slot at the slot's leader (after one of them came or
    /// went), and files the slot's holders at the leader.
    fn lead(&mut self, key: HolderKey) {
        self.leaders.resize(self.slots.len(), u32::MAX);
        self.slot_tiers.resize(self.slots.len(), [u32::MAX; 4]);
        let holders = self.slot_holders(key);
        let Some(&leader) = holders.iter().find(|&&i| i != u32::MAX) else { return };
        for &i in holders.iter().filter(|&&i| i != u32::MAX) {
            self.leaders[i as usize] = leader;
        }
        self.slot_tiers[leader as usize] = holders;
    }

    fn count_group(&mut self, group: u32, added: bool) {
        let g = group as usize;
        if g >= self.per_group.len() {
            self.per_group.resize(g + 1, 0);
        }
        if added {
            self.per_group[g] += 1;
        } else {
            self.per_group[g] -= 1;
        }
    }

    /// Live holders on a tier other than the GPU.
    pub fn off_gpu(&self) -> u32 {
        self.off_gpu
    }

    /// Live holders of partition group `group`.
    pub fn in_group(&self, group: u32) -> u32 {
        self.per_group.get(group as usize).copied().unwrap_or(0)
    }

    /// The holders of `worker` (every dp rank, lane and tier), in key order.
    pub fn of_worker(&self, worker: u64) -> Vec<u32> {
        let (first, last) = HolderKey::range_of_worker(worker);
        self.by_key.range(first..=last).map(|(_, &i)| i).collect()
    }

    /// Files the holder for expiry at `t`, unless it is filed at or before `t` already (its
    /// entry must never be later than its oldest record).
    pub fn queue(&mut self, idx: u32, t: LogTime) {
        let h = self.at(idx);
        if h.queued.is_some_and(|q| q <= t) {
            return;
        }
        let (group, key) = (h.group, h.key);
        self.unqueue(idx);
        self.expiry.insert((group, t, key));
        self.at_mut(idx).queued = Some(t);
    }

    /// Takes the holder out of the expiry queue (it became fed, or goes).
    pub fn unqueue(&mut self, idx: u32) {
        let Some(h) = self.slots[idx as usize].as_mut() else { return };
        if let Some(t) = h.queued.take() {
            let removed = self.expiry.remove(&(h.group, t, h.key));
            debug_assert!(removed, "a queued holder has its entry");
        }
    }

    /// Holders of `group` filed for expiry at or before `cutoff`, in key order.
    pub fn due(&self, group: u32, cutoff: LogTime) -> Vec<u32> {
        let mut keys: Vec<HolderKey> =
            self.expiry.range((group, 0, FIRST_KEY)..=(group, cutoff, LAST_KEY)).map(|e| e.2).collect();
        keys.sort_unstable();
        keys.iter().map(|k| self.index[k]).collect()
    }

    /// The earliest time a holder of `group` is filed for expiry at.
    pub fn next_due(&self, group: u32) -> Option<LogTime> {
        self.expiry.range((group, 0, FIRST_KEY)..=(group, LogTime::MAX, LAST_KEY)).next().map(|e| e.1)
    }

    /// Recomputes the derived indices from the slots (after an image read or a rebuild): every
    /// inferred holder is filed under its oldest record's time, or 0 when it has none (it is
    /// then forgotten by the next expiry of its group).
    pub fn rebuild_derived(&mut self) {
        self.by_key = self.index.iter().map(|(&k, &i)| (k, i)).collect();
        self.off_gpu = self.index.keys().filter(|k| k.tier != Tier::Gpu).count() as u32;
        self.leaders.clear();
        self.slot_tiers.clear();
        let keys: Vec<HolderKey> = self.by_key.keys().copied().collect();
        keys.into_iter().for_each(|k| self.lead(k));
        self.per_group.clear();
        self.expiry.clear();
        for i in 0..self.slots.len() as u32 {
            let Some(h) = self.slots[i as usize].as_mut() else { continue };
            h.queued = None;
            let (group, fed, front) = (h.group, h.fed, h.records.front().map_or(0, |r| r.time));
            self.count_group(group, true);
            if !fed {
                self.queue(i, front);
            }
        }
    }

    /// Checks the derived indices against the slots (`Keyspace::check_invariants`).
    pub fn check_derived(&self) -> Result<(), String> {
        let by_key: BTreeMap<HolderKey, u32> = self.index.iter().map(|(&k, &i)| (k, i)).collect();
        if by_key != self.by_key {
            return Err("the key-ordered index differs from the key map".into());
        }
        let off_gpu = self.index.keys().filter(|k| k.tier != Tier::Gpu).count() as u32;
        if off_gpu != self.off_gpu {
            return Err(format!("{off_gpu} holders off the GPU, counted {}", self.off_gpu));
        }
        for (&key, &i) in &self.index {
            let holders = self.slot_holders(key);
            let leader = holders.into_iter().find(|&i| i != u32::MAX);
            if self.leaders.get(i as usize).copied() != leader {
                return Err(format!(
                    "{key}: led by {:?}, should be {leader:?}",
                    self.leaders.get(i as usize)
                ));
            }
            if leader.and_then(|l| self.slot_tiers.get(l as usize)) != Some(&holders) {
                return Err(format!("{key}: its slot's holders are filed wrong"));
            }
        }
        let mut per_group = vec![0u32; self.per_group.len()];
        let mut queued = 0;
        for h in self.slots.iter().flatten() {
            match per_group.get_mut(h.group as usize) {
                Some(n) => *n += 1,
                None => return Err(format!("{}: group {} is not counted", h.key, h.group)),
            }
            match h.queued {
                Some(t) => {
                    queued += 1;
                    if h.fed {
                        return Err(format!("{}: fed but filed for expiry", h.key));
                    }
                    if !self.expiry.contains(&(h.group, t, h.key)) {
                        return Err(format!("{}: filed at {t} without an entry", h.key));
                    }
                    if h.records.front().is_some_and(|r| r.time < t) {
                        return Err(format!("{}: filed at {t}, after its oldest record", h.key));
                    }
                }
                None if !h.fed => return Err(format!("{}: inferred but not filed for expiry", h.key)),
                None => {}
            }
        }
        if per_group != self.per_group {
            return Err(format!("holders per group {:?}, counted {:?}", per_group, self.per_group));
        }
        if queued != self.expiry.len() {
            return Err(format!("{} expiry entries for {queued} filed holders", self.expiry.len()));
        }
        Ok(())
    }

    #[inline]
    pub fn at(&self, idx: u32) -> &Holder {
        self.slots[idx as usize].as_ref().expect("live holder index")
    }

    #[inline]
    pub fn at_mut(&mut self, idx: u32) -> &mut Holder {
        self.slots[idx as usize].as_mut().expect("live holder index")
    }

    /// The holder's card as of its last [`Self::sync_card`].
    #[inline]
    pub fn card(&self, idx: u32) -> &Card {
        &self.cards[idx as usize]
    }

    /// Refreshes the holder's card from the holder.
    #[inline]
    pub fn sync_card(&mut self, idx: u32) {
        self.cards[idx as usize] = Card::of(self.at(idx));
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Live holder indices in holder-key order (deterministic whatever the slot layout).
    pub fn sorted(&self) -> Vec<u32> {
        self.by_key.values().copied().collect()
    }
}

impl Holders {
    /// Image section: every slot (empty or a holder with its records and overrides, in a
    /// deterministic order), then the free slot list.
    pub(crate) fn write_image(&self, w: &mut ImageWriter) -> std::io::Result<()> {
        w.section(tag::HOLDERS, |b| {
            put_u64(b, self.slots.len() as u64);
            for slot in &self.slots {
                let Some(h) = slot else {
                    b.push(0);
                    continue;
                };
                // Bits 3-4: the tier (format 3; always 0, the GPU, in older images).
                b.push(1 | u8::from(h.fed) << 1 | u8::from(h.gapped) << 2 | (h.key.tier as u8) << 3);
                put_u64(b, h.key.worker);
                put_u32(b, h.key.dp_rank);
                put_u32(b, h.key.lane);
                put_u32(b, h.blocks);
                put_u64(b, h.digest);
                put_u32(b, h.next_stamp);
                put_u64(b, h.last_time);
                put_u64(b, h.records.len() as u64);
                for r in &h.records {
                    put_u32(b, r.stamp);
                    put_u32(b, r.leaf);
                    put_u32(b, r.len);
                    put_u64(b, r.time);
                }
                let mut overrides: Vec<(u64, u32)> = h.overrides.iter().map(|(&e, &n)| (e, n)).collect();
                overrides.sort_unstable();
                put_u64(b, overrides.len() as u64);
                for (e, n) in overrides {
                    put_u64(b, e);
                    put_u32(b, n);
                }
            }
            put_u64(b, self.free.len() as u64);
            self.free.iter().for_each(|&f| put_u32(b, f));
        })
    }

    /// Reads what [`Self::write_image`] wrote; `group` files each holder in its partition.
    /// Block references are checked by the caller.
    pub(crate) fn read_image(r: &mut ImageReader, group: impl Fn(u64) -> u32) -> Result<Self, ImageError> {
        let mut s = r.section(tag::HOLDERS)?;
        let n = s.count(1)?;
        let mut holders = Holders::default();
        for i in 0..n {
            let flags = s.bytes(1)?[0];
            if flags & 1 == 0 {
                holders.slots.push(None);
                holders.cards.push(Card::of(&Holder::new(HolderKey::new(0, 0, 0), 0)));
                continue;
            }
            if flags >> 5 != 0 {
                return Err(s.invalid("unknown holder flags"));
            }
            let tier = Tier::from_code(u32::from(flags >> 3)).expect("two bits name a tier");
            let key = HolderKey::new(s.u64()?, s.u32()?, s.u32()?).on(tier);
            let mut h = Holder::new(key, group(key.worker));
            (h.fed, h.gapped) = (flags & 2 != 0, flags & 4 != 0);
            (h.blocks, h.digest, h.next_stamp, h.last_time) = (s.u32()?, s.u64()?, s.u32()?, s.u64()?);
            for _ in 0..s.count(20)? {
                let rec = Record { stamp: s.u32()?, leaf: s.u32()?, len: s.u32()?, time: s.u64()? };
                h.records.push_back(rec);
            }
            for _ in 0..s.count(12)? {
                let (e, b) = (s.u64()?, s.u32()?);
                h.overrides.insert(e, b);
                if h.override_of.insert(b, e).is_some() {
                    return Err(s.invalid("two overrides of one block"));
                }
            }
            if holders.index.insert(key, i as u32).is_some() {
                return Err(s.invalid("duplicate holder key"));
            }
            holders.cards.push(Card::of(&h));
            holders.slots.push(Some(h));
        }
        for _ in 0..s.count(4)? {
            let f = s.u32()?;
            if holders.slots.get(f as usize).is_none_or(Option::is_some) {
                return Err(s.invalid("free holder slot out of range or in use"));
            }
            holders.free.push(f);
        }
        if holders.free.len() + holders.index.len() != holders.slots.len() {
            return Err(s.invalid("free slots and holders do not cover the slots"));
        }
        s.done()?;
        holders.rebuild_derived();
        Ok(holders)
    }
}
