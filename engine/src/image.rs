//! The engine image: a keyspace's in-memory layout written out as checksummed sections, so a
//! restore is bulk copies of arrays instead of a node-by-node rebuild.
//!
//! A dump ([`crate::KeyspaceDump`]) is the portable, canonical form (one node per block
//! position, independent of how the trie is cut into runs); an image is the fast one: the
//! block arrays, the runs, both lookup tables and the holders exactly as they are in memory,
//! so the restored keyspace is the same state, layout included, and evolves identically.
//!
//! Layout: the magic `PLXIMG\0` and a format byte, then sections `[tag u32][len u64][xxh3-64
//! u64][bytes]` in a fixed order, all integers little-endian, ending with an `END` section.
//! Format 2 (written now) places table entries by scaling their hash bits to any capacity;
//! format 1 images (power-of-two tables, entries placed by a mask) are still read, their
//! tables re-placed as they load. Every
//! section's checksum is verified before it is decoded, and every reference read (block, run
//! and holder ids) is checked to be in range, so a corrupt or truncated image is refused with
//! an [`ImageError`], never a panic. Internal consistency beyond that (what a bug rather than
//! a flipped bit would break) is what [`crate::Keyspace::check_invariants`] proves, in a full
//! pass, for callers that want it.

use std::io;
use xxhash_rust::xxh3::xxh3_64;

/// The magic of the format written: `PLXIMG\0` and the format byte.
pub(crate) const MAGIC: &[u8; 8] = b"PLXIMG\x00\x02";
/// Formats read: the current one and format 1 (see the module doc).
const FORMATS: [u8; 2] = [1, 2];

/// Images at least this large are decoded by two threads (below it a thread costs more than
/// it saves).
const PARALLEL_FROM: usize = 4 << 20;

/// Section tags, in image order.
pub(crate) mod tag {
    pub const HEADER: u32 = 1;
    pub const BLOCKS: u32 = 2;
    pub const LOCALS: u32 = 3;
    pub const META: u32 = 4;
    pub const ANCHORS: u32 = 5;
    pub const RUNS: u32 = 6;
    pub const MEMBERS: u32 = 7;
    pub const TABLE: u32 = 8;
    pub const HOLDERS: u32 = 9;
    pub const END: u32 = 10;
}

/// Why an image was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("not an engine image (bad magic)")]
    BadMagic,
    #[error("image ends inside section {tag}")]
    Truncated { tag: u32 },
    #[error("expected section {want}, found {found}")]
    UnexpectedSection { want: u32, found: u32 },
    #[error("section {tag}: checksum mismatch")]
    Checksum { tag: u32 },
    #[error("section {tag}: {what}")]
    Invalid { tag: u32, what: &'static str },
}

/// Writes sections straight into the output: a header placeholder, the contents, then the
/// header filled in with the length and checksum (no intermediate buffer: an image is as large
/// as the state, and a capture holds ingest still while it is written).
pub(crate) struct ImageWriter<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> ImageWriter<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        let start = out.len();
        out.extend_from_slice(MAGIC);
        Self { out, start }
    }

    pub fn section(&mut self, tag: u32, fill: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        let at = self.out.len();
        self.out.extend_from_slice(&[0u8; 20]);
        fill(self.out);
        let data = &self.out[at + 20..];
        let (len, sum) = (data.len() as u64, xxh3_64(data));
        let head = &mut self.out[at..at + 20];
        head[..4].copy_from_slice(&tag.to_le_bytes());
        head[4..12].copy_from_slice(&len.to_le_bytes());
        head[12..].copy_from_slice(&sum.to_le_bytes());
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        (self.out.len() - self.start) as u64
    }
}

