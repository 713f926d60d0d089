//! The trie's lookup tables: node indices by hash, open addressing with Robin Hood probing
//! over 7-byte slots that carry the node index *and* 24 bits of its hash, in 256 parts.
//!
//! Why not `hashbrown::HashTable<u32>` (used before): its control bytes and its slots live
//! in different cache lines and a slot holds only the index, so inserting a new ext touched
//! three lines (control group, slot, and a node to compare on tag matches) — the profile of
//! a rebuild had it as the largest single cost. Here a probe reads one line, a node is read
//! only when the stored hash bits match, and growing or deleting (backward shift) never reads
//! a node: a slot's home position is its stored hash bits scaled to the capacity.
//!
//! Parts keep every resize small (1/256 of the entries); the part is chosen by hash bits
//! 32..40, independent of the stored bits (8..32). Even a 1/256 resize of a large table (16 K
//! slots, with the page faults of a fresh array) held the keyspace's write lock for 100 µs or
//! more, a few hundred times per million blocks written, so a large part close to full is also
//! grown *ahead*: [`NodeTable::grow_ahead`] builds its grown array from a shared borrow (under
//! the writer's upgradable read lock, while queries read on) and [`NodeTable::install`] swaps
//! it in under the write lock. The capacities that result depend only on the writes, never on
//! timing.
//!
//! The part list itself is allocated by the first insert: an empty keyspace's two tables cost
//! a few words, not 2 × 256 part headers.

mod image;

const PARTS: usize = 256;
/// One entry: a node index and 24 bits of its hash (the `tag`: bits 8..32 of the part-local
/// hash), 7 bytes. Node 0 is the root, which is never stored, so a slot with node 0 is free.
/// The home position comes from the tag's high bits, so the tag bits below them are what tells
/// entries of one home apart: 24 bits leave about 10 at the peer benchmarks' sizes, and a
/// probe reads a node for a wrong entry about once in a thousand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, packed)]
pub(crate) struct Slot {
    node: u32,
    tag_hi: u16,
    tag_lo: u8,
}

const EMPTY: Slot = Slot { node: 0, tag_hi: 0, tag_lo: 0 };

impl Slot {
    #[inline]
    fn is_empty(self) -> bool {
        self.node == 0
    }

    #[inline]
    fn tag(self) -> u32 {
        u32::from(self.tag_hi) << 8 | u32::from(self.tag_lo)
    }
}

/// The stored hash bits of a part-local hash (its bits 8..32).
#[inline]
fn tag_of(h: u32) -> u32 {
    h >> 8
}

#[inline]
fn slot(h: u32, node: u32) -> Slot {
    let t = tag_of(h);
    Slot { node, tag_hi: (t >> 8) as u16, tag_lo: t as u8 }
}

/// Parts from this many slots on are grown ahead ([`NodeTable::grow_ahead`]); smaller ones
/// grow in place, which costs little.
const AHEAD_MIN_SLOTS: usize = 1024;
/// A part is grown ahead once fewer than this many more entries fit under its load factor:
/// more than one locked write (32 blocks by default) can add to one part.
const AHEAD_ROOM: usize = 64;

#[derive(Clone)]
struct TablePart {
    slots: Box<[Slot]>,
    len: usize,
    /// Listed in [`NodeTable::ahead`] (at most once).
    queued: bool,
    /// The capacity the part starts at ([`first_capacity`]); it doubles from there.
    first: u32,
}

impl TablePart {
    fn new(index: usize) -> Self {
        Self { slots: Box::default(), len: 0, queued: false, first: first_capacity(index) as u32 }
    }
}

/// TablePart `index` starts at 16..31 slots and doubles from there. Entries spread evenly over the
/// parts, so with one first capacity for all they would all double at about the same time,
/// and the whole table would swing between 35% and 70% full: half empty on average, 16 bytes
/// an entry. Staggered, the parts are at every point of their doubling at once, and the
/// table stays about as full as the average of one part's swing at any size.
fn first_capacity(index: usize) -> usize {
    16 + index * 16 / PARTS
}

/// Whether `len` entries fit in `cap` slots under the 0.8 load factor (Robin Hood probing
/// keeps probes short there). With staggered doubling ([`first_capacity`]) a table is about
/// 58% full whatever its size, 12 bytes an entry; one first capacity, a 0.7 load factor and
/// 8-byte slots (as before) left the peer benchmarks' tables 49% full at their end, 16 bytes
/// an entry.
#[inline]
fn fits(len: usize, cap: usize) -> bool {
    len * 5 <= cap * 4
}

