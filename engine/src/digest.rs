//! Hash mixing for node identity, table lookups and digests.
//!
//! Digests are sums (mod 2^64) of well-mixed per-block terms: order independent, O(1) to
//! update on insert and remove, and bound to a block's position because a block's term is
//! derived from the chained hash of every local hash on its path from the root.

use crate::types::{HolderKey, Tier};

/// The path hash of the (virtual) root.
pub const ROOT_PATH: u64 = 0x243f_6a88_85a3_08d3;
const INFERRED_SALT: u64 = 0x1319_8a2e_0370_7344;
/// Mixed into the key term of a holder on a tier other than the GPU.
const TIER_SALT: u64 = 0xa409_3822_299f_31d0;

/// murmur3's 64-bit finaliser.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The inverse of [`mix64`]: `unmix64(mix64(x)) == x`. Lets a run walk path hashes from its
/// last block towards its first (see [`parent_path`]).
#[inline]
pub fn unmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0x9cb4_b2f8_1293_37db); // inverse of 0xc4ce_b9fe_1a85_ec53 mod 2^64
    x ^= x >> 33;
    x = x.wrapping_mul(0x4f74_430c_22a5_4005); // inverse of 0xff51_afd7_ed55_8ccd mod 2^64
    x ^ (x >> 33)
}

/// 64×64→128 multiply folded to 64 bits: a fast, well-distributed table hash.
#[inline]
pub fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// Chained path hash of a child from its parent's path hash and its local hash.
#[inline]
pub fn child_path(parent_path: u64, local: u64) -> u64 {
    mix64(parent_path.rotate_left(23) ^ mix64(local ^ 0x0a40_9382_2299_f31d))
}

/// The parent's path hash from a child's path hash and the child's local hash: the inverse
/// of [`child_path`] (runs keep only their end paths and walk to any block from either end).
#[inline]
pub fn parent_path(path: u64, local: u64) -> u64 {
    (unmix64(path) ^ mix64(local ^ 0x0a40_9382_2299_f31d)).rotate_right(23)
}

/// The digest term of one held block. Inferred (placement) blocks digest differently from
/// event-fed ones so that the two never compare equal.
#[inline]
pub fn block_term(path: u64, inferred: bool) -> u64 {
    mix64(path ^ if inferred { INFERRED_SALT } else { 0 })
}

/// The term a holder contributes to its keyspace and partition digests. Empty holders
/// contribute nothing, so "no holder" and "an empty holder" digest alike.
#[inline]
pub fn holder_term(key: &HolderKey, blocks: u32, digest: u64) -> u64 {
    if blocks == 0 {
        return 0;
    }
    let mut k = mix64(key.worker ^ mix64((u64::from(key.dp_rank) << 32) | u64::from(key.lane)));
    // GPU holders digest as before tiers existed (old checkpoints' digest points stay valid);
    // another tier's holder never digests like its slot's GPU holder.
    if key.tier != Tier::Gpu {
        k = mix64(k ^ TIER_SALT ^ u64::from(key.tier.code()));
    }
    mix64(k ^ digest.rotate_left(7) ^ u64::from(blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_walk_both_ways() {
        let mut p = ROOT_PATH;
        for i in 0..1000u64 {
            let local = mix64(i) ^ i;
            let c = child_path(p, local);
            assert_eq!(unmix64(mix64(c)), c);
            assert_eq!(parent_path(c, local), p);
            p = c;
        }
    }
}
