//! A table in a checkpoint image: 256 sections, one per part, its slots as they are in memory
//! (so reading is one pass of copying and checking, no rehash), and the reading of format 1's
//! 8-byte slots. Every count and index is checked before the table is used.

use super::{fits, in_probe_order, rehash_into, NodeTable, Slot, TablePart, PARTS};
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
            // The slots copied, then one pass: entries counted, the largest index, and no free
            // slot with a tag.
            let bytes = s.bytes(cap * size)?;
            let slots = if v1 { v1_slots(bytes) } else { slots_from_bytes(bytes) };
            let (used, stray, part_max) = census(&slots);
            max = max.max(part_max);
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

/// A format 2+ part's slots: the image lays them out as memory holds them on a little-endian
/// machine (node `u32`, tag high `u16`, tag low `u8`, packed), so they are copied in bulk.
fn slots_from_bytes(bytes: &[u8]) -> Box<[Slot]> {
    const SIZE: usize = 7;
    const _: () = assert!(std::mem::size_of::<Slot>() == SIZE && std::mem::align_of::<Slot>() == 1);
    assert_eq!(bytes.len() % SIZE, 0, "whole slots");
    let cap = bytes.len() / SIZE;
    if cfg!(target_endian = "little") {
        let mut slots: Vec<Slot> = Vec::with_capacity(cap);
        // SAFETY: `Slot` is `repr(C, packed)` of integers (align 1, no padding), so any 7 bytes
        // are a valid `Slot`, and on a little-endian machine its bytes are the image's; `slots`
        // has room for `cap` of them and `bytes` holds exactly `cap * SIZE` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), slots.as_mut_ptr().cast::<u8>(), cap * SIZE);
            slots.set_len(cap);
        }
        slots.into_boxed_slice()
    } else {
        let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        bytes
            .chunks_exact(SIZE)
            .map(|b| Slot {
                node: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
                tag_hi: u16_at(b, 4),
                tag_lo: b[6],
            })
            .collect()
    }
}

/// A format 1 part's 8-byte slots: the part-local hash's 32 bits were kept, the tag is its bits
/// 8..32.
fn v1_slots(bytes: &[u8]) -> Box<[Slot]> {
    bytes
        .chunks_exact(8)
        .map(|b| Slot {
            node: u32::from_le_bytes(b[..4].try_into().expect("4 bytes")),
            tag_hi: u16::from_le_bytes(b[6..].try_into().expect("2 bytes")),
            tag_lo: b[5],
        })
        .collect()
}

/// (entries, whether a free slot carries a tag, the largest node index) of a part's slots.
fn census(slots: &[Slot]) -> (usize, bool, u32) {
    let (mut used, mut stray, mut max) = (0usize, false, 0u32);
    for s in slots {
        let (node, hi, lo) = (s.node, s.tag_hi, s.tag_lo);
        used += usize::from(node != 0);
        stray |= (node == 0) & ((hi != 0) | (lo != 0));
        max = max.max(node);
    }
    (used, stray, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image_format::SectionChecks;
    use crate::trie::table::{slot, EMPTY};

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
        // Probes wrap: an entry whose home is the last slot may sit in the first, after an
        // entry of that home, but not after a free slot.
        let last = 0xF000_0000; // home 3 of 4 slots
        assert_eq!(read(&image(vec![slot(last, 2), EMPTY, EMPTY, slot(last, 1)])), Ok(2));
        assert!(matches!(
            read(&image(vec![EMPTY, slot(last, 2), EMPTY, slot(last, 1)])),
            Err(ImageError::Invalid { .. })
        ));
    }
}
