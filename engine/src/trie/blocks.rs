//! Block storage: one entry per block position of the trie, in fixed chunks, and the
//! allocator of the contiguous block ranges that runs occupy.
//!
//! A block has a local hash (what matching compares) and a [`Meta`]: its canonical ext and the
//! run it belongs to. Locals are a separate array so that matching reads a run's locals as
//! one contiguous slice (8 per cache line); ext and run sit together because a removal by ext
//! reads both. A block id never changes while the block lives, so the ext table, records and
//! overrides refer to blocks, and splitting a run only rewrites the run ids of one part.
//!
//! Ranges never cross a chunk, so a run's locals are one slice. The first chunk starts with
//! room for [`FIRST_CHUNK`] blocks and doubles until it is whole (a keyspace with a few blocks
//! costs a few KiB, not the 1.3 MiB of a whole chunk, whose metadata every new keyspace used
//! to fault in); every later chunk is allocated at full size and never moves or grows, so no
//! write copies more than the first chunk's 64 Ki blocks, once. Free ranges are kept for best
//! fit, merged with their neighbours, and handed back to the bump pointer when they end at it.

use crate::image_format::{put_u32, put_u64, put_u64s, tag, ImageError, ImageReader, ImageWriter};
use std::collections::{BTreeMap, BTreeSet};

pub const CHUNK_BITS: u32 = 16;
/// Blocks per chunk; also the longest possible run.
pub const CHUNK: usize = 1 << CHUNK_BITS;
/// Blocks the first chunk has room for in a new keyspace (a multiple of [`ANCHOR`]).
pub const FIRST_CHUNK: usize = 64;
/// The root's (virtual) block: block 0, never allocated, run 0.
pub const ROOT_BLOCK: u32 = 0;
/// `Meta::run` of a block that belongs to no run.
pub const FREE: u32 = u32::MAX >> 1;
const HAS_EXT: u32 = 1 << 31;

/// A block's canonical ext and its run. Packed to 12 bytes: the run id's top bit says whether
/// `ext` is set (the first ext a holder stored the block under).
#[derive(Clone, Copy, Debug)]
#[repr(C, packed(4))]
pub struct Meta {
    ext: u64,
    run: u32,
}

impl Meta {
    const FREE: Meta = Meta { ext: 0, run: FREE };

    #[inline]
    pub fn run(self) -> u32 {
        self.run & !HAS_EXT
    }

    /// The canonical ext, if bound.
    #[inline]
    pub fn ext(self) -> Option<u64> {
        (self.run & HAS_EXT != 0).then_some(self.ext)
    }
}

/// Every `ANCHOR`-th block id keeps its path hash, so the path of any block is at most
/// `ANCHOR - 1` steps from a known one (a block's path never changes while it lives).
pub const ANCHOR_BITS: u32 = 6;
pub const ANCHOR: u32 = 1 << ANCHOR_BITS;

#[derive(Clone)]
pub struct Chunk {
    local: Box<[u64]>,
    meta: Box<[Meta]>,
    /// Path hash of block `k * ANCHOR` of this chunk (valid while that block is live).
    anchor: Box<[u64]>,
}

impl Chunk {
    fn new() -> Self {
        Self::with_len(CHUNK)
    }

    /// Room for `n` blocks (a multiple of [`ANCHOR`], at most [`CHUNK`]), all free.
    fn with_len(n: usize) -> Self {
        debug_assert!(n.is_multiple_of(ANCHOR as usize) && n <= CHUNK);
        Self {
            local: vec![0; n].into_boxed_slice(),
            meta: vec![Meta::FREE; n].into_boxed_slice(),
            anchor: vec![0; n >> ANCHOR_BITS].into_boxed_slice(),
        }
    }

    fn len(&self) -> usize {
        self.local.len()
    }

    /// A copy with room for `n >= self.len()` blocks, the new ones free.
    fn grown(&self, n: usize) -> Self {
        let mut c = Self::with_len(n);
        c.local[..self.len()].copy_from_slice(&self.local);
        c.meta[..self.len()].copy_from_slice(&self.meta);
        c.anchor[..self.anchor.len()].copy_from_slice(&self.anchor);
        c
    }
}

