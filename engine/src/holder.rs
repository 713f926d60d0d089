//! Per-holder bookkeeping: counts, digest, and the operation records that drive eviction.
//!
//! Every store or placement gets a per-holder stamp; each block it touches is (re)stamped with
//! it and a [`Record`] remembers the operation's window (its last node and length). A block
//! belongs to exactly one record: the one whose stamp it carries. Clearing a holder, evicting
//! its least-recently-stored blocks for capacity, and expiring placements all walk records,
//! so no per-holder block list is needed.

use crate::image::{put_u32, put_u64, tag, ImageError, ImageReader, ImageWriter};
use crate::types::{HolderKey, LogTime};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

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
            last_write: 0,
        }
    }
}

/// What a match reads of a holder, packed in one dense array beside the slots: a match that
/// lists hundreds of holders reads a few cache lines of cards instead of one line (or two) of
/// each holder. A copy, refreshed by [`Holders::sync_card`] at the end of every operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Card {
    pub key: HolderKey,
    pub blocks: u32,
    pub fed: bool,
    pub gapped: bool,
}

impl Card {
    fn of(h: &Holder) -> Self {
        Self { key: h.key, blocks: h.blocks, fed: h.fed, gapped: h.gapped }
    }
}

/// Holders of a keyspace: a slab indexed by `u32` plus a key → index map.
#[derive(Clone, Default)]
pub struct Holders {
    pub slots: Vec<Option<Holder>>,
    /// Per slot, the live holder's [`Card`].
    cards: Vec<Card>,
    free: Vec<u32>,
    pub index: FxHashMap<HolderKey, u32>,
}

impl Holders {
    pub fn get(&self, key: &HolderKey) -> Option<u32> {
        self.index.get(key).copied()
    }

    pub fn insert(&mut self, h: Holder) -> u32 {
        let key = h.key;
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
        idx
    }

    pub fn remove(&mut self, idx: u32) -> Option<Holder> {
        let h = self.slots[idx as usize].take()?;
        self.index.remove(&h.key);
        self.free.push(idx);
        Some(h)
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
        let mut v: Vec<(HolderKey, u32)> = self.index.iter().map(|(k, i)| (*k, *i)).collect();
        v.sort_unstable();
        v.into_iter().map(|(_, i)| i).collect()
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
                b.push(1 | u8::from(h.fed) << 1 | u8::from(h.gapped) << 2);
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
                holders.cards.push(Card {
                    key: HolderKey::new(0, 0, 0),
                    blocks: 0,
                    fed: false,
                    gapped: false,
                });
                continue;
            }
            let key = HolderKey::new(s.u64()?, s.u32()?, s.u32()?);
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
        Ok(holders)
    }
}
