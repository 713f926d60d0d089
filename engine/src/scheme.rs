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
//!
//! Extra keys ([`block_hashes_with`]): engines also key a block by inputs that are not token
//! ids — vLLM's `extra_keys` carry multimodal identifiers per block and a `cache_salt` on the
//! first block. Such a block's hashed bytes are its token bytes followed by its *key set*: the
//! distinct keys sorted by their UTF-8 bytes, each written as its byte length (u32 LE) and its
//! bytes. The cache salt is a key of block 0 only (as in vLLM), so it reaches every later block
//! through the chaining; a block without keys hashes exactly as in the plain scheme. The
//! salt is folded as a key rather than into the seed because vLLM's tuple does not tag it: a
//! bridge cannot tell it from a multimodal identifier of block 0, and as a key it need not.
//!
//! Placed inputs and lookahead (vLLM >= 0.34, [`BlockKey`]): a multimodal input is keyed by its
//! identifier *and* its offset from the block's start (the same image at two offsets is two
//! different blocks, as vLLM hashes them), and with the hash lookahead of speculative decoding a
//! block's identity also covers the first tokens after it. Both are tagged keys whose bytes
//! start with 0xFF, a byte no UTF-8 string contains, so no salt or identifier can forge one.

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

/// The namespace inputs of a prompt beyond its token ids, as a gateway names them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Namespace<'a> {
    /// The LoRA adapter's name ("" = base model): the chain's seed ([`namespace_seed`]).
    pub lora: &'a str,
    /// vLLM's `cache_salt` ("" = none): a key of block 0.
    pub cache_salt: &'a str,
    /// Per-block keys (e.g. multimodal identifiers) as (block index, keys). A block may be
    /// named more than once (its keys are merged); blocks past the last full one are ignored.
    pub extra: &'a [(usize, Vec<&'a str>)],
    /// The prompt's multimodal inputs, placed: each block its placeholder tokens overlap gets
    /// the key [`BlockKey::MmAt`] (identifier, offset from the block's start), as vLLM keys it.
    pub mm_inputs: &'a [MmInput<'a>],
    /// vLLM's hash lookahead (`num_hash_lookahead_tokens`, for speculative decoding): each
    /// block's identity also covers the first `lookahead` tokens after it ([`BlockKey::Lookahead`]),
    /// so only blocks followed by that many tokens are hashed.
    pub lookahead: usize,
}

/// A multimodal input of a prompt: its identifier (vLLM's `mm_feature.identifier`) and the
/// position and length of its placeholder tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmInput<'a> {
    pub id: &'a str,
    pub offset: u64,
    pub length: u64,
}

/// One element of a block's key set. Text keys are their UTF-8 bytes; the tagged kinds start
/// with byte 0xFF, which no UTF-8 string contains, so no text (a salt, an identifier) can ever
/// equal a tagged key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKey<'a> {
    /// A multimodal identifier (older vLLM), the cache salt.
    Text(&'a str),
    /// vLLM's `(identifier, offset)`: a multimodal input overlapping the block whose placeholder
    /// starts `offset` tokens after the block's first token (negative: it started before).
    /// Bytes: `0xFF 'm'`, offset as i64 LE, the identifier's UTF-8 bytes.
    MmAt { id: &'a str, offset: i64 },
    /// vLLM's lookahead tokens of the block: the tokens right after it that its hash covers.
    /// Bytes: `0xFF 'l'`, each token as u32 LE.
    Lookahead(&'a [u32]),
}

impl BlockKey<'_> {
    /// The key's bytes in the key set.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            BlockKey::Text(s) => s.as_bytes().to_vec(),
            BlockKey::MmAt { id, offset } => {
                let mut b = Vec::with_capacity(10 + id.len());
                b.extend_from_slice(&[0xFF, b'm']);
                b.extend_from_slice(&offset.to_le_bytes());
                b.extend_from_slice(id.as_bytes());
                b
            }
            BlockKey::Lookahead(tokens) => {
                let mut b = Vec::with_capacity(2 + 4 * tokens.len());
                b.extend_from_slice(&[0xFF, b'l']);
                tokens.iter().for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
                b
            }
        }
    }
}

