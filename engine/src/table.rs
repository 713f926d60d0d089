//! The trie's lookup tables: node indices by hash, open addressing with linear probing over
//! `u64` slots that carry the node index *and* the low 32 bits of its hash, in 256 shards.
//!
//! Why not `hashbrown::HashTable<u32>` (used before): its control bytes and its slots live
//! in different cache lines and a slot holds only the index, so inserting a new ext touched
//! three lines (control group, slot, and a node to compare on tag matches) — the profile of
//! a rebuild had it as the largest single cost. Here a probe reads one line, a node is read
//! only when all 32 stored hash bits match, and growing or deleting (backward shift) never
//! reads a node: a slot's home position is its stored hash bits under the mask.
//!
//! Shards keep every resize small (1/256 of the entries); the shard is chosen by hash bits
//! 32..40, independent of the stored low bits. Even a 1/256 resize of a large table (16 K slots,
//! with the page faults of a fresh array) held the keyspace's write lock for 100 µs or more, a
//! few hundred times per million blocks written, so a large shard close to full is also grown
//! *ahead*: [`NodeTable::grow_ahead`] builds its doubled array from a shared borrow (under the
//! writer's upgradable read lock, while queries read on) and [`NodeTable::install`] swaps it in
//! under the write lock. The capacities that result depend only on the writes, never on timing.
//!
//! The shard list itself is allocated by the first insert: an empty keyspace's two tables cost
//! a few words, not 2 × 256 shard headers (16 KiB).

use crate::image_format::{put_u64, put_u64s, tag, ImageError, ImageReader, ImageWriter};

const SHARDS: usize = 256;
/// Node 0 is the root, which is never stored, so an all-zero slot is free.
const EMPTY: u64 = 0;
/// Shards from this many slots on are grown ahead ([`NodeTable::grow_ahead`]); smaller ones
/// grow in place, which costs little.
const AHEAD_MIN_SLOTS: usize = 1024;
/// A shard is grown ahead once fewer than this many more entries fit under its load factor:
/// more than one locked write (32 blocks by default) can add to one shard.
const AHEAD_ROOM: usize = 64;

#[derive(Clone, Default)]
struct Shard {
    slots: Box<[u64]>,
    len: usize,
    /// Listed in [`NodeTable::ahead`] (at most once).
    queued: bool,
}

/// Whether `len` entries fit in `cap` slots under the 0.7 load factor.
#[inline]
fn fits(len: usize, cap: usize) -> bool {
    len * 10 <= cap * 7
}

/// Copies the entries of `old` into the empty power-of-two `slots`: each at its home position
/// under the new mask or the first free one after it. Reads no node.
fn rehash_into(old: &[u64], slots: &mut [u64]) {
    let mask = slots.len() - 1;
    for s in old.iter().copied().filter(|&s| s != EMPTY) {
        let mut i = (s >> 32) as usize & mask;
        while slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        slots[i] = s;
    }
}

#[inline]
fn slot(h: u32, node: u32) -> u64 {
    (u64::from(h) << 32) | u64::from(node)
}

