//! The section format of engine images: tags, the writer, the reader and [`ImageError`].
//!
//! Layout: the magic `PLXIMG\0` and a format byte, then sections `[tag u32][len u64][xxh3-64
//! u64][bytes]` in a fixed order, all integers little-endian, ending with an `END` section.
//! Format 3 (written now) is format 2 with a holder's storage tier in its flag byte (older
//! images hold GPU holders only, their tier bits 0). Format 2 places table entries by scaling
//! their hash bits to any capacity;
//! format 1 images (power-of-two tables, entries placed by a mask) are still read, their
//! tables re-placed as they load. Each structure
//! that an image holds (blocks, runs, tables, holders) writes and reads its own sections with
//! these; `image` puts them in order for a whole keyspace. It sits below all of them, so the
//! structures and the image that gathers them do not import each other.

use std::io;
use xxhash_rust::xxh3::xxh3_64;

/// The magic of the format written: `PLXIMG\0` and the format byte.
const MAGIC: &[u8; 8] = b"PLXIMG\x00\x03";
/// Formats read: the current one and formats 1 and 2 (see the module doc).
const FORMATS: [u8; 3] = [1, 2, 3];

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