// `home` multiplies a 24-bit tag by a capacity of up to 2^32 slots in a `usize`.
const _: () = assert!(usize::BITS >= 64, "the tables need a 64-bit usize");

/// The home slot of tag `t` in `cap` slots: `t` scaled to `0..cap`, so any capacity works
/// (parts start at staggered sizes) and homes keep the order of the tags.
#[inline]
fn home(t: u32, cap: usize) -> usize {
    (t as usize * cap) >> 24
}

/// The slot after `i` in `cap` slots, wrapping around.
#[inline]
fn next(i: usize, cap: usize) -> usize {
    if i + 1 == cap {
        0
    } else {
        i + 1
    }
}

/// How far slot `i` is past the home of entry `s` (the entry's displacement).
#[inline]
fn displacement(s: Slot, i: usize, cap: usize) -> usize {
    let h = home(s.tag(), cap);
    if i >= h {
        i - h
    } else {
        i + cap - h
    }
}

/// Whether every entry sits where Robin Hood probing keeps it: an entry right after a free slot
/// is at its home, and one after another entry is displaced at most one more than it (homes
/// never decrease along a run of entries). A lookup stops at the first entry displaced less
/// than its own probe, so an image out of this order would hide entries from lookups, and a
/// store would then bind a second block to an ext already held (one a removal cannot name: an
/// overcount). Checked on read; images are checksummed, but a peer's checksum proves only what
/// the peer wrote. One pass over the slots; needs a free slot (checked before).
fn in_probe_order(slots: &[Slot]) -> bool {
    let cap = slots.len();
    let Some(free) = slots.iter().position(|s| s.is_empty()) else { return cap == 0 };
    let mut prev: Option<usize> = None;
    // From the slot after the free one round to it (no division per slot).
    let round = slots[free + 1..].iter().zip(free + 1..).chain(slots[..=free].iter().zip(0..));
    for (&s, i) in round {
        if s.is_empty() {
            prev = None;
            continue;
        }
        let d = displacement(s, i, cap);
        if d > prev.map_or(0, |p| p + 1) {
            return false;
        }
        prev = Some(d);
    }
    true
}

/// Copies the entries of `old` into the empty `slots` ([`place`] each). Reads no node.
fn rehash_into(old: &[Slot], slots: &mut [Slot]) {
    for &s in old.iter().filter(|s| !s.is_empty()) {
        place(slots, s);
    }
}

/// Puts entry `s` (not present) into `slots`, which has a free slot: at the first slot from its
/// home whose entry sits closer to its own home than `s` would (or a free one), shifting that
/// entry and the rest of its cluster one slot on.
fn place(slots: &mut [Slot], s: Slot) {
    let cap = slots.len();
    let (mut i, mut d) = (home(s.tag(), cap), 0);
    loop {
        let x = slots[i];
        if x.is_empty() || displacement(x, i, cap) < d {
            break;
        }
        i = next(i, cap);
        d += 1;
    }
    shift_in(slots, i, s);
}

/// Writes `s` at slot `i` and moves the entries from `i` up to the next free slot one slot on.
#[inline]
fn shift_in(slots: &mut [Slot], mut i: usize, mut s: Slot) {
    let cap = slots.len();
    loop {
        s = std::mem::replace(&mut slots[i], s);
        if s.is_empty() {
            return;
        }
        i = next(i, cap);
    }
}

/// Where a probe for `h` stopped: at the entry it was looking for, or where it would go.
enum Probe {
    Found(usize),
    Absent(usize),
}

impl TablePart {
    /// Robin Hood probing: entries sit in the order of their homes, so a probe stops at a free
    /// slot or at the first entry whose home comes after `h`'s (it sits closer to its home than
    /// `h` would), where an entry under `h` would have been put. `eq` is asked about entries
    /// with `h`'s tag.
    #[inline]
    fn probe(&self, h: u32, mut eq: impl FnMut(u32) -> bool) -> Probe {
        let slots = &*self.slots;
        let cap = slots.len();
        let t = tag_of(h);
        let (mut i, mut d) = (home(t, cap), 0);
        loop {
            let s = slots[i];
            if s.is_empty() {
                return Probe::Absent(i);
            }
            if s.tag() == t {
                if eq(s.node) {
                    return Probe::Found(i);
                }
            } else if displacement(s, i, cap) < d {
                return Probe::Absent(i);
            }
            i = next(i, cap);
            d += 1;
        }
    }

