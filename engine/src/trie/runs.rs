//! Runs: the trie's nodes, each a chain of consecutive block positions with one membership
//! list (see `crate::trie`), stored in fixed chunks with a free list of ids.

use crate::image_format::{put_u32, put_u64, tag, ImageError, ImageReader, ImageWriter};
use smallvec::SmallVec;

/// One holder's membership of a run, with the stamp of the operation that last stored it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub holder: u32,
    pub stamp: u32,
}

pub type Members = SmallVec<[Member; 2]>;

#[derive(Clone)]
pub struct Run {
    pub start: u32,
    pub len: u32,
    /// Blocks `start..start + cap` belong to this run's allocation (`cap >= len`).
    pub cap: u32,
    /// The block this run hangs off ([`ROOT_BLOCK`] for top-level runs).
    pub parent: u32,
    /// The first child created of the last block (`NIL` if none); others are in the edge table.
    pub first_child: u32,
    /// The first block of `first_child` (when there is one): a match starts loading the next
    /// run's locals without waiting for its record.
    pub first_child_start: u32,
    /// The child count in the low 31 bits, then the `live` flag.
    pub(crate) bits: u32,
    /// Operation records whose window ends at the last block.
    pub pins: u32,
    pub first_local: u64,
    pub start_path: u64,
    pub end_path: u64,
    pub members: Members,
}

pub(crate) const CHILDREN: u32 = (1 << 30) - 1;
/// One child, with the same holders (see `same_holders`). Derived: never written to an image.
pub(crate) const SAME: u32 = 1 << 30;
pub(crate) const LIVE: u32 = 1 << 31;

impl Run {
    #[inline]
    pub fn last(&self) -> u32 {
        self.start + self.len - 1
    }

    #[inline]
    pub fn children(&self) -> u32 {
        self.bits & CHILDREN
    }

    /// The run has one child, with the same holders (see `same_holders`).
    #[inline]
    pub fn same_as_child(&self) -> bool {
        self.bits & SAME != 0
    }

    #[inline]
    pub fn live(&self) -> bool {
        self.bits & LIVE != 0
    }

    #[inline]
    pub fn member(&self, holder: u32) -> Option<usize> {
        self.members.iter().position(|m| m.holder == holder)
    }

    /// Whether `holder` holds this run with `stamp`.
    #[inline]
    pub fn has(&self, holder: u32, stamp: u32) -> bool {
        self.members.iter().any(|m| m.holder == holder && m.stamp == stamp)
    }

    /// Whether `other` has the same holders (stamps aside). Member lists are sorted by key.
    #[inline]
    pub fn same_holders(&self, other: &Run) -> bool {
        self.members.len() == other.members.len()
            && self.members.iter().zip(other.members.iter()).all(|(x, y)| x.holder == y.holder)
    }

    /// Unheld, childless and unpinned: nothing keeps it.
    #[inline]
    pub fn dead(&self) -> bool {
        self.members.is_empty() && self.children() == 0 && self.pins == 0
    }
}

const RUN_CHUNK_BITS: u32 = 12;
const RUN_CHUNK: usize = 1 << RUN_CHUNK_BITS;
/// Runs the first chunk has room for at first. It grows by doubling to [`RUN_CHUNK`] (one copy
/// of at most 4,096 runs, once per keyspace), so a keyspace with a few runs does not reserve
/// a whole chunk (320 KiB); later chunks are allocated at full size and never move.
const FIRST_RUN_CHUNK: usize = 4;

/// Runs in chunks with a free list of ids.
#[derive(Clone, Default)]
pub struct Runs {
    chunks: Vec<Vec<Run>>,
    len: usize,
    free: Vec<u32>,
}

impl Runs {
    pub(crate) fn alloc(&mut self, run: Run) -> u32 {
        if let Some(r) = self.free.pop() {
            self[r] = run;
            return r;
        }
        self.push(run);
        (self.len - 1) as u32
    }

    /// Appends a run slot: the first chunk grows by doubling, later ones are allocated whole.
    fn push(&mut self, run: Run) {
        if self.len == self.chunks.len() * RUN_CHUNK {
            let cap = if self.chunks.is_empty() { FIRST_RUN_CHUNK } else { RUN_CHUNK };
            self.chunks.push(Vec::with_capacity(cap));
        }
        let chunk = self.chunks.last_mut().expect("a chunk");
        if chunk.len() == chunk.capacity() {
            chunk.reserve_exact(chunk.capacity().clamp(1, RUN_CHUNK - chunk.len()));
        }
        chunk.push(run);
        self.len += 1;
    }