/// A [`BlockKey`] that owns its data (what a bridge builds from an engine's event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnedBlockKey {
    Text(String),
    MmAt { id: String, offset: i64 },
    Lookahead(Vec<u32>),
}

impl OwnedBlockKey {
    pub fn as_key(&self) -> BlockKey<'_> {
        match self {
            OwnedBlockKey::Text(s) => BlockKey::Text(s),
            OwnedBlockKey::MmAt { id, offset } => BlockKey::MmAt { id, offset: *offset },
            OwnedBlockKey::Lookahead(t) => BlockKey::Lookahead(t),
        }
    }
}

/// The blocks of `tokens` a prompt can be matched by: full blocks, each followed by `lookahead`
/// more tokens (vLLM hashes a block only once its lookahead tokens exist).
pub fn hashable_blocks(tokens: usize, block_size: usize, lookahead: usize) -> usize {
    if block_size == 0 {
        return 0;
    }
    tokens.saturating_sub(lookahead) / block_size
}

/// The local hashes of every hashable block of `tokens` under scheme 1 with namespace inputs
/// (the module doc's rule). With no inputs this is [`block_hashes`].
pub fn block_hashes_with(ns: &Namespace<'_>, tokens: &[u32], block_size: usize) -> Vec<u64> {
    let blocks = hashable_blocks(tokens.len(), block_size, ns.lookahead);
    let mut keys: Vec<Vec<BlockKey<'_>>> = vec![Vec::new(); blocks];
    for (b, ks) in ns.extra.iter().filter(|(b, _)| *b < blocks) {
        keys[*b].extend(ks.iter().map(|k| BlockKey::Text(k)));
    }
    if blocks > 0 && !ns.cache_salt.is_empty() {
        keys[0].push(BlockKey::Text(ns.cache_salt));
    }
    for m in ns.mm_inputs {
        for b in mm_blocks(m, block_size, ns.lookahead, blocks) {
            let offset = (m.offset as i64).wrapping_sub((b * block_size) as i64);
            keys[b].push(BlockKey::MmAt { id: m.id, offset });
        }
    }
    let mut out = Vec::with_capacity(blocks);
    let mut parent = namespace_seed(ns.lora);
    for (i, block_keys) in keys.iter_mut().enumerate() {
        let (start, end) = (i * block_size, (i + 1) * block_size);
        if ns.lookahead > 0 {
            block_keys.push(BlockKey::Lookahead(&tokens[end..end + ns.lookahead]));
        }
        parent = keyed_block_hash(parent, &tokens[start..end], block_keys);
        out.push(parent);
    }
    out
}

/// The blocks (below `blocks`) whose hash window — the block and its `lookahead` tokens — the
/// input's placeholder overlaps, as vLLM's `_gen_mm_extra_hash_keys` assigns an input to blocks.
fn mm_blocks(m: &MmInput<'_>, block_size: usize, lookahead: usize, blocks: usize) -> std::ops::Range<usize> {
    if m.length == 0 || block_size == 0 {
        return 0..0;
    }
    let (bs, window) = (block_size as u64, (block_size + lookahead) as u64);
    // Block i overlaps it iff i*bs < offset + length and i*bs + window > offset.
    let first = if m.offset >= window { (m.offset - window) / bs + 1 } else { 0 };
    let last = m.offset.saturating_add(m.length).div_ceil(bs);
    let clamp = |x: u64| x.min(blocks as u64) as usize;
    clamp(first)..clamp(last).max(clamp(first))
}