pub(crate) fn put_u32(b: &mut Vec<u8>, v: u32) {
    b.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(b: &mut Vec<u8>, v: u64) {
    b.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64s(b: &mut Vec<u8>, v: &[u64]) {
    let start = b.len();
    b.resize(start + v.len() * 8, 0);
    for (d, x) in b[start..].chunks_exact_mut(8).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

/// One section as laid out in an image: tag, bytes, stored checksum (verified when read).
struct RawSection<'a> {
    tag: u32,
    data: &'a [u8],
    sum: u64,
}

/// Reads sections from an image held in memory. The section headers are walked once up front,
/// so the image can be split and its two halves decoded (and checksummed) by two threads.
pub(crate) struct ImageReader<'a> {
    sections: Vec<RawSection<'a>>,
    next: usize,
    checks: SectionChecks,
    /// The image's format byte.
    format: u8,
}

/// Whether a reader verifies each section's checksum as it reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SectionChecks {
    /// Every section's checksum is verified (bytes of unknown provenance).
    Verify,
    /// The caller verified every byte of the image end to end before reading it (a checkpoint
    /// store's chunk checksums): the sections are not hashed a second time. Every size, count
    /// and id is still range-checked, so a malformed image is refused, never a panic.
    VerifiedByCaller,
}

impl<'a> ImageReader<'a> {
    pub fn new(bytes: &'a [u8], checks: SectionChecks) -> Result<Self, ImageError> {
        let n = MAGIC.len();
        if bytes.len() < n || bytes[..n - 1] != MAGIC[..n - 1] || !FORMATS.contains(&bytes[n - 1]) {
            return Err(ImageError::BadMagic);
        }
        let format = bytes[n - 1];
        let (mut sections, mut pos) = (Vec::new(), MAGIC.len());
        while pos < bytes.len() {
            let le = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
            let tag =
                bytes.get(pos..pos + 4).map_or(0, |t| u32::from_le_bytes(t.try_into().expect("4 bytes")));
            let head = bytes.get(pos..pos + 20).ok_or(ImageError::Truncated { tag })?;
            let (len, sum) = (le(&head[4..12]), le(&head[12..]));
            let start = pos + 20;
            let end =
                usize::try_from(len).ok().and_then(|l| start.checked_add(l)).filter(|&e| e <= bytes.len());
            let end = end.ok_or(ImageError::Truncated { tag })?;
            sections.push(RawSection { tag, data: &bytes[start..end], sum });
            pos = end;
        }
        Ok(Self { sections, next: 0, checks, format })
    }

    /// The image's format byte (see the module doc).
    pub fn format(&self) -> u8 {
        self.format
    }

    /// The next section, which must carry `want`, checksum verified.
    pub fn section(&mut self, want: u32) -> Result<Section<'a>, ImageError> {
        let raw = self.sections.get(self.next).ok_or(ImageError::Truncated { tag: want })?;
        if raw.tag != want {
            return Err(ImageError::UnexpectedSection { want, found: raw.tag });
        }
        if self.checks == SectionChecks::Verify && xxh3_64(raw.data) != raw.sum {
            return Err(ImageError::Checksum { tag: want });
        }
        self.next += 1;
        Ok(Section { data: raw.data, pos: 0, tag: want })
    }

    /// Splits off the sections from the next one tagged `at` onwards, as a reader of their
    /// own (empty if there is none); this reader keeps the ones before.
    pub fn split_off_at(&mut self, at: u32) -> ImageReader<'a> {
        let i = self.sections[self.next..]
            .iter()
            .position(|s| s.tag == at)
            .map_or(self.sections.len(), |i| self.next + i);
        ImageReader {
            sections: self.sections.split_off(i),
            next: 0,
            checks: self.checks,
            format: self.format,
        }
    }

    /// Fails unless every section was read.
    pub fn done(self) -> Result<(), ImageError> {
        match self.sections.get(self.next) {
            None => Ok(()),
            Some(s) => Err(ImageError::Invalid { tag: s.tag, what: "a section after the last expected" }),
        }
    }

    /// The `END` section, and nothing after it.
    pub fn finish(mut self) -> Result<(), ImageError> {
        self.section(tag::END)?.done()?;
        self.done()
    }
}

