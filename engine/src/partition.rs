//! Which log partition a worker's records live in: a cross-language contract.
//!
//! Publishers in every language key a worker's records by worker and send them to
//! `partition_of(worker, partitions)`; replicas group holders by the same function for their
//! per-partition digests and for partition-level repair. A change here silently splits one
//! worker's records over two partitions (breaking per-worker ordering) and makes every digest
//! comparison against older replicas and checkpoints fail, so the value must **never change**.
//! The golden vectors in `python/golden_vectors.json` (key `"partition_of"`) pin it for every
//! implementation.
//!
//! It has its own copy of murmur3's fmix64 on purpose: the engine's digest mixer
//! ([`crate::digest::mix64`]) is free to evolve with the digest scheme's versioning, this is not.

/// The partition salt: "prefixlo" as a big-endian u64.
const SALT: u64 = 0x7072_6566_6978_6c6f;

/// murmur3's 64-bit finaliser (fmix64). Part of the contract; never change it.
#[inline]
const fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The partition a worker's records live in:
/// `fmix64(worker ^ 0x7072656669786c6f) % max(partitions, 1)`.
pub const fn partition_of(worker: u64, partitions: u32) -> u32 {
    let n = if partitions == 0 { 1 } else { partitions as u64 };
    (fmix64(worker ^ SALT) % n) as u32
}

/// The workers and partition counts of the golden vectors (`python/golden_vectors.json`).
#[cfg(test)]
pub(crate) const GOLDEN_WORKERS: [u64; 11] = [
    0,
    1,
    2,
    255,
    1 << 32,
    1 << 63,
    u64::MAX,
    0x9E37_79B9_7F4A_7C15,
    0xDEAD_BEEF_CAFE_BABE,
    12_345_678_901_234_567_890,
    7_000_000_007,
];
#[cfg(test)]
pub(crate) const GOLDEN_PARTITIONS: [u32; 6] = [1, 2, 3, 16, 64, 1000];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `{"worker", "partitions", "partition"}` entry of the shared golden file agrees.
    #[test]
    fn golden_vectors_agree() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/golden_vectors.json");
        let text = std::fs::read_to_string(&path).expect("python/golden_vectors.json exists");
        let json: serde_json::Value = serde_json::from_str(&text).expect("golden vectors are JSON");
        let cases = json["partition_of"].as_array().expect("a \"partition_of\" list");
        assert!(cases.len() >= GOLDEN_WORKERS.len() * GOLDEN_PARTITIONS.len());
        for c in cases {
            let worker = c["worker"].as_u64().expect("worker is a u64");
            let partitions = u32::try_from(c["partitions"].as_u64().expect("partitions")).unwrap();
            let want = c["partition"].as_u64().expect("partition");
            assert_eq!(
                u64::from(partition_of(worker, partitions)),
                want,
                "worker {worker}, {partitions} partitions"
            );
        }
    }

    /// Pinned values independent of the file, so a change to both cannot slip through.
    #[test]
    fn pinned_values() {
        assert_eq!(partition_of(0, 0), 0);
        assert_eq!(partition_of(12345, 1), 0);
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
        assert_eq!([partition_of(0, 16), partition_of(0, 1000)], [8, 968]);
        assert_eq!([partition_of(255, 16), partition_of(255, 1000)], [1, 265]);
    }

    /// The digest mixer is currently the same function; the partition function must not move
    /// if it ever changes, which this copy guarantees.
    #[test]
    fn same_function_as_the_historic_mixer() {
        for w in GOLDEN_WORKERS {
            assert_eq!(fmix64(w), crate::digest::mix64(w));
        }
    }
}