/// One block's local hash: its token bytes, then its key set (distinct keys sorted by bytes,
/// each as u32-LE byte length + its bytes), hashed with the parent's local hash as seed.
/// No keys gives the plain scheme's hash. Bridges use it for each block of a keyed store.
pub fn keyed_block_hash(parent: u64, block: &[u32], keys: &[BlockKey<'_>]) -> u64 {
    let mut set: Vec<Vec<u8>> = keys.iter().map(BlockKey::bytes).collect();
    set.sort_unstable();
    set.dedup();
    let extra: usize = set.iter().map(|k| 4 + k.len()).sum();
    let mut bytes = Vec::with_capacity(block.len() * 4 + extra);
    for t in block {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    for k in set {
        // Keys longer than u32::MAX bytes cannot come through a protobuf or msgpack message.
        bytes.extend_from_slice(&(k.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&k);
    }
    xxh3_64_with_seed(&bytes, parent)
}

/// Scheme id 2: Dynamo's position-free block hash, the `LocalBlockHash` of its KV router
/// (`compute_block_hash_for_seq` in ai-dynamo's `dynamo-kv-router`, Apache-2.0; the values
/// are checked against ai-dynamo-runtime 1.6.1 in `tests/upstream/test_dynamo_http.py`):
/// xxh3-64 of each full block's u32-LE token bytes, seeded with [`dynamo_seed`], the same for
/// every block. A block's position is its path in the trie, not part of its hash.
pub const SCHEME_DYNAMO_BLOCK: u32 = 2;

/// Dynamo's base seed (`XXH3_SEED`), the seed of the base model without a cache namespace.
pub const DYNAMO_SEED: u64 = 1337;

/// Dynamo's seed for a LoRA adapter and a cache namespace (its request `cache_salt`):
/// [`DYNAMO_SEED`], plus (wrapping) xxh3-64 of the adapter name with seed 0, plus (wrapping)
/// xxh3-64 of the namespace with seed 1. An empty name or namespace counts as absent.
pub fn dynamo_seed(lora: &str, namespace: &str) -> u64 {
    let mut seed = DYNAMO_SEED;
    if !lora.is_empty() {
        seed = seed.wrapping_add(xxh3_64_with_seed(lora.as_bytes(), 0));
    }
    if !namespace.is_empty() {
        seed = seed.wrapping_add(xxh3_64_with_seed(namespace.as_bytes(), 1));
    }
    seed
}

/// The scheme-2 local hashes of every full block of `tokens` under `seed` ([`dynamo_seed`]).
/// A trailing partial block is not hashed; `block_size` 0 gives none.
pub fn dynamo_block_hashes(seed: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut bytes = Vec::with_capacity(block_size.min(tokens.len()) * 4);
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            bytes.clear();
            block.iter().for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
            xxh3_64_with_seed(&bytes, seed)
        })
        .collect()
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

    /// Values computed by ai-dynamo-runtime 1.6.1 (`dynamo.llm.compute_block_hash_for_seq`,
    /// tokens 1..=8, block size 4, with `lora_name` and `cache_namespace` as named).
    #[test]
    fn dynamo_block_hashes_are_dynamos() {
        let t: Vec<u32> = (1..=8).collect();
        let h = |lora, ns| dynamo_block_hashes(dynamo_seed(lora, ns), &t, 4);
        assert_eq!(h("", ""), vec![14643705804678351452, 16777012769546811212]);
        assert_eq!(h("a", ""), vec![17680866786467819158, 10751596618610180438]);
        assert_eq!(h("", "s"), vec![5728354201622468629, 3103195633695993164]);
        assert_eq!(h("a", "s")[0], 8794082693489998562);
        assert_eq!(dynamo_block_hashes(DYNAMO_SEED, &t[..7], 4).len(), 1, "a partial block is not hashed");
        assert!(dynamo_block_hashes(DYNAMO_SEED, &t, 0).is_empty());
    }

    /// A golden case: name, tokens, block size, LoRA namespace, cache salt, per-block keys.
    struct Case {
        name: &'static str,
        tokens: Vec<u32>,
        bs: usize,
        ns: &'static str,
        salt: &'static str,
        extra: Vec<(usize, Vec<&'static str>)>,
        mm: Vec<MmInput<'static>>,
        lookahead: usize,
    }

    fn case(name: &'static str, tokens: Vec<u32>, bs: usize, ns: &'static str) -> Case {
        Case { name, tokens, bs, ns, salt: "", extra: vec![], mm: vec![], lookahead: 0 }
    }

    /// The golden cases. Shared with other languages through `python/golden_vectors.json`;
    /// changing a hash here is a wire-incompatible change.
    fn cases() -> Vec<Case> {
        let ten: Vec<u32> = (1..=10).collect();
        let img = "5f0c9bd5a7c3e1d24b8a6f0e9c7d3b1a2e4f6a8c0b2d4e6f8a1c3e5b7d9f0a2c";
        vec![
            case("empty", vec![], 4, ""),
            case("partial_only", vec![1, 2, 3], 4, ""),
            case("one_block", vec![1, 2, 3, 4], 4, ""),
            case("two_blocks_and_partial", ten.clone(), 4, ""),
            case("large_ids", vec![0, u32::MAX, 151_643, 128_000, 7, 7, 7, 7], 4, ""),
            case("block16", (0..48).map(|i| i * 1_000 + 17).collect(), 16, ""),
            case("lora_namespace", ten.clone(), 4, "sql-adapter"),
            case("unicode_namespace", vec![1, 2, 3, 4], 4, "адаптер-ü"),
            Case { salt: "tenant-42", ..case("cache_salt", ten.clone(), 4, "") },
            Case { extra: vec![(1, vec![img])], ..case("mm_second_block", ten.clone(), 4, "") },
            Case {
                extra: vec![(0, vec!["img-b", "img-a", "img-b"]), (1, vec!["img-b"])],
                ..case("mm_unsorted_duplicates", ten.clone(), 4, "")
            },
            Case {
                salt: "tenant-42",
                extra: vec![(0, vec![img]), (1, vec![img])],
                ..case("lora_salt_mm", ten.clone(), 4, "sql-adapter")
            },
            Case { extra: vec![(2, vec![img])], ..case("mm_past_last_full_block", ten.clone(), 4, "") },
            // vLLM >= 0.34: an image whose placeholder spans tokens 2..7 keys blocks 0 and 1 with
            // its offset from each block's start (2, then -2); the same image at 6..9 keys blocks
            // 1 and 2 differently.
            Case {
                mm: vec![MmInput { id: img, offset: 2, length: 5 }],
                ..case("mm_input_at_offset_2", (1..=12).collect(), 4, "")
            },
            Case {
                mm: vec![MmInput { id: img, offset: 6, length: 3 }],
                ..case("mm_input_at_offset_6", (1..=12).collect(), 4, "")
            },
            // vLLM's hash lookahead: block i also covers the first token of block i+1, so 10
            // tokens give 2 blocks (the second followed by token 9), 12 tokens still 2.
            Case { lookahead: 1, ..case("lookahead_1", ten.clone(), 4, "") },
            Case { lookahead: 1, ..case("lookahead_1_exact", (1..=12).collect(), 4, "") },
            Case {
                lookahead: 2,
                salt: "tenant-42",
                mm: vec![MmInput { id: img, offset: 3, length: 2 }],
                ..case("lookahead_2_salt_mm_in_window", ten, 4, "sql-adapter")
            },
        ]
    }

    fn hashes_of(c: &Case) -> Vec<u64> {
        let ns = Namespace {
            lora: c.ns,
            cache_salt: c.salt,
            extra: &c.extra,
            mm_inputs: &c.mm,
            lookahead: c.lookahead,
        };
        block_hashes_with(&ns, &c.tokens, c.bs)
    }

    fn golden_json() -> String {
        let mut s = String::from("{\n  \"scheme\": 1,\n  \"description\": \"local_i = xxh3_64_with_seed(u32-LE bytes of block i ++ key set of block i, seed = local_{i-1}), seed 0 for block 0 (with a namespace: xxh3_64_with_seed(UTF-8 bytes of the namespace, 0x7072656669786e73)); key set = distinct keys (extra[i] as UTF-8, plus cache_salt for block 0, plus for every mm_input [id, offset, length] whose placeholder overlaps tokens [i*bs, (i+1)*bs + lookahead) the bytes 0xFF 'm' ++ (offset - i*bs as i64 LE) ++ UTF-8 id, plus with lookahead L > 0 the bytes 0xFF 'l' ++ u32-LE tokens [(i+1)*bs, (i+1)*bs + L)) sorted by bytes, each as u32-LE length ++ bytes; only blocks followed by L more tokens are hashed; trailing partial block not hashed\",\n  \"cases\": [\n");
        let cs = cases();
        let q = |k: &str| format!("\"{k}\"");
        for (n, c) in cs.iter().enumerate() {
            let toks: Vec<String> = c.tokens.iter().map(|t| t.to_string()).collect();
            let hs: Vec<String> = hashes_of(c).iter().map(|h| format!("\"{h:016x}\"")).collect();
            let mut fields = String::new();
            if !c.ns.is_empty() {
                fields += &format!("\"namespace\": {}, ", q(c.ns));
            }
            if !c.salt.is_empty() {
                fields += &format!("\"cache_salt\": {}, ", q(c.salt));
            }
            if !c.extra.is_empty() {
                let e: Vec<String> = c
                    .extra
                    .iter()
                    .map(|(b, ks)| {
                        format!("[{b}, [{}]]", ks.iter().map(|k| q(k)).collect::<Vec<_>>().join(", "))
                    })
                    .collect();
                fields += &format!("\"extra\": [{}], ", e.join(", "));
            }
            if !c.mm.is_empty() {
                let m: Vec<String> =
                    c.mm.iter().map(|m| format!("[{}, {}, {}]", q(m.id), m.offset, m.length)).collect();
                fields += &format!("\"mm_inputs\": [{}], ", m.join(", "));
            }
            if c.lookahead > 0 {
                fields += &format!("\"lookahead\": {}, ", c.lookahead);
            }
            s += &format!(
                "    {{\"name\": \"{}\", {fields}\"block_size\": {}, \"tokens\": [{}], \"hashes\": [{}]}}{}\n",
                c.name,
                c.bs,
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
    fn keys_fold_into_their_block_and_its_descendants_only() {
        let t: Vec<u32> = (1..=12).collect();
        let plain = block_hashes(&t, 4);
        let none = Namespace::default();
        assert_eq!(block_hashes_with(&none, &t, 4), plain, "no inputs = the plain scheme");
        let lora = Namespace { lora: "a", ..none };
        assert_eq!(block_hashes_with(&lora, &t, 4), block_hashes_in("a", &t, 4), "LoRA = namespace seed");
        let salted = block_hashes_with(&Namespace { cache_salt: "s", ..none }, &t, 4);
        assert!((0..3).all(|i| salted[i] != plain[i]), "the salt reaches every block");
        let extra = [(1, vec!["img"])];
        let mm = block_hashes_with(&Namespace { extra: &extra, ..none }, &t, 4);
        assert_eq!(mm[0], plain[0], "a block before the image is the plain block");
        assert!(mm[1] != plain[1] && mm[2] != plain[2], "the image's block and its descendants differ");
        // A continuation chains from its parent's local, which carries the keys already.
        assert_eq!(block_hashes_after(mm[1], &t[8..], 4), mm[2..]);
        assert_eq!(keyed_block_hash(plain[0], &t[4..8], &[BlockKey::Text("img")]), mm[1]);
        // The salt is block 0's key: a store of block 0 with key "s" is the salted block.
        assert_eq!(keyed_block_hash(0, &t[..4], &[BlockKey::Text("s")]), salted[0]);
    }

    #[test]
    fn a_key_set_is_a_set_and_its_encoding_is_unambiguous() {
        let b = [1u32, 2, 3, 4];
        let h = |keys: &[&str]| {
            let keys: Vec<BlockKey<'_>> = keys.iter().map(|k| BlockKey::Text(k)).collect();
            keyed_block_hash(7, &b, &keys)
        };
        assert_eq!(h(&["x", "y"]), h(&["y", "x", "y"]), "order and duplicates do not matter");
        assert_ne!(h(&["ab", "c"]), h(&["a", "bc"]), "length prefixes keep keys apart");
        assert_ne!(h(&[""]), h(&[]), "an empty key is still a key");
        assert_eq!(h(&[]), block_hashes_after(7, &b, 4)[0], "no keys = the plain block");
    }

    #[test]
    fn placed_inputs_and_lookahead_key_exactly_the_blocks_they_touch() {
        let t: Vec<u32> = (1..=16).collect();
        let none = Namespace::default();
        let plain = block_hashes(&t, 4);
        let at = |offset| [MmInput { id: "img", offset, length: 3 }];
        let (a, b) = (at(5), at(6));
        let h5 = block_hashes_with(&Namespace { mm_inputs: &a, ..none }, &t, 4);
        let h6 = block_hashes_with(&Namespace { mm_inputs: &b, ..none }, &t, 4);
        assert_eq!(h5[0], plain[0], "block 0 ends before the image");
        assert_ne!(h5[1], h6[1], "the same image at another offset is another block");
        assert_eq!(mm_blocks(&a[0], 4, 0, 4), 1..2, "tokens 5..8 sit in block 1 only");
        assert_eq!(mm_blocks(&b[0], 4, 0, 4), 1..3, "tokens 6..9 reach block 2");
        assert_eq!(mm_blocks(&b[0], 4, 2, 4), 1..3, "a lookahead window reaches back one block at most");
        assert_eq!(mm_blocks(&at(4)[0], 4, 1, 4), 0..2, "block 0's lookahead token 4 overlaps it");
        // Lookahead: a block's hash depends on the next token; the last full block without a
        // token after it is not hashed.
        let la = Namespace { lookahead: 1, ..none };
        let one = block_hashes_with(&la, &t, 4);
        assert_eq!(one.len(), 3, "16 tokens, lookahead 1: blocks 0..3");
        let mut other = t.clone();
        other[8] = 999; // first token of block 2 = block 1's lookahead
        let two = block_hashes_with(&la, &other, 4);
        assert_eq!((one[0] == two[0], one[1] == two[1]), (true, false), "block 1 differs by its lookahead");
        assert!(one.iter().zip(&plain).all(|(a, b)| a != b), "lookahead blocks never equal plain ones");
        assert_eq!(hashable_blocks(16, 4, 1), 3);
        assert_eq!(hashable_blocks(17, 4, 1), 4);
        assert_eq!(hashable_blocks(3, 4, 9), 0);
    }

    #[test]
    fn tagged_keys_cannot_be_forged_by_text() {
        let b = [1u32, 2, 3, 4];
        let mm = BlockKey::MmAt { id: "x", offset: 0 };
        let forged = String::from_utf8_lossy(&mm.bytes()).into_owned();
        assert_ne!(keyed_block_hash(0, &b, &[mm]), keyed_block_hash(0, &b, &[BlockKey::Text(&forged)]));
        assert_eq!(mm.bytes()[0], 0xFF);
        assert!(std::str::from_utf8(&BlockKey::Lookahead(&[1]).bytes()).is_err());
    }

    /// Pinned keyed hashes (the golden file pins them too; this fails first, in Rust).
    #[test]
    fn pinned_keyed_vectors() {
        let t: Vec<u32> = (1..=8).collect();
        let hex = |v: Vec<u64>| v.iter().map(|h| format!("{h:016x}")).collect::<Vec<_>>();
        let extra = [(0, vec!["img"])];
        let all =
            Namespace { lora: "sql-adapter", cache_salt: "tenant-42", extra: &extra, ..Default::default() };
        assert_eq!(
            hex(block_hashes_with(&Namespace { cache_salt: "tenant-42", ..Default::default() }, &t, 4)),
            ["907b870340abffda", "b4bb002ca2bf84a0"]
        );
        assert_eq!(hex(block_hashes_with(&all, &t, 4)), ["5fd47c944507580b", "b86400561a6312e1"]);
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