/// The verified bytes of one section, read front to back.
pub(crate) struct Section<'a> {
    data: &'a [u8],
    pos: usize,
    pub tag: u32,
}

impl<'a> Section<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ImageError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or(ImageError::Invalid { tag: self.tag, what: "shorter than its contents" })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub fn u32(&mut self) -> Result<u32, ImageError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, ImageError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A count of items of `size` bytes each, checked against what is left (so a corrupt
    /// count cannot make a reader allocate without bound).
    pub fn count(&mut self, size: usize) -> Result<usize, ImageError> {
        let n = self.u64()?;
        let fits = usize::try_from(n).ok().filter(|&n| n.saturating_mul(size) <= self.data.len() - self.pos);
        fits.ok_or(ImageError::Invalid { tag: self.tag, what: "count larger than the section" })
    }

    /// Fills `dst` from the next `8 * dst.len()` bytes.
    pub fn u64s_into(&mut self, dst: &mut [u64]) -> Result<(), ImageError> {
        let src = self.take(dst.len() * 8)?;
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(8)) {
            *d = u64::from_le_bytes(s.try_into().expect("8 bytes"));
        }
        Ok(())
    }

    /// The next `n` bytes, raw.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ImageError> {
        self.take(n)
    }

    pub fn invalid(&self, what: &'static str) -> ImageError {
        ImageError::Invalid { tag: self.tag, what }
    }

    /// Fails unless every byte was read.
    pub fn done(self) -> Result<(), ImageError> {
        if self.pos == self.data.len() {
            Ok(())
        } else {
            Err(self.invalid("longer than its contents"))
        }
    }
}

use crate::blocks::{Blocks, CHUNK_BITS};
use crate::holder::Holders;
use crate::keyspace::Keyspace;
use crate::partition::partition_of;
use crate::runs::Runs;
use crate::table::NodeTable;
use crate::trie::{Trie, NIL, ROOT};
use crate::types::{EngineConfig, KeyspaceId, KeyspaceStats};

impl Keyspace {
    /// Writes the keyspace as an image (see the `image` module): its block storage, runs,
    /// lookup tables and holders in their in-memory layout, each section checksummed.
    /// Returns the bytes written. [`Keyspace::read_image`] restores it with bulk copies.
    pub fn write_image(&self, out: &mut Vec<u8>) -> io::Result<u64> {
        let mut w = ImageWriter::new(out);
        w.section(tag::HEADER, |b| {
            put_u64(b, self.id.model.len() as u64);
            b.extend_from_slice(self.id.model.as_bytes());
            put_u32(b, self.id.block_size);
            put_u32(b, self.id.scheme);
            self.stats.to_fields().iter().for_each(|&v| put_u64(b, v));
        })?;
        self.trie.blocks.write_image(&mut w)?;
        self.trie.runs.write_image(&mut w)?;
        self.trie.edges.write_image(&mut w)?;
        self.trie.exts.write_image(&mut w)?;
        self.holders.write_image(&mut w)?;
        w.section(tag::END, |_| {})?;
        Ok(w.written())
    }

    /// Restores a keyspace from [`Keyspace::write_image`]'s bytes: the same state, layout
    /// included, so it answers, digests and evolves exactly like the keyspace written (and
    /// like `rebuild(dump())` of it). Holders are filed into partitions under `cfg`, as
    /// rebuild does. A corrupt or truncated image is refused ([`ImageError`]), never a panic.
    pub fn read_image(bytes: &[u8], cfg: EngineConfig) -> Result<Keyspace, ImageError> {
        Self::read_image_with(bytes, cfg, SectionChecks::Verify)
    }

    /// [`Keyspace::read_image`] of bytes whose every byte the caller has verified (a
    /// checkpoint store checksums each chunk as it lands): the section checksums are not
    /// computed again, which is a pass over the whole image less. Everything else is checked.
    pub fn read_verified_image(bytes: &[u8], cfg: EngineConfig) -> Result<Keyspace, ImageError> {
        Self::read_image_with(bytes, cfg, SectionChecks::VerifiedByCaller)
    }