impl Shard {
    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    #[inline]
    fn find(&self, h: u32, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = h as usize & mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if (s >> 32) as u32 == h && eq(s as u32) {
                return Some(s as u32);
            }
            i = (i + 1) & mask;
        }
    }

    fn insert(&mut self, h: u32, node: u32) {
        debug_assert_ne!(node, 0, "the root is never stored");
        self.reserve(self.len + 1);
        let mask = self.mask();
        let mut i = h as usize & mask;
        while self.slots[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = slot(h, node);
        self.len += 1;
    }

    /// Grows (doubling) until `total` entries fit under a 0.7 load factor: linear probing
    /// stays short there, and probes stay within one or two cache lines.
    /// Inserts `node` unless an entry under `h` satisfies `eq`, which is returned instead:
    /// one probe for what a lookup followed by an insert would probe twice.
    #[inline]
    fn insert_new(&mut self, h: u32, node: u32, mut eq: impl FnMut(u32) -> bool) -> Option<u32> {
        debug_assert_ne!(node, 0, "the root is never stored");
        if !fits(self.len + 1, self.slots.len()) {
            self.reserve(self.len + 1);
        }
        let slots = &mut *self.slots;
        let mask = slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            let s = slots[i];
            if s == EMPTY {
                slots[i] = slot(h, node);
                self.len += 1;
                return None;
            }
            if (s >> 32) as u32 == h && eq(s as u32) {
                return Some(s as u32);
            }
            i = (i + 1) & mask;
        }
    }

    fn reserve(&mut self, total: usize) {
        let mut cap = self.slots.len().max(8);
        while !fits(total, cap) {
            cap *= 2;
        }
        if cap == self.slots.len() {
            return;
        }
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; cap].into_boxed_slice());
        rehash_into(&old, &mut self.slots);
    }

    /// Large and within [`AHEAD_ROOM`] entries of growing.
    #[inline]
    fn wants_growth_ahead(&self) -> bool {
        self.slots.len() >= AHEAD_MIN_SLOTS && !fits(self.len + AHEAD_ROOM, self.slots.len())
    }

    /// The slots at twice the size, rehashed; `self` is left as it is.
    fn doubled(&self) -> Box<[u64]> {
        let mut slots = vec![EMPTY; self.slots.len() * 2].into_boxed_slice();
        rehash_into(&self.slots, &mut slots);
        slots
    }

    /// Inlined into the tail removal's loop and indexing a local slice under its own mask, so
    /// the probe has no bounds checks ([`Self::insert_new`] likewise; README "Engine vs
    /// published peers" has the before/after).
    #[inline]
    fn remove(&mut self, h: u32, node: u32) -> bool {
        debug_assert_ne!(node, 0, "the root is never stored");
        if self.slots.is_empty() {
            return false;
        }
        let want = slot(h, node);
        let slots = &mut *self.slots;
        let mask = slots.len() - 1;
        let mut i = h as usize & mask;
        loop {
            match slots[i] {
                s if s == want => break,
                EMPTY => return false,
                _ => i = (i + 1) & mask,
            }
        }
        // Backward shift: pull later entries of the cluster into the hole when the hole lies
        // between their home and where they sit, so no lookup ever crosses a false gap.
        let mut hole = i;
        let mut j = (i + 1) & mask;
        loop {
            let s = slots[j];
            if s == EMPTY {
                break;
            }
            let home = (s >> 32) as usize & mask;
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                slots[hole] = s;
                hole = j;
            }
            j = (j + 1) & mask;
        }
        slots[hole] = EMPTY;
        self.len -= 1;
        true
    }
}

/// Starts loading the cache line holding `*p`. A hint only: no effect on results, and a no-op
/// where the instruction does not exist.
#[inline]
pub fn prefetch_ptr<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Node indices by 64-bit hash. Keys live in the nodes: callers pass an `eq` that checks a
/// candidate node, and the table never needs to rehash a key.
#[derive(Clone, Default)]
pub struct NodeTable {
    /// Empty until the first insert, then [`SHARDS`] shards.
    shards: Vec<Shard>,
    /// Shards that wanted growth ahead when an insert last touched them ([`Self::grow_ahead`]).
    ahead: Vec<usize>,
}

/// A shard's doubled slot array, built by [`NodeTable::grow_ahead`] for [`NodeTable::install`].
pub struct GrownShard {
    shard: usize,
    /// The shard's entry count when it was built: nothing may write the table in between.
    len: usize,
    slots: Box<[u64]>,
}

impl NodeTable {
    #[inline]
    fn split(h: u64) -> (usize, u32) {
        ((h >> 32) as usize & (SHARDS - 1), h as u32)
    }

    /// The node stored under `h` for which `eq` holds.
    #[inline]
    pub fn find(&self, h: u64, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let (s, low) = Self::split(h);
        self.shards.get(s)?.find(low, eq)
    }

    /// Shard `s`, allocating the shard list on first use.
    #[inline]
    fn shard_mut(&mut self, s: usize) -> &mut Shard {
        if self.shards.is_empty() {
            self.shards = (0..SHARDS).map(|_| Shard::default()).collect();
        }
        &mut self.shards[s]
    }

