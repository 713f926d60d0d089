//! Canonical block hash schemes: how a prompt's token ids become the *local* hashes a keyspace
//! is keyed by. Implemented once here; gateways in other languages reproduce it from the golden
//! vectors in `python/golden_vectors.json` (checked by this module's tests and by the Python
//! client's tests), so every language computes bit-identical hashes.
//!
//! Scheme 1 ([`SCHEME_XXH3_CHAINED`]): a prompt is cut into blocks of `block_size` tokens; the
//! hash of block `i` is `xxh3_64_with_seed(bytes(block_i), seed = hash(block_{i-1}))`, with
//! seed 0 for block 0, where `bytes` is the block's token ids as u32 little-endian. Chaining
//! through the seed makes a block's hash depend on its whole prefix (the same tokens after a
//! different prefix are a different block), exactly as engines' prefix caches behave. A
//! trailing partial block is not hashed: engines only cache full blocks.
//!
//! Namespaces: blocks computed under a LoRA adapter hold different KV for the same tokens, so
//! they must never match the base model's. A namespaced chain starts from
//! [`namespace_seed`] (xxh3-64 of the namespace's UTF-8 bytes) instead of 0 — the same idea as
//! Dynamo's salted seed — and every later block inherits it through the chaining. The empty
//! namespace is the plain scheme.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Scheme id 1: xxh3-64 of each full block's u32-LE token bytes, seeded with the parent hash.
pub const SCHEME_XXH3_CHAINED: u32 = 1;

/// Whether this build can hash token ids under `scheme`.
pub fn is_known(scheme: u32) -> bool {
    scheme == SCHEME_XXH3_CHAINED
}

/// The local hashes of every full block of `tokens` under scheme 1. `block_size` 0 gives none.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    block_hashes_after(0, tokens, block_size)
}

/// Seed of a namespaced chain's first block: 0 for the empty namespace (the plain scheme),
/// else xxh3-64 of the namespace's UTF-8 bytes (seed [`NAMESPACE_SEED`]).
pub fn namespace_seed(namespace: &str) -> u64 {
    if namespace.is_empty() {
        0
    } else {
        xxh3_64_with_seed(namespace.as_bytes(), NAMESPACE_SEED)
    }
}

/// The xxh3 seed [`namespace_seed`] hashes namespace names with ("prefixns" in ASCII).
pub const NAMESPACE_SEED: u64 = u64::from_be_bytes(*b"prefixns");

/// [`block_hashes`] of a prompt under a namespace (e.g. a LoRA adapter's name).
pub fn block_hashes_in(namespace: &str, tokens: &[u32], block_size: usize) -> Vec<u64> {
    block_hashes_after(namespace_seed(namespace), tokens, block_size)
}