    fn read_image_with(
        bytes: &[u8],
        cfg: EngineConfig,
        checks: SectionChecks,
    ) -> Result<Keyspace, ImageError> {
        let mut r = ImageReader::new(bytes, checks)?;
        let mut s = r.section(tag::HEADER)?;
        let model_len = s.count(1)?;
        let model = std::str::from_utf8(s.bytes(model_len)?).map_err(|_| s.invalid("model is not UTF-8"))?;
        let id = KeyspaceId::new(model, s.u32()?, s.u32()?);
        let mut f = [0u64; 7];
        for v in &mut f {
            *v = s.u64()?;
        }
        s.done()?;
        // Two halves decoded at once: block storage and runs; lookup tables and holders.
        let mut back = r.split_off_at(tag::TABLE);
        let front = move || -> Result<_, ImageError> {
            let (blocks, max_block_run) = Blocks::read_image(&mut r)?;
            let runs = Runs::read_image(&mut r)?;
            r.done()?;
            if max_block_run >= runs.slots() {
                return Err(ImageError::Invalid { tag: tag::META, what: "block in a run out of range" });
            }
            Ok((blocks, runs))
        };
        let partitions = cfg.partitions;
        let back = move || -> Result<_, ImageError> {
            let edges = NodeTable::read_image(&mut back)?;
            let exts = NodeTable::read_image(&mut back)?;
            let holders = Holders::read_image(&mut back, |w| partition_of(w, partitions))?;
            back.finish()?;
            Ok((edges, exts, holders))
        };
        let (front, back) = if bytes.len() < PARALLEL_FROM {
            (front(), back())
        } else {
            std::thread::scope(|s| {
                let back = s.spawn(back);
                (front(), back.join().expect("decoding an image half panicked"))
            })
        };
        let ((blocks, runs), ((edges, max_run), (exts, max_block), holders)) = (front?, back?);
        if max_run >= runs.slots() || max_block >= blocks.top() {
            return Err(ImageError::Invalid {
                tag: tag::TABLE,
                what: "table entry count or index out of range",
            });
        }
        check_references(&blocks, &runs, &holders)?;
        let mut ks = Keyspace::new(id, cfg);
        ks.trie = Trie::from_parts(blocks, runs, edges, exts);
        ks.holders = holders;
        ks.stats = KeyspaceStats::from_fields(f);
        ks.recompute_aggregates();
        Ok(ks)
    }
}

/// Every run and holder id an image holds is in range (blocks' run ids are checked as they
/// are decoded), so no later operation indexes out of bounds.
fn check_references(blocks: &Blocks, runs: &Runs, holders: &Holders) -> Result<(), ImageError> {
    let bad = |tag, what| Err(ImageError::Invalid { tag, what });
    let (top, slots) = (blocks.top(), runs.slots());
    let root = &runs[ROOT];
    if !root.live() || (root.start, root.len) != (0, 1) {
        return bad(tag::RUNS, "no root run");
    }
    for r in 0..slots {
        let run = &runs[r];
        if !run.live() {
            continue;
        }
        let end = u64::from(run.start) + u64::from(run.cap);
        let fits = run.len >= 1
            && run.cap >= run.len
            && end <= u64::from(top)
            && run.start >> CHUNK_BITS == (end as u32 - 1) >> CHUNK_BITS
            && run.parent < top
            && (run.first_child == NIL || run.first_child < slots);
        if !fits {
            return bad(tag::RUNS, "run range or link out of range");
        }
        if run.members.iter().any(|m| holders.slots.get(m.holder as usize).is_none_or(Option::is_none)) {
            return bad(tag::MEMBERS, "member holder out of range");
        }
    }
    for h in holders.slots.iter().flatten() {
        if h.records.iter().any(|r| r.leaf >= top || r.leaf == 0) || h.overrides.values().any(|&b| b >= top) {
            return bad(tag::HOLDERS, "record or override block out of range");
        }
    }
    Ok(())
}
