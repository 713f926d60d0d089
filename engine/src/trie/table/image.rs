//! A table in a checkpoint image: 256 sections, one per part, its slots as they are in memory
//! (so reading is one pass of copying and checking, no rehash), and the reading of format 1's
//! 8-byte slots. Every count and index is checked before the table is used.

use super::{fits, in_probe_order, rehash_into, NodeTable, Slot, TablePart, EMPTY, PARTS};
use crate::image_format::{put_u64, tag, ImageError, ImageReader, ImageWriter};

impl NodeTable {
    /// Image sections: one per part (its entry count and slots, as in memory: node `u32`,
    /// tag's high `u16`, tag's low byte).
    pub(crate) fn write_image(&self, w: &mut ImageWriter) -> std::io::Result<()> {
        for s in 0..PARTS {
            let empty = TablePart::new(s);
            let pt = self.parts.get(s).unwrap_or(&empty);
            w.section(tag::TABLE, |b| {
                put_u64(b, pt.len as u64);
                put_u64(b, pt.slots.len() as u64);
                b.reserve(pt.slots.len() * 7);
                for s in pt.slots.iter() {
                    let (node, hi, lo) = (s.node, s.tag_hi, s.tag_lo);
                    b.extend_from_slice(&node.to_le_bytes());
                    b.extend_from_slice(&hi.to_le_bytes());
                    b.push(lo);
                }
            })?;
        }
        Ok(())
    }

    /// Reads what [`Self::write_image`] wrote. Returns the table and the largest index it
    /// stores (0 if none), for the caller to check against what the indices refer to. A
    /// format 1 image's parts (8-byte slots with 32 hash bits, power-of-two capacities,
    /// entries placed by a mask) are laid out again as this format would hold their entries.
    pub(crate) fn read_image(r: &mut ImageReader) -> Result<(Self, u32), ImageError> {
        let v1 = r.format() == 1;
        let size = if v1 { 8 } else { 7 };
        let mut parts = Vec::with_capacity(PARTS);
        let mut max = 0u32;
        for index in 0..PARTS {
            let mut s = r.section(tag::TABLE)?;
            let len = s.u64()? as usize;
            let cap = s.count(size)?;
            // At least one free slot, or a probe for a missing key would never end.
            let sized = (len == 0 || len < cap)
                && if v1 {
                    (cap == 0 || cap.is_power_of_two()) && len <= cap * 7 / 10 + 1
                } else {
                    fits(len, cap)
                };
            if !sized {
                return Err(s.invalid("table part size out of range"));
            }
            // One pass over the bytes: slots copied, entries counted, the largest index, and
            // no free slot with a tag (branch-free, so the compiler vectorises it).
            let mut slots = vec![EMPTY; cap].into_boxed_slice();
            let (mut used, mut stray) = (0usize, false);
            for (d, b) in slots.iter_mut().zip(s.bytes(cap * size)?.chunks_exact(size)) {
                let node = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
                let (hi, lo) = if v1 {
                    // Format 1 kept the part-local hash's 32 bits: the tag is its bits 8..32.
                    (u16::from_le_bytes(b[6..].try_into().expect("2 bytes")), b[5])
                } else {
                    (u16::from_le_bytes(b[4..6].try_into().expect("2 bytes")), b[6])
                };
                *d = Slot { node, tag_hi: hi, tag_lo: lo };
                used += usize::from(node != 0);
                stray |= (node == 0) & (b[4..].iter().any(|&x| x != 0));
                max = max.max(node);
            }
            s.done()?;
            if used != len || stray {
                return Err(ImageError::Invalid {
                    tag: tag::TABLE,
                    what: "table entry count or index out of range",
                });
            }
            if !v1 && !in_probe_order(&slots) {
                return Err(ImageError::Invalid {
                    tag: tag::TABLE,
                    what: "table entries out of probe order",
                });
            }
            let mut part = TablePart { slots, len, ..TablePart::new(index) };
            if v1 {
                // Re-laid out at this format's capacity for its entries.
                let old = std::mem::take(&mut part.slots);
                if len > 0 {
                    part.reserve(len);
                    rehash_into(&old, &mut part.slots);
                }
            }
            parts.push(part);
        }
        if parts.iter().all(|s| s.slots.is_empty()) {
            parts = Vec::new();
        }
        Ok((Self { parts, ahead: Vec::new() }, max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image_format::SectionChecks;
    use crate::trie::table::slot;

    /// An image whose part has no free slot is refused: a lookup of a missing key would probe
    /// it forever (a full 2-slot part passed the load check before, which allows one entry
    /// of slack).
    #[test]
    fn an_image_with_a_full_part_is_refused() {
        let image = |slots: Vec<Slot>| {
            let mut t = NodeTable::default();
            *t.part_mut(0) = TablePart {
                len: slots.iter().filter(|s| !s.is_empty()).count(),
                slots: slots.into(),
                ..TablePart::new(0)
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
        // Home 0, but after a free slot: a lookup from its home would stop at the free slot.
        assert!(matches!(read(&image(vec![EMPTY, slot(1, 1)])), Err(ImageError::Invalid { .. })));
        assert!(matches!(read(&image(vec![slot(1, 1), slot(2, 2)])), Err(ImageError::Invalid { .. })));
        assert!(matches!(read(&image(vec![slot(1, 1)])), Err(ImageError::Invalid { .. })));
    }
}
