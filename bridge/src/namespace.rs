//! What a stored block's vLLM `extra_keys` (and lookahead tokens) become in the canonical hash.
//!
//! vLLM builds one tuple per block (`generate_block_hash_extra_keys`, in this order): the LoRA
//! adapter's name (every block of a LoRA request), the multimodal inputs overlapping the block
//! (vLLM 0.34: `(identifier, offset)` pairs, the offset of the input's placeholder from the
//! block's first token; some older versions: bare identifier strings), the `cache_salt` (the
//! prompt's first block only), and prompt-embeds hashes (bytes). The bridge keeps the LoRA name
//! as the chain's namespace and every other element as one of the block's keys
//! (`prefixlog_engine::scheme::BlockKey`): a string as text, a pair as `MmAt` (identifier *and*
//! offset: the same image at two offsets is two blocks, as vLLM hashes it). The salt needs no
//! telling apart from an identifier: the scheme folds it in as a key of block 0, which is where
//! vLLM puts it. A block's `lookahead_token_ids` become its `Lookahead` key, and so does the
//! token after an SGLang EAGLE page (its bigram keys cover it: [`add_bigram_lookahead`]). What a gateway
//! could not supply in a documented way is refused ([`Refusal::ExtraKeys`]): prompt-embeds
//! bytes, elements of another shape, a list that is not one entry per block.

use super::metrics::Refusal;
use super::wire::{ExtraKey, ExtraKeys, Lookahead};
use prefixlog_engine::scheme::OwnedBlockKey;

/// Each block's keys (LoRA name removed), one entry per block of the event.
pub fn block_keys(
    extra: &ExtraKeys,
    lora_name: Option<&str>,
    lora_id: Option<i64>,
    blocks: usize,
) -> Result<Vec<Vec<OwnedBlockKey>>, Refusal> {
    // vLLM sends lora_id 0 or nil for the base model; an adapter given only by integer id
    // (older vLLM) names nothing a gateway can hash with.
    if lora_name.is_none() && lora_id.is_some_and(|id| id != 0) {
        return Err(Refusal::Namespaced);
    }
    let entries = match extra {
        ExtraKeys::Absent => return Ok(vec![Vec::new(); blocks]),
        ExtraKeys::Unparsed => return Err(Refusal::ExtraKeys),
        ExtraKeys::Blocks(e) if e.len() != blocks => return Err(Refusal::ExtraKeys),
        ExtraKeys::Blocks(e) => e,
    };
    entries.iter().map(|e| entry_keys(e.as_deref().unwrap_or_default(), lora_name)).collect()
}

/// Adds each block's lookahead tokens to its keys. Every block must name tokens, all as many
/// (a gateway asks with one lookahead count); anything else is refused.
pub fn add_lookahead(keys: &mut [Vec<OwnedBlockKey>], lookahead: &Lookahead) -> Result<(), Refusal> {
    let lists = match lookahead {
        Lookahead::Absent => return Ok(()),
        Lookahead::Unparsed => return Err(Refusal::Lookahead),
        Lookahead::Blocks(l) => l,
    };
    let Some(first) = lists.first() else { return Err(Refusal::Lookahead) };
    if lists.len() != keys.len() || first.is_empty() || lists.iter().any(|l| l.len() != first.len()) {
        return Err(Refusal::Lookahead);
    }
    for (k, l) in keys.iter_mut().zip(lists) {
        k.push(OwnedBlockKey::Lookahead(l.clone()));
    }
    Ok(())
}

/// SGLang's EAGLE pages (`RadixKey.is_bigram`: position `j` is the pair (token `j`, token
/// `j + 1`)): the token ids are the pairs' first ids. `None` unless the pairs overlap as SGLang's
/// bigram view does (pair `j`'s second id is pair `j + 1`'s first).
pub fn unpair(pairs: &[[u32; 2]]) -> Option<Vec<u32>> {
    if pairs.windows(2).any(|w| w[0][1] != w[1][0]) {
        return None;
    }
    Some(pairs.iter().map(|p| p[0]).collect())
}

/// An EAGLE page also covers the token after it (its last pair's second id): SGLang hits it only
/// when that token matches too, which is vLLM's hash lookahead of one token, so it becomes the
/// block's `Lookahead` key and a gateway asks with `lookahead = 1`. `pairs` must tile the blocks
/// of `keys` (checked by the caller); a store naming lookahead tokens as well is refused.
pub fn add_bigram_lookahead(
    keys: &mut [Vec<OwnedBlockKey>],
    pairs: &[[u32; 2]],
    block_size: usize,
    explicit: &Lookahead,
) -> Result<(), Refusal> {
    if !matches!(explicit, Lookahead::Absent) {
        return Err(Refusal::Lookahead);
    }
    let next: Vec<Vec<u32>> =
        pairs.chunks_exact(block_size.max(1)).map(|page| vec![page[page.len() - 1][1]]).collect();
    add_lookahead(keys, &Lookahead::Blocks(next))
}

/// One block's keys: its tuple without the leading LoRA name, every element an identifier.
fn entry_keys(tuple: &[ExtraKey], lora_name: Option<&str>) -> Result<Vec<OwnedBlockKey>, Refusal> {
    let rest = match (lora_name, tuple) {
        (None, _) | (Some(_), []) => tuple,
        (Some(name), [ExtraKey::Text(first), rest @ ..]) if first == name => rest,
        // A LoRA request's tuple starts with its name; anything else is a layout we do not know.
        (Some(_), _) => return Err(Refusal::ExtraKeys),
    };
    rest.iter()
        .map(|k| match k {
            ExtraKey::Text(s) => Ok(OwnedBlockKey::Text(s.clone())),
            ExtraKey::TextAt(s, offset) => Ok(OwnedBlockKey::MmAt { id: s.clone(), offset: *offset }),
            ExtraKey::Bytes(_) | ExtraKey::Other => Err(Refusal::ExtraKeys),
        })
        .collect()
}

/// Canonical scheme-1 local hashes of the full blocks of `tokens`, continuing a chain whose
/// previous block's local hash is `seed` (0 for the first block of a prompt): the scheme itself
/// (`prefixlog_engine::scheme::block_hashes_after`), implemented once. A prompt split at a block
/// boundary hashes the same in two parts (tested in `bridge/tests/session.rs`).
pub fn chain_from(seed: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    prefixlog_engine::scheme::block_hashes_after(seed, tokens, block_size)
}

/// The local hashes of a stored run of blocks continuing from `seed`, block `i` keyed by
/// `keys[i]`. Without keys this is the plain chain ([`chain_from`]).
pub fn chain_keyed(seed: u64, tokens: &[u32], block_size: usize, keys: &[Vec<OwnedBlockKey>]) -> Vec<u64> {
    if keys.iter().all(Vec::is_empty) {
        return chain_from(seed, tokens, block_size);
    }
    let mut parent = seed;
    tokens
        .chunks_exact(block_size.max(1))
        .enumerate()
        .map(|(i, block)| {
            let block_keys: Vec<_> =
                keys.get(i).map_or(&[][..], Vec::as_slice).iter().map(OwnedBlockKey::as_key).collect();
            parent = prefixlog_engine::scheme::keyed_block_hash(parent, block, &block_keys);
            parent
        })
        .collect()
}