    #[inline]
    fn find(&self, h: u32, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        match self.probe(h, eq) {
            Probe::Found(i) => Some(self.slots[i].node),
            Probe::Absent(_) => None,
        }
    }

    fn insert(&mut self, h: u32, node: u32) {
        debug_assert_ne!(node, 0, "the root is never stored");
        self.reserve(self.len + 1);
        place(&mut self.slots, slot(h, node));
        self.len += 1;
    }

    /// Inserts `node` unless an entry under `h` satisfies `eq`, which is returned instead:
    /// one probe for what a lookup followed by an insert would probe twice.
    #[inline]
    fn insert_new(&mut self, h: u32, node: u32, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        debug_assert_ne!(node, 0, "the root is never stored");
        if !fits(self.len + 1, self.slots.len()) {
            self.reserve(self.len + 1);
        }
        match self.probe(h, eq) {
            Probe::Found(i) => Some(self.slots[i].node),
            Probe::Absent(i) => {
                // Entries under `h` that `eq` refused come before `i`: the new one goes after
                // them, in their home's order.
                shift_in(&mut self.slots, i, slot(h, node));
                self.len += 1;
                None
            }
        }
    }

    /// Doubles (from [`Self::first`]) until `total` entries fit under the load factor.
    fn reserve(&mut self, total: usize) {
        let mut cap = if self.slots.is_empty() { self.first as usize } else { self.slots.len() };
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

    /// The slots at twice the capacity, rehashed; `self` is left as it is.
    fn grown_slots(&self) -> Box<[Slot]> {
        let mut slots = vec![EMPTY; self.slots.len() * 2].into_boxed_slice();
        rehash_into(&self.slots, &mut slots);
        slots
    }

    /// Removes `node` stored under `h`; returns whether it was there. Backward shift: the
    /// entries after it move one slot back until a free slot or an entry at its home, so no
    /// probe ever stops early at a gap and entries stay in their homes' order.
    #[inline]
    fn remove(&mut self, h: u32, node: u32) -> bool {
        debug_assert_ne!(node, 0, "the root is never stored");
        if self.slots.is_empty() {
            return false;
        }
        let Probe::Found(mut hole) = self.probe(h, |n| n == node) else { return false };
        let slots = &mut *self.slots;
        let cap = slots.len();
        let mut j = next(hole, cap);
        loop {
            let s = slots[j];
            if s.is_empty() || displacement(s, j, cap) == 0 {
                break;
            }
            slots[hole] = s;
            hole = j;
            j = next(j, cap);
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
    /// Empty until the first insert, then [`PARTS`] parts.
    parts: Vec<TablePart>,
    /// Parts that wanted growth ahead when an insert last touched them ([`Self::grow_ahead`]).
    ahead: Vec<usize>,
}

/// A part's grown slot array, built by [`NodeTable::grow_ahead`] for [`NodeTable::install`].
pub struct GrownPart {
    part: usize,
    /// The part's entry count when it was built: nothing may write the table in between.
    len: usize,
    slots: Box<[Slot]>,
}

impl NodeTable {
    #[inline]
    fn split(h: u64) -> (usize, u32) {
        ((h >> 32) as usize & (PARTS - 1), h as u32)
    }

    /// The node stored under `h` for which `eq` holds.
    #[inline]
    pub fn find(&self, h: u64, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let (s, low) = Self::split(h);
        self.parts.get(s)?.find(low, eq)
    }

    /// TablePart `s`, allocating the part list on first use.
    #[inline]
    fn part_mut(&mut self, s: usize) -> &mut TablePart {
        if self.parts.is_empty() {
            self.parts = (0..PARTS).map(TablePart::new).collect();
        }
        &mut self.parts[s]
    }

    /// Replaces `old` stored under `h` by `new` (a run that took over another's place).
    /// Returns whether `old` was there.
    pub fn replace(&mut self, h: u64, old: u32, new: u32) -> bool {
        let (s, low) = Self::split(h);
        let Some(part) = self.parts.get_mut(s).filter(|pt| !pt.slots.is_empty()) else { return false };
        match part.probe(low, |n| n == old) {
            Probe::Found(i) => {
                part.slots[i] = slot(low, new);
                true
            }
            Probe::Absent(_) => false,
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
            let Some(part) = self.parts.get(s) else { return };
            if let Some(slot) = part.slots.get(home(tag_of(low), part.slots.len())) {
                let p: *const Slot = slot;
                prefetch_ptr(p);
                // A 7-byte slot may straddle two lines (one in nine does).
                let last = p.cast::<u8>().wrapping_add(std::mem::size_of::<Slot>() - 1);
                if (last as usize) & 63 < std::mem::size_of::<Slot>() - 1 {
                    prefetch_ptr(last);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = h;
    }

    /// Stores `node` under `h`; the caller has checked it is not there yet.
    pub fn insert(&mut self, h: u64, node: u32) {
        let (s, low) = Self::split(h);
        self.part_mut(s).insert(low, node);
        self.queue_if_full(s);
    }

    /// Stores `node` under `h` unless a node stored under `h` satisfies `eq`: returns that
    /// node then, and stores nothing.
    #[inline]
    pub fn insert_new(&mut self, h: u64, node: u32, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        let (s, low) = Self::split(h);
        let found = self.part_mut(s).insert_new(low, node, eq);
        self.queue_if_full(s);
        found
    }

    #[inline]
    fn queue_if_full(&mut self, s: usize) {
        let part = &mut self.parts[s];
        if !part.queued && part.wants_growth_ahead() {
            part.queued = true;
            self.ahead.push(s);
        }
    }

    /// The grown arrays of the parts that are large and close to growing, built from a
    /// shared borrow: the costly part of a resize (allocating, faulting pages in, rehashing)
    /// happens while readers may still read. Empty (and free) almost always.
    pub fn grow_ahead(&self) -> Vec<GrownPart> {
        self.ahead
            .iter()
            .map(|&s| (s, &self.parts[s]))
            .filter(|(_, pt)| pt.wants_growth_ahead())
            .map(|(part, pt)| GrownPart { part, len: pt.len, slots: pt.grown_slots() })
            .collect()
    }

    /// Swaps in what [`Self::grow_ahead`] built, with no write to the table in between.
    /// Returns the replaced arrays, for the caller to free after releasing its lock.
    pub fn install(&mut self, grown: Vec<GrownPart>) -> Vec<Box<[Slot]>> {
        for s in self.ahead.drain(..) {
            self.parts[s].queued = false;
        }
        grown
            .into_iter()
            .map(|g| {
                let pt = &mut self.parts[g.part];
                assert_eq!(pt.len, g.len, "table part {} written between grow_ahead and install", g.part);
                std::mem::replace(&mut pt.slots, g.slots)
            })
            .collect()
    }

    /// Removes `node` stored under `h`; returns whether it was there.
    #[inline]
    pub fn remove(&mut self, h: u64, node: u32) -> bool {
        let (s, low) = Self::split(h);
        self.parts.get_mut(s).is_some_and(|pt| pt.remove(low, node))
    }

    /// Makes room for `more` entries beyond the current ones.
    pub fn reserve(&mut self, more: usize) {
        // Parts fill unevenly; 1/8 headroom keeps the fullest from growing.
        let per = more / PARTS + more / PARTS / 8 + 1;
        if more > 0 {
            self.part_mut(0);
        }
        for s in &mut self.parts {
            s.reserve(s.len + per);
        }
    }

    /// Every stored entry as (hash signature, node); see [`Self::signature`].
    pub fn entries(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.parts.iter().enumerate().flat_map(|(i, pt)| {
            pt.slots
                .iter()
                .filter(|s| !s.is_empty())
                .map(move |s| (((i as u64) << 24) | u64::from(s.tag()), s.node))
        })
    }

    /// The bits of a 64-bit hash the table keeps (part and tag): an entry stored under `h`
    /// has the signature `signature(h)`.
    pub fn signature(h: u64) -> u64 {
        let (s, low) = Self::split(h);
        ((s as u64) << 24) | u64::from(tag_of(low))
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.parts.iter().map(|s| s.len).sum()
    }

    /// Heap bytes of the slot arrays.
    pub fn heap_bytes(&self) -> usize {
        self.parts.iter().map(|s| s.slots.len() * std::mem::size_of::<Slot>()).sum::<usize>()
            + self.parts.len() * std::mem::size_of::<TablePart>()
    }
}

#[cfg(test)]
mod tests;
