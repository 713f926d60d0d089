//! The engine image: a keyspace's in-memory layout written out as checksummed sections, so a
//! restore is bulk copies of arrays instead of a node-by-node rebuild.
//!
//! A dump ([`crate::KeyspaceDump`]) is the portable, canonical form (one node per block
//! position, independent of how the trie is cut into runs); an image is the fast one: the
//! block arrays, the runs, both lookup tables and the holders exactly as they are in memory,
//! so the restored keyspace is the same state, layout included, and evolves identically.
//!
//! Layout and checks: see `image_format`. Every section's checksum is verified before it is
//! decoded, and every reference read (block, run and holder ids) is checked to be in range, so
//! a corrupt or truncated image is refused with an [`ImageError`], never a panic. Internal
//! consistency beyond that (what a bug rather than a flipped bit would break) is what
//! [`crate::Keyspace::check_invariants`] proves, in a full pass, for callers that want it.

use std::io;

pub use crate::image_format::ImageError;
use crate::image_format::{put_u32, put_u64, tag, ImageReader, ImageWriter, SectionChecks};
use crate::keyspace::holders::Holders;
use crate::keyspace::Keyspace;
use crate::partition::partition_of;
use crate::trie::blocks::{Blocks, CHUNK_BITS};
use crate::trie::runs::Runs;
use crate::trie::table::NodeTable;
use crate::trie::{Trie, NIL, ROOT};
use crate::types::{EngineConfig, KeyspaceId, KeyspaceStats};

/// Images at least this large are decoded by two threads (below it a thread costs more than
/// it saves).
const PARALLEL_FROM: usize = 4 << 20;

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
