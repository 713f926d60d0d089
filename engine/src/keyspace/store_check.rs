//! Refusing stores that cannot be a chain: an ext hash named twice, or the parent named among
//! the stored blocks (`parent 100 → [(100,1),(200,2),(300,3)]` would otherwise be stored as
//! the chain `[1,1,2,3]` and credited depth 4).
//!
//! [`crate::Engine::store`] checks the whole list before splitting it into
//! `max_blocks_per_lock` chunks (a chunk alone cannot see a repeat in another chunk), and
//! [`crate::Keyspace::store`] checks what it is given. The common store is small, so below
//! [`QUADRATIC_UP_TO`] blocks the check compares pairs (no allocation, no hashing); above, it
//! inserts into a scratch open-addressing set sized for the list.

use crate::digest::fold_mul;
use crate::types::{BlockHashes, InvalidStoreReason};

/// Up to this many blocks, comparing every pair is cheaper than building a set.
const QUADRATIC_UP_TO: usize = 32;

/// Checks that `blocks` can be a chain under `parent`. `scratch` is reused between calls.
pub(crate) fn check_store(
    parent: Option<u64>,
    blocks: &[BlockHashes],
    scratch: &mut Vec<u64>,
) -> Result<(), InvalidStoreReason> {
    if let Some(p) = parent {
        if blocks.iter().any(|b| b.ext == p) {
            return Err(InvalidStoreReason::ParentInStore(p));
        }
    }
    let repeat = if blocks.len() <= QUADRATIC_UP_TO {
        repeat_by_pairs(blocks)
    } else {
        repeat_by_set(blocks, scratch)
    };
    repeat.map_or(Ok(()), |e| Err(InvalidStoreReason::RepeatedExt(e)))
}

/// The first ext (in list order of its second occurrence) that appears twice.
fn repeat_by_pairs(blocks: &[BlockHashes]) -> Option<u64> {
    for (i, b) in blocks.iter().enumerate().skip(1) {
        if blocks[..i].iter().any(|a| a.ext == b.ext) {
            return Some(b.ext);
        }
    }
    None
}

/// The same answer as [`repeat_by_pairs`], in linear time: linear probing over a power-of-two
/// table at most half full. Slots hold `ext`, with a separate flag for the one value (0) that
/// marks an empty slot.
fn repeat_by_set(blocks: &[BlockHashes], table: &mut Vec<u64>) -> Option<u64> {
    let cap = (blocks.len() * 2).next_power_of_two();
    table.clear();
    table.resize(cap, 0);
    let mask = cap - 1;
    let mut seen_zero = false;
    for &BlockHashes { ext, .. } in blocks {
        if ext == 0 {
            if std::mem::replace(&mut seen_zero, true) {
                return Some(0);
            }
            continue;
        }
        let mut i = (fold_mul(ext, 0x9e37_79b9_7f4a_7c15) as usize) & mask;
        loop {
            match table[i] {
                0 => {
                    table[i] = ext;
                    break;
                }
                e if e == ext => return Some(ext),
                _ => i = (i + 1) & mask,
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(exts: &[u64]) -> Vec<BlockHashes> {
        exts.iter().map(|&e| BlockHashes::new(e, e ^ 1)).collect()
    }

    #[test]
    fn refuses_repeats_and_parent_in_store() {
        let mut s = Vec::new();
        assert_eq!(check_store(None, &blocks(&[1, 2, 3]), &mut s), Ok(()));
        assert_eq!(check_store(Some(9), &blocks(&[]), &mut s), Ok(()));
        assert_eq!(
            check_store(Some(100), &blocks(&[100, 200, 300]), &mut s),
            Err(InvalidStoreReason::ParentInStore(100))
        );
        assert_eq!(check_store(None, &blocks(&[5, 6, 5]), &mut s), Err(InvalidStoreReason::RepeatedExt(5)));
    }

    /// The set path agrees with the pairwise one on long lists, including ext 0 and clusters.
    #[test]
    fn set_and_pairs_agree() {
        let mut s = Vec::new();
        let mut x = 7u64;
        for n in [33usize, 64, 100, 1000] {
            for round in 0..50u64 {
                let mut exts: Vec<u64> = (0..n as u64)
                    .map(|i| {
                        x = crate::digest::mix64(x + i);
                        if round % 5 == 0 {
                            x % 64
                        } else {
                            x
                        }
                    })
                    .collect();
                if round % 3 == 0 {
                    exts[n - 1] = exts[round as usize % (n - 1)];
                }
                let b = blocks(&exts);
                assert_eq!(repeat_by_set(&b, &mut s), repeat_by_pairs(&b), "n {n} round {round}");
            }
        }
    }
}