/// How many blocks a partial first chunk is grown to so that blocks below `end` fit: at least
/// double, a power of two, at most a whole chunk.
fn first_chunk_len(len: usize, end: usize) -> usize {
    end.next_power_of_two().max(2 * len).clamp(FIRST_CHUNK, CHUNK)
}

/// Free block ranges: by start (to merge neighbours) and by (length, start) (best fit).
#[derive(Clone, Default)]
struct FreeRanges {
    by_start: BTreeMap<u32, u32>,
    by_len: BTreeSet<(u32, u32)>,
}

impl FreeRanges {
    fn insert(&mut self, start: u32, len: u32) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
    }

    fn remove(&mut self, start: u32, len: u32) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
    }

    /// The smallest free range of at least `n` blocks, removed.
    fn take_best_fit(&mut self, n: u32) -> Option<(u32, u32)> {
        let &(len, start) = self.by_len.range((n, 0)..).next()?;
        self.remove(start, len);
        Some((start, len))
    }
}

fn same_chunk(a: u32, b: u32) -> bool {
    a >> CHUNK_BITS == b >> CHUNK_BITS
}

/// A new chunk is allocated ahead ([`crate::trie::grow_ahead`]) once fewer than this many blocks
/// are left above `top`: filling a new chunk's metadata faults in 1.5 MiB of pages, a few
/// hundred µs that a write should not spend holding its keyspace's lock. A partial first chunk
/// is grown ahead once less than a quarter of it is left.
const CHUNK_AHEAD_ROOM: usize = CHUNK / 8;

/// Block storage built outside the write lock, for [`Blocks::add_chunk`].
pub enum SpareChunk {
    /// A new whole chunk to append.
    Append(Chunk),
    /// The partial first chunk, copied into a larger one while `top` was `top`.
    Grown { top: u32, chunk: Chunk },
}

#[derive(Clone)]
pub struct Blocks {
    chunks: Vec<Chunk>,
    /// Blocks at or above this id have never been handed out since they were last free.
    top: u32,
    free: FreeRanges,
}

impl Default for Blocks {
    fn default() -> Self {
        Self::new()
    }
}

impl Blocks {
    /// Storage holding only the root block (run 0).
    pub fn new() -> Self {
        let mut b = Self { chunks: vec![Chunk::with_len(FIRST_CHUNK)], top: 1, free: FreeRanges::default() };
        b.set_run(ROOT_BLOCK, 0);
        b
    }

    #[inline]
    pub fn local(&self, b: u32) -> u64 {
        self.chunks[(b >> CHUNK_BITS) as usize].local[b as usize & (CHUNK - 1)]
    }

    #[inline]
    pub fn meta(&self, b: u32) -> Meta {
        self.chunks[(b >> CHUNK_BITS) as usize].meta[b as usize & (CHUNK - 1)]
    }

    #[inline]
    fn meta_mut(&mut self, b: u32) -> &mut Meta {
        &mut self.chunks[(b >> CHUNK_BITS) as usize].meta[b as usize & (CHUNK - 1)]
    }

    #[inline]
    pub fn run_of(&self, b: u32) -> u32 {
        self.meta(b).run()
    }

    /// The locals of `len` blocks from `start` (a range inside one chunk).
    #[inline]
    pub fn locals(&self, start: u32, len: u32) -> &[u64] {
        let off = start as usize & (CHUNK - 1);
        &self.chunks[(start >> CHUNK_BITS) as usize].local[off..off + len as usize]
    }

    /// Mutable locals of a range inside one chunk.
    pub fn locals_mut(&mut self, start: u32, len: u32) -> &mut [u64] {
        let off = start as usize & (CHUNK - 1);
        &mut self.chunks[(start >> CHUNK_BITS) as usize].local[off..off + len as usize]
    }