/// Like [`block_hashes`], for blocks that continue a chain whose last block hashed to `parent`
/// (0 = the start of the prompt). Bridges use it for stores under an existing parent.
pub fn block_hashes_after(parent: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    // Sized by the tokens present: `block_size` comes from requests and records, and a huge
    // one must not reserve memory for a block that cannot be filled.
    let mut bytes = Vec::with_capacity(block_size.min(tokens.len()) * 4);
    let mut parent = parent;
    for block in tokens.chunks_exact(block_size) {
        bytes.clear();
        for t in block {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        parent = xxh3_64_with_seed(&bytes, parent);
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block size far beyond the prompt hashes nothing and reserves nothing (it once reserved
    /// `block_size * 4` bytes up front: 17 GB for a request naming block size 2^32 - 1, an
    /// overflow panic beyond that).
    #[test]
    fn a_huge_block_size_hashes_nothing_and_reserves_nothing() {
        for block_size in [u32::MAX as usize, usize::MAX / 2, usize::MAX] {
            assert!(block_hashes_after(0, &[1, 2, 3], block_size).is_empty());
        }
    }

    /// The golden cases: (name, tokens, block size). Shared with other languages through
    /// `python/golden_vectors.json`; changing a hash here is a wire-incompatible change.
    fn cases() -> Vec<(&'static str, Vec<u32>, usize, &'static str)> {
        vec![
            ("empty", vec![], 4, ""),
            ("partial_only", vec![1, 2, 3], 4, ""),
            ("one_block", vec![1, 2, 3, 4], 4, ""),
            ("two_blocks_and_partial", (1..=10).collect(), 4, ""),
            ("large_ids", vec![0, u32::MAX, 151_643, 128_000, 7, 7, 7, 7], 4, ""),
            ("block16", (0..48).map(|i| i * 1_000 + 17).collect(), 16, ""),
            ("lora_namespace", (1..=10).collect(), 4, "sql-adapter"),
            ("unicode_namespace", vec![1, 2, 3, 4], 4, "адаптер-ü"),
        ]
    }

    fn golden_json() -> String {
        let mut s = String::from("{\n  \"scheme\": 1,\n  \"description\": \"local_i = xxh3_64_with_seed(u32-LE bytes of block i, seed = local_{i-1}), seed 0 for block 0 (with a namespace: xxh3_64_with_seed(UTF-8 bytes of the namespace, 0x7072656669786e73)); trailing partial block not hashed\",\n  \"cases\": [\n");
        let cs = cases();
        for (n, (name, tokens, bs, ns)) in cs.iter().enumerate() {
            let toks: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
            let hs: Vec<String> =
                block_hashes_in(ns, tokens, *bs).iter().map(|h| format!("\"{h:016x}\"")).collect();
            let ns_field = if ns.is_empty() { String::new() } else { format!("\"namespace\": \"{ns}\", ") };
            s += &format!(
                "    {{\"name\": \"{name}\", {ns_field}\"block_size\": {bs}, \"tokens\": [{}], \"hashes\": [{}]}}{}\n",
                toks.join(", "),
                hs.join(", "),
                if n + 1 < cs.len() { "," } else { "" }
            );
        }
        s + "  ],\n" + &partition_json() + "}\n"
    }

    /// The `"partition_of"` vectors ([`crate::partition`]), one entry per line.
    fn partition_json() -> String {
        use crate::partition::{partition_of, GOLDEN_PARTITIONS, GOLDEN_WORKERS};
        let rows: Vec<String> = GOLDEN_WORKERS
            .iter()
            .flat_map(|&w| GOLDEN_PARTITIONS.iter().map(move |&n| (w, n)))
            .map(|(w, n)| {
                format!("    {{\"worker\": {w}, \"partitions\": {n}, \"partition\": {}}}", partition_of(w, n))
            })
            .collect();
        format!("  \"partition_of\": [\n{}\n  ]\n", rows.join(",\n"))
    }

    fn golden_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/golden_vectors.json")
    }

    /// Pinned hashes: a change to the scheme must fail here, not silently in production.
    #[test]
    fn pinned_vectors() {
        let h = |t: &[u32], bs| block_hashes(t, bs).iter().map(|h| format!("{h:016x}")).collect::<Vec<_>>();
        assert!(h(&[], 4).is_empty());
        assert!(h(&[1, 2, 3], 4).is_empty());
        assert_eq!(h(&[1, 2, 3, 4], 4), ["6fc1ebd4f4d6ea31"]);
        let ten: Vec<u32> = (1..=10).collect();
        assert_eq!(h(&ten, 4), ["6fc1ebd4f4d6ea31", "e31356ba2da654a2"]);
    }

    /// The JSON file other languages test against (block hashes and `partition_of`) matches this
    /// implementation byte for byte.
    /// `PREFIXLOG_WRITE_GOLDEN=1` rewrites it (only when the case list grows).
    #[test]
    fn golden_file_is_current() {
        let want = golden_json();
        if std::env::var_os("PREFIXLOG_WRITE_GOLDEN").is_some() {
            std::fs::write(golden_path(), &want).unwrap();
        }
        let have = std::fs::read_to_string(golden_path()).expect("python/golden_vectors.json exists");
        assert_eq!(have, want, "python/golden_vectors.json is stale; rerun with PREFIXLOG_WRITE_GOLDEN=1");
    }

    #[test]
    fn chaining_depends_on_prefix() {
        let a = block_hashes(&[1, 2, 9, 9], 2);
        let b = block_hashes(&[3, 4, 9, 9], 2);
        assert_ne!(a[1], b[1], "same block after a different prefix hashes differently");
        assert_eq!(block_hashes(&[1, 2, 9, 9, 5], 2), a, "partial tail ignored");
        assert!(block_hashes(&[1, 2], 0).is_empty());
    }

    #[test]
    fn namespaces_separate_chains() {
        let t: Vec<u32> = (1..=8).collect();
        assert_eq!(block_hashes_in("", &t, 4), block_hashes(&t, 4), "empty namespace = plain scheme");
        let a = block_hashes_in("adapter-a", &t, 4);
        let b = block_hashes_in("adapter-b", &t, 4);
        let plain = block_hashes(&t, 4);
        for i in 0..2 {
            assert!(a[i] != plain[i] && a[i] != b[i] && b[i] != plain[i], "block {i}");
        }
        // A continuation chains from its parent, which already carries the namespace.
        assert_eq!(block_hashes_after(a[0], &t[4..], 4), a[1..]);
    }
}
