//! Upstream worker names → prefixlog worker ids.
//!
//! Upstream protocols name workers with strings; prefixlog's records carry a u64. A facade
//! hashes the name with XXH3-64 seeded per protocol (so two protocols' names never share an id
//! by construction of the same string), records the name in the worker's `WorkerAdded`
//! metadata and refuses a name whose id is already recorded for another name: two workers are
//! never merged into one (that would credit one with the other's blocks).

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The seed of SGLang worker names: the ASCII bytes `sglworkr` as a big-endian u64.
pub const SGLANG_SEED: u64 = u64::from_be_bytes(*b"sglworkr");

/// The seed of SMG holder names: the ASCII bytes `smgholdr` as a big-endian u64.
pub const SMG_SEED: u64 = u64::from_be_bytes(*b"smgholdr");

/// The worker id of `name` under a protocol's `seed`.
pub fn worker_id(seed: u64, name: &str) -> u64 {
    xxh3_64_with_seed(name.as_bytes(), seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_seeded() {
        // Pinned: a changed id would orphan every worker a running fleet recorded.
        assert_eq!(SGLANG_SEED, 0x73676c776f726b72);
        assert_eq!(worker_id(SGLANG_SEED, "w0"), worker_id(SGLANG_SEED, "w0"));
        assert_ne!(worker_id(SGLANG_SEED, "w0"), worker_id(SGLANG_SEED, "w1"));
        assert_ne!(worker_id(SGLANG_SEED, "w0"), worker_id(0, "w0"));
        assert_eq!(SMG_SEED, 0x736d67686f6c6472);
        assert_ne!(worker_id(SMG_SEED, "w0"), worker_id(SGLANG_SEED, "w0"));
    }
}