    /// The path hash of block `b`, a multiple of [`ANCHOR`].
    #[inline]
    pub fn anchor(&self, b: u32) -> u64 {
        debug_assert!(b.is_multiple_of(ANCHOR));
        self.chunks[(b >> CHUNK_BITS) as usize].anchor[(b as usize & (CHUNK - 1)) >> ANCHOR_BITS]
    }

    /// Records the path hash of block `b` if it is an anchor block.
    #[inline]
    pub fn set_path(&mut self, b: u32, path: u64) {
        if b.is_multiple_of(ANCHOR) {
            self.chunks[(b >> CHUNK_BITS) as usize].anchor[(b as usize & (CHUNK - 1)) >> ANCHOR_BITS] = path;
        }
    }

    /// Moves a block to run `run`, keeping its ext.
    #[inline]
    pub fn set_run(&mut self, b: u32, run: u32) {
        let m = self.meta_mut(b);
        m.run = (m.run & HAS_EXT) | run;
    }

    /// Binds the block's canonical ext.
    #[inline]
    pub fn set_ext(&mut self, b: u32, ext: u64) {
        let m = self.meta_mut(b);
        m.ext = ext;
        m.run |= HAS_EXT;
    }

    /// Marks a block as belonging to no run, with no ext.
    #[inline]
    pub fn set_free(&mut self, b: u32) {
        *self.meta_mut(b) = Meta::FREE;
    }

    /// Blocks ever handed out (ids below this may be live).
    #[inline]
    pub fn top(&self) -> u32 {
        self.top
    }

    /// Allocates `n` contiguous blocks (`1 <= n <= CHUNK`) inside one chunk: the smallest free
    /// range that fits, else from the bump pointer. The blocks are marked free; the caller
    /// assigns them to a run.
    pub fn alloc(&mut self, n: u32) -> u32 {
        debug_assert!(n >= 1 && n as usize <= CHUNK);
        if let Some((start, len)) = self.free.take_best_fit(n) {
            if len > n {
                self.free.insert(start + n, len - n);
            }
            return start;
        }
        let chunk_end = ((self.top >> CHUNK_BITS) + 1) << CHUNK_BITS;
        if self.top + n > chunk_end {
            // The rest of this chunk is too short: keep it as a free range, start the next.
            self.free_range(self.top, chunk_end - self.top);
            self.top = chunk_end;
        }
        self.make_room((self.top + n) as usize);
        let start = self.top;
        self.top += n;
        start
    }

    /// Returns `len` blocks from `start` (inside one chunk, already marked free).
    pub fn free_range(&mut self, mut start: u32, mut len: u32) {
        debug_assert!(len >= 1 && same_chunk(start, start + len - 1));
        if let Some((&ps, &pl)) = self.free.by_start.range(..start).next_back() {
            if ps + pl == start && same_chunk(ps, start) {
                self.free.remove(ps, pl);
                (start, len) = (ps, pl + len);
            }
        }
        if let Some(&nl) = self.free.by_start.get(&(start + len)) {
            if same_chunk(start, start + len) {
                self.free.remove(start + len, nl);
                len += nl;
            }
        }
        if start + len == self.top {
            self.top = start;
        } else {
            self.free.insert(start, len);
        }
    }

    /// The length of the longest free range (0 if none).
    pub fn longest_free(&self) -> u32 {
        self.free.by_len.last().map_or(0, |&(len, _)| len)
    }

    /// Room for blocks `0..total` (a rebuild allocates in order, block id = dump number).
    pub fn reserve_chunks(&mut self, total: usize) {
        self.make_room(total);
    }

    /// Backs block ids below `end`: grows a partial first chunk (to a whole one when `end` lies
    /// beyond it: its free tail becomes allocatable), then appends whole chunks.
    fn make_room(&mut self, end: usize) {
        while self.capacity() < end {
            match self.partial_first() {
                Some(len) => self.chunks[0] = self.chunks[0].grown(first_chunk_len(len, end)),
                None => self.chunks.push(Chunk::new()),
            }
        }
    }