    /// Replaces `old` stored under `h` by `new` (a run that took over another's place).
    /// Returns whether `old` was there.
    pub fn replace(&mut self, h: u64, old: u32, new: u32) -> bool {
        let (s, low) = Self::split(h);
        let Some(shard) = self.shards.get_mut(s).filter(|sh| !sh.slots.is_empty()) else { return false };
        let (mask, want) = (shard.mask(), slot(low, old));
        let mut i = low as usize & mask;
        loop {
            match shard.slots[i] {
                EMPTY => return false,
                x if x == want => {
                    shard.slots[i] = slot(low, new);
                    return true;
                }
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Starts loading the cache line a lookup of `h` will read first. A write of a long block
    /// list issues these a few blocks ahead, so the table's cache misses (one per new block,
    /// the largest cost of a write) overlap instead of queueing. A hint only: no effect on
    /// results, and a no-op where the instruction does not exist.
    #[inline]
    pub fn prefetch(&self, h: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let (s, low) = Self::split(h);
            if let Some(shard) = self.shards.get(s) {
                if let Some(slot) = shard.slots.get(low as usize & shard.mask()) {
                    prefetch_ptr(slot);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = h;
    }

    /// Stores `node` under `h`; the caller has checked it is not there yet.
    pub fn insert(&mut self, h: u64, node: u32) {
        let (s, low) = Self::split(h);
        self.shard_mut(s).insert(low, node);
        self.queue_if_full(s);
    }

    /// Stores `node` under `h` unless a node stored under `h` satisfies `eq`: returns that
    /// node then, and stores nothing.
    #[inline]
    pub fn insert_new(&mut self, h: u64, node: u32, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let (s, low) = Self::split(h);
        let found = self.shard_mut(s).insert_new(low, node, eq);
        self.queue_if_full(s);
        found
    }

    #[inline]
    fn queue_if_full(&mut self, s: usize) {
        let shard = &mut self.shards[s];
        if !shard.queued && shard.wants_growth_ahead() {
            shard.queued = true;
            self.ahead.push(s);
        }
    }

    /// The doubled arrays of the shards that are large and close to growing, built from a
    /// shared borrow: the costly part of a resize (allocating, faulting pages in, rehashing)
    /// happens while readers may still read. Empty (and free) almost always.
    pub fn grow_ahead(&self) -> Vec<GrownShard> {
        self.ahead
            .iter()
            .map(|&s| (s, &self.shards[s]))
            .filter(|(_, sh)| sh.wants_growth_ahead())
            .map(|(shard, sh)| GrownShard { shard, len: sh.len, slots: sh.doubled() })
            .collect()
    }

    /// Swaps in what [`Self::grow_ahead`] built, with no write to the table in between.
    /// Returns the replaced arrays, for the caller to free after releasing its lock.
    pub fn install(&mut self, grown: Vec<GrownShard>) -> Vec<Box<[u64]>> {
        for s in self.ahead.drain(..) {
            self.shards[s].queued = false;
        }
        grown
            .into_iter()
            .map(|g| {
                let sh = &mut self.shards[g.shard];
                assert_eq!(sh.len, g.len, "table shard {} written between grow_ahead and install", g.shard);
                std::mem::replace(&mut sh.slots, g.slots)
            })
            .collect()
    }

    /// Removes `node` stored under `h`; returns whether it was there.
    #[inline]
    pub fn remove(&mut self, h: u64, node: u32) -> bool {
        let (s, low) = Self::split(h);
        self.shards.get_mut(s).is_some_and(|sh| sh.remove(low, node))
    }

    /// Makes room for `more` entries beyond the current ones.
    pub fn reserve(&mut self, more: usize) {
        // Shards fill unevenly; 1/8 headroom keeps the fullest from growing.
        let per = more / SHARDS + more / SHARDS / 8 + 1;
        if more > 0 {
            self.shard_mut(0);
        }
        for s in &mut self.shards {
            s.reserve(s.len + per);
        }
    }

    /// Every stored entry as (hash signature, node); see [`Self::signature`].
    pub fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.shards.iter().enumerate().flat_map(|(i, sh)| {
            sh.slots.iter().filter(|&&s| s != EMPTY).map(move |&s| (((i as u64) << 32) | (s >> 32), s as u32))
        })
    }

    /// The bits of a 64-bit hash the table keeps (shard and stored low bits): an entry stored
    /// under `h` has the signature `signature(h)`.
    pub fn signature(h: u64) -> u64 {
        let (s, low) = Self::split(h);
        ((s as u64) << 32) | u64::from(low)
    }

    /// Image sections: one per shard (its entry count and slots, as in memory).
    pub(crate) fn write_image(&self, w: &mut ImageWriter) -> std::io::Result<()> {
        let empty = Shard::default();
        for s in 0..SHARDS {
            let sh = self.shards.get(s).unwrap_or(&empty);
            w.section(tag::TABLE, |b| {
                put_u64(b, sh.len as u64);
                put_u64(b, sh.slots.len() as u64);
                put_u64s(b, &sh.slots);
            })?;
        }
        Ok(())
    }

    /// Reads what [`Self::write_image`] wrote. Returns the table and the largest index it
    /// stores (0 if none), for the caller to check against what the indices refer to.
    pub(crate) fn read_image(r: &mut ImageReader) -> Result<(Self, u32), ImageError> {
        let mut shards = Vec::with_capacity(SHARDS);
        let mut max = 0u32;
        for _ in 0..SHARDS {
            let mut s = r.section(tag::TABLE)?;
            let len = s.u64()? as usize;
            let cap = s.count(8)?;
            // At least one free slot, or a probe for a missing key would never end.
            if !(cap == 0 || cap.is_power_of_two()) || len > cap * 7 / 10 + 1 || (cap > 0 && len >= cap) {
                return Err(s.invalid("table shard size out of range"));
            }
            // One pass over the bytes: slots copied, entries counted, the root (index 0) never
            // stored, the largest index.
            let mut slots = vec![EMPTY; cap].into_boxed_slice();
            let (mut used, mut root) = (0usize, false);
            // Branch-free, so the compiler vectorises it (an empty slot is 0: it counts for
            // nothing and never raises the largest index).
            for (d, b) in slots.iter_mut().zip(s.bytes(cap * 8)?.chunks_exact(8)) {
                let x = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                *d = x;
                used += usize::from(x != EMPTY);
                root |= (x != EMPTY) & (x as u32 == 0);
                max = max.max(x as u32);
            }
            s.done()?;
            if used != len || root {
                return Err(ImageError::Invalid {
                    tag: tag::TABLE,
                    what: "table entry count or index out of range",
                });
            }
            shards.push(Shard { slots, len, queued: false });
        }
        if shards.iter().all(|s| s.slots.is_empty()) {
            shards = Vec::new();
        }
        Ok((Self { shards, ahead: Vec::new() }, max))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len).sum()
    }

    /// Heap bytes of the slot arrays.
    pub fn heap_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.slots.len() * 8).sum::<usize>()
            + self.shards.len() * std::mem::size_of::<Shard>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn mix(mut x: u64) -> u64 {
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    /// An image whose shard has no free slot is refused: a lookup of a missing key would probe
    /// it forever (a full 2-slot shard passed the load check before, which allows one entry
    /// of slack).
    #[test]
    fn an_image_with_a_full_shard_is_refused() {
        use crate::image_format::{ImageReader, SectionChecks};
        let image = |slots: Vec<u64>| {
            let mut t = NodeTable::default();
            *t.shard_mut(0) = Shard {
                len: slots.iter().filter(|&&s| s != EMPTY).count(),
                slots: slots.into(),
                queued: false,
            };
            let mut bytes = Vec::new();
            t.write_image(&mut ImageWriter::new(&mut bytes)).expect("written to memory");
            bytes
        };
        let read = |bytes: &[u8]| {
            let mut r = ImageReader::new(bytes, SectionChecks::Verify).expect("magic");
            NodeTable::read_image(&mut r).map(|(t, _)| t.len())
        };
        assert_eq!(read(&image(vec![slot(1, 1), EMPTY])), Ok(1));
        assert!(matches!(read(&image(vec![slot(1, 1), slot(2, 2)])), Err(ImageError::Invalid { .. })));
        assert!(matches!(read(&image(vec![slot(1, 1)])), Err(ImageError::Invalid { .. })));
    }

    /// Differential test against a BTreeMap under inserts, removes and lookups, with hashes
    /// drawn from a small set so clusters, wrap-around and equal stored bits are common.
    #[test]
    fn behaves_like_a_map_under_collisions_and_removals() {
        for seed in 0..40u64 {
            let mut t = NodeTable::default();
            let mut reference: BTreeMap<u32, u64> = BTreeMap::new();
            let mut x = seed;
            // Few distinct low bits and few shards: heavy collisions; equal low 32 bits too.
            let hash_of = |node: u32| -> u64 {
                let r = mix(u64::from(node) ^ seed);
                ((r & 0x3) << 32) | (r & 0x3f) | if node.is_multiple_of(7) { 0x1234_0000 } else { 0 }
            };
            for _ in 0..4000 {
                x = mix(x);
                let node = 1 + (x % 600) as u32;
                let h = hash_of(node);
                match (x >> 20) % 3 {
                    0 => {
                        if let std::collections::btree_map::Entry::Vacant(v) = reference.entry(node) {
                            v.insert(h);
                            t.insert(h, node);
                        }
                    }
                    1 => assert_eq!(t.remove(h, node), reference.remove(&node).is_some(), "seed {seed}"),
                    _ => {
                        let got = t.find(h, |n| n == node);
                        assert_eq!(got, reference.contains_key(&node).then_some(node), "seed {seed}");
                    }
                }
                assert_eq!(t.len(), reference.len());
            }
            for (&node, &h) in &reference {
                assert_eq!(t.find(h, |n| n == node), Some(node), "seed {seed}: survivor {node}");
            }
            // A lookup by hash alone sees only nodes stored under that exact hash.
            for (&node, &h) in &reference {
                let mut seen = Vec::new();
                t.find(h, |n| {
                    seen.push(n);
                    false
                });
                assert!(seen.contains(&node));
                assert!(seen.iter().all(|n| reference[n] as u32 == h as u32));
            }
        }
    }

    /// A writer that calls `grow_ahead` + `install` before every 32 inserts (as
    /// `Engine::store` does per locked chunk) never grows a large shard in place, and the
    /// table stays a map.
    #[test]
    fn growth_ahead_leaves_large_shards_room_for_the_next_writes() {
        let caps = |t: &NodeTable| t.shards.iter().map(|s| s.slots.len()).collect::<Vec<_>>();
        let mut t = NodeTable::default();
        let (mut installed, mut n) = (0, 0u32);
        for _batch in 0..20_000 {
            let grown = t.grow_ahead();
            installed += grown.len();
            let replaced = t.install(grown);
            assert!(replaced.iter().all(|a| a.len() >= AHEAD_MIN_SLOTS));
            let before = caps(&t);
            for _ in 0..32 {
                n += 1;
                t.insert(mix(u64::from(n)), n);
            }
            for (s, (&b, a)) in before.iter().zip(caps(&t)).enumerate() {
                assert!(b < AHEAD_MIN_SLOTS || a == b, "shard {s} grew in place from {b} to {a} slots");
            }
        }
        assert!(installed >= SHARDS, "every shard grew ahead at least once ({installed})");
        for k in 1..=n {
            assert_eq!(t.find(mix(u64::from(k)), |c| c == k), Some(k));
        }
        assert_eq!(t.len(), n as usize);
    }

    #[test]
    fn reserve_keeps_entries_and_prevents_growth() {
        let mut t = NodeTable::default();
        for n in 1..1000u32 {
            t.insert(mix(u64::from(n)), n);
        }
        t.reserve(100_000);
        let bytes = t.heap_bytes();
        for n in 1000..101_000u32 {
            t.insert(mix(u64::from(n)), n);
        }
        assert_eq!(t.heap_bytes(), bytes, "reserved room was enough");
        for n in 1..101_000u32 {
            assert_eq!(t.find(mix(u64::from(n)), |c| c == n), Some(n));
        }
    }
}