    pub(crate) fn release(&mut self, r: u32) {
        let run = &mut self[r];
        (run.bits, run.pins) = (0, 0);
        run.members = Members::new();
        self.free.push(r);
    }

    /// Run ids ever allocated (live or on the free list).
    #[inline]
    pub fn slots(&self) -> u32 {
        self.len as u32
    }

    pub fn free_ids(&self) -> &[u32] {
        &self.free
    }

    pub fn get(&self, r: u32) -> Option<&Run> {
        ((r as usize) < self.len).then(|| &self[r])
    }

    /// Heap bytes of the run chunks, the free list and spilled member lists.
    pub fn heap_bytes(&self) -> usize {
        let spilled: usize = (0..self.slots())
            .map(|r| &self[r])
            .filter(|r| r.members.spilled())
            .map(|r| r.members.capacity() * std::mem::size_of::<Member>())
            .sum();
        let slots: usize = self.chunks.iter().map(Vec::capacity).sum();
        slots * std::mem::size_of::<Run>() + self.free.capacity() * 4 + spilled
    }
}

impl std::ops::Index<u32> for Runs {
    type Output = Run;
    #[inline]
    fn index(&self, r: u32) -> &Run {
        &self.chunks[(r >> RUN_CHUNK_BITS) as usize][r as usize & (RUN_CHUNK - 1)]
    }
}

impl std::ops::IndexMut<u32> for Runs {
    #[inline]
    fn index_mut(&mut self, r: u32) -> &mut Run {
        &mut self.chunks[(r >> RUN_CHUNK_BITS) as usize][r as usize & (RUN_CHUNK - 1)]
    }
}

impl Runs {
    /// Image sections: the run slots (fixed fields, member counts) and free ids, then every
    /// member list in slot order.
    pub(crate) fn write_image(&self, w: &mut ImageWriter) -> std::io::Result<()> {
        w.section(tag::RUNS, |b| {
            put_u64(b, self.len as u64);
            for r in 0..self.slots() {
                let x = &self[r];
                for v in [
                    x.start,
                    x.len,
                    x.cap,
                    x.parent,
                    x.first_child,
                    x.first_child_start,
                    x.bits & !SAME,
                    x.pins,
                ] {
                    put_u32(b, v);
                }
                for v in [x.first_local, x.start_path, x.end_path] {
                    put_u64(b, v);
                }
                put_u32(b, x.members.len() as u32);
            }
            put_u64(b, self.free.len() as u64);
            self.free.iter().for_each(|&f| put_u32(b, f));
        })?;
        w.section(tag::MEMBERS, |b| {
            for r in 0..self.slots() {
                for m in self[r].members.iter() {
                    put_u32(b, m.holder);
                    put_u32(b, m.stamp);
                }
            }
        })
    }

    /// Reads what [`Self::write_image`] wrote. References are checked by the caller.
    pub(crate) fn read_image(r: &mut ImageReader) -> Result<Self, ImageError> {
        const FIXED: usize = 8 * 4 + 3 * 8 + 4;
        let mut s = r.section(tag::RUNS)?;
        let n = s.count(FIXED)?;
        if n == 0 || n > u32::MAX as usize {
            return Err(s.invalid("run count out of range"));
        }
        let mut runs = Runs::default();
        let mut counts = Vec::with_capacity(n);
        for _ in 0..n {
            let mut f = [0u32; 8];
            for v in &mut f {
                *v = s.u32()?;
            }
            let [start, len, cap, parent, first_child, first_child_start, bits, pins] = f;
            let (first_local, start_path, end_path) = (s.u64()?, s.u64()?, s.u64()?);
            counts.push(s.u32()? as usize);
            let members = Members::new();
            let run = Run {
                start,
                len,
                cap,
                parent,
                first_child,
                first_child_start,
                // Derived: recomputed once the trie is whole.
                bits: bits & !SAME,
                pins,
                first_local,
                start_path,
                end_path,
                members,
            };
            runs.push(run);
        }
        for _ in 0..s.count(4)? {
            let f = s.u32()?;
            if f as usize >= n || f == 0 || runs[f].live() {
                return Err(s.invalid("free run id out of range or live"));
            }
            runs.free.push(f);
        }
        s.done()?;
        let mut s = r.section(tag::MEMBERS)?;
        for (r, &c) in counts.iter().enumerate() {
            let mut members = Members::with_capacity(c.min(4096));
            for _ in 0..c {
                members.push(Member { holder: s.u32()?, stamp: s.u32()? });
            }
            runs[r as u32].members = members;
        }
        s.done()?;
        Ok(runs)
    }
}