    /// The length of the first chunk while it is the only one and not yet whole.
    fn partial_first(&self) -> Option<usize> {
        let len = self.chunks[0].len();
        (self.chunks.len() == 1 && len < CHUNK).then_some(len)
    }

    /// Storage the next writes are about to need, built from a shared borrow (no lock needed
    /// beyond one that keeps writers out): a new chunk when the bump pointer is close to the
    /// end of the last one, or a larger copy of a partial first chunk once a quarter of it is
    /// left. `None` almost always.
    pub fn grow_ahead(&self) -> Option<SpareChunk> {
        let room = self.capacity() - self.top as usize;
        match self.partial_first() {
            Some(len) if room <= len / 4 => Some(SpareChunk::Grown {
                top: self.top,
                chunk: self.chunks[0].grown(first_chunk_len(len, 0)),
            }),
            Some(_) => None,
            None => (room <= CHUNK_AHEAD_ROOM).then(|| SpareChunk::Append(Chunk::new())),
        }
    }

    /// Installs what [`Self::grow_ahead`] built: capacity only, no block changes. Returns a
    /// replaced first chunk, for the caller to free after releasing its lock.
    pub fn add_chunk(&mut self, c: SpareChunk) -> Option<SpareChunk> {
        match c {
            SpareChunk::Append(chunk) => {
                self.chunks.push(chunk);
                None
            }
            SpareChunk::Grown { top, chunk } => {
                assert!(
                    top == self.top && self.partial_first().is_some(),
                    "blocks written between grow_ahead and install"
                );
                Some(SpareChunk::Grown { top, chunk: std::mem::replace(&mut self.chunks[0], chunk) })
            }
        }
    }

    /// Rebuild: blocks `1..top` are in use, in order.
    pub fn set_top(&mut self, top: u32) {
        debug_assert!(top as usize <= self.capacity() && self.free.by_start.is_empty());
        self.top = top;
    }

    /// Blocks backed by storage (only the first chunk can be partial, while it is the only one).
    fn capacity(&self) -> usize {
        (self.chunks.len() - 1) * CHUNK + self.chunks[self.chunks.len() - 1].len()
    }

    /// Free ranges as (start, len), in block order.
    pub fn free_ranges(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.free.by_start.iter().map(|(&s, &l)| (s, l))
    }

    pub fn heap_bytes(&self) -> usize {
        self.capacity() * (8 + std::mem::size_of::<Meta>())
            + (self.capacity() >> ANCHOR_BITS) * 8
            + self.free.by_start.len() * 48
    }
}

impl Blocks {
    /// Blocks of chunk `k` below `top` (the rest are free and need not be kept).
    fn used_in(&self, k: usize) -> usize {
        (self.top as usize).saturating_sub(k * CHUNK).min(CHUNK)
    }

    /// Image sections: chunk count, bump pointer and free ranges, then per chunk its used
    /// locals, metas and anchors.
    pub(crate) fn write_image(&self, w: &mut ImageWriter) -> std::io::Result<()> {
        w.section(tag::BLOCKS, |b| {
            put_u32(b, self.chunks.len() as u32);
            put_u32(b, self.top);
            put_u64(b, self.free.by_start.len() as u64);
            for (&start, &len) in &self.free.by_start {
                put_u32(b, start);
                put_u32(b, len);
            }
        })?;
        for (k, c) in self.chunks.iter().enumerate() {
            let used = self.used_in(k);
            w.section(tag::LOCALS, |b| put_u64s(b, &c.local[..used]))?;
            w.section(tag::META, |b| {
                b.reserve(used * 12);
                for m in &c.meta[..used] {
                    put_u64(b, m.ext);
                    put_u32(b, m.run);
                }
            })?;
            w.section(tag::ANCHORS, |b| put_u64s(b, &c.anchor[..used.div_ceil(ANCHOR as usize)]))?;
        }
        Ok(())
    }

    /// Reads what [`Self::write_image`] wrote. Returns the storage and the largest run id a
    /// block names (0 if none), for the caller to check against the runs.
    pub(crate) fn read_image(r: &mut ImageReader) -> Result<(Self, u32), ImageError> {
        let mut s = r.section(tag::BLOCKS)?;
        let (chunks, top) = (s.u32()? as usize, s.u32()?);
        if chunks == 0 || chunks > (1usize << (32 - CHUNK_BITS)) || top == 0 || top as usize > chunks * CHUNK
        {
            return Err(s.invalid("chunk count or top out of range"));
        }
        let mut free = FreeRanges::default();
        for _ in 0..s.count(8)? {
            let (start, len) = (s.u32()?, s.u32()?);
            let end = u64::from(start) + u64::from(len);
            if start == 0 || len == 0 || end > u64::from(top) || !same_chunk(start, start + len - 1) {
                return Err(s.invalid("free range out of range"));
            }
            free.insert(start, len);
        }
        s.done()?;
        let mut blocks = Blocks { chunks: Vec::with_capacity(chunks), top, free };
        let mut max_run = 0;
        // A lone first chunk is as large as the blocks below `top` need, as it was in memory.
        let first = if chunks == 1 { first_chunk_len(0, top as usize) } else { CHUNK };
        for k in 0..chunks {
            let used = blocks.used_in(k);
            let len = if k == 0 { first } else { CHUNK };
            // Each array written once: zeroed ones come from the allocator as untouched pages,
            // and metas are decoded straight into place before the rest is filled as free.
            let (mut local, mut anchor) = (vec![0; len], vec![0; len >> ANCHOR_BITS]);
            let mut s = r.section(tag::LOCALS)?;
            s.u64s_into(&mut local[..used])?;
            s.done()?;
            let mut s = r.section(tag::META)?;
            let mut meta = Vec::with_capacity(len);
            meta.extend(s.bytes(used * 12)?.chunks_exact(12).map(|x| Meta {
                ext: u64::from_le_bytes(x[..8].try_into().expect("8 bytes")),
                run: u32::from_le_bytes(x[8..].try_into().expect("4 bytes")),
            }));
            // Branch-free, so it can be vectorised: a free block names no run.
            max_run = meta.iter().fold(max_run, |m, b| m.max(if b.run() == FREE { 0 } else { b.run() }));
            meta.resize(len, Meta::FREE);
            s.done()?;
            let mut s = r.section(tag::ANCHORS)?;
            s.u64s_into(&mut anchor[..used.div_ceil(ANCHOR as usize)])?;
            s.done()?;
            let (local, meta, anchor) =
                (local.into_boxed_slice(), meta.into_boxed_slice(), anchor.into_boxed_slice());
            blocks.chunks.push(Chunk { local, meta, anchor });
        }
        Ok((blocks, max_run))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocations never overlap, stay inside a chunk, and freed space is reused.
    #[test]
    fn ranges_are_disjoint_and_reused() {
        let mut b = Blocks::new();
        let mut live: Vec<(u32, u32)> = Vec::new();
        let mut x = 1u64;
        for _ in 0..20_000 {
            x = crate::digest::mix64(x);
            if live.len() > 50 && x.is_multiple_of(3) {
                let (s, l) = live.swap_remove((x >> 8) as usize % live.len());
                b.free_range(s, l);
            } else {
                let n = 1 + (x >> 20) as u32 % 700;
                let s = b.alloc(n);
                assert!(s >= 1 && same_chunk(s, s + n - 1), "{s} + {n}");
                live.push((s, n));
            }
        }
        live.sort_unstable();
        for w in live.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{:?} overlaps {:?}", w[0], w[1]);
        }
        for (s, l) in b.free_ranges() {
            assert!(live.iter().all(|&(ls, ll)| s + l <= ls || ls + ll <= s));
        }
        let used: u64 = live.iter().map(|r| u64::from(r.1)).sum();
        assert!(b.capacity() as u64 <= 2 * used + 2 * CHUNK as u64, "space is reused");
    }
}
