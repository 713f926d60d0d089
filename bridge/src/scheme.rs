//! Stored blocks' local hashes under the keyspace's hash scheme, the one place the bridge
//! chooses between them (called from `session::Session::translate`).
//!
//! - Scheme 1 (prefixlog's canonical chain, `prefixlog_engine::scheme`): each block's hash is
//!   seeded with its parent's local hash (the LoRA name's seed at the start of a prompt) and
//!   covers the block's keys ([`super::namespace`]).
//! - Scheme 2 (Dynamo's position-free block hash, `prefixlog_engine::scheme::dynamo_seed`):
//!   every block is hashed alone under Dynamo's seed for the event's LoRA name, so the
//!   keyspace holds the same locals Dynamo's own indexer computes (`tokens_hash`) and answers
//!   its `/query_by_hash`. Dynamo's hash has no place for vLLM's other block keys (multimodal
//!   identifiers, the cache salt, prompt-embeds digests) in the form the bridge receives them:
//!   a store carrying any is refused ([`Refusal::SchemeKeys`]) rather than hashed without
//!   them, which would credit a salted or multimodal block to prompts that never hold it.
//!
//! Parent resolution is the same for both (the session still needs the parent's local to
//! know the parent is a block it saw): only the hash of each block differs.

use super::metrics::Refusal;
use super::namespace;
use prefixlog_engine::scheme::OwnedBlockKey;
use prefixlog_engine::scheme::{dynamo_block_hashes, dynamo_seed, SCHEME_DYNAMO_BLOCK, SCHEME_XXH3_CHAINED};

/// Whether the bridge can hash stored blocks under `scheme`.
pub fn is_supported(scheme: u32) -> bool {
    scheme == SCHEME_XXH3_CHAINED || scheme == SCHEME_DYNAMO_BLOCK
}

/// The local hashes of a stored run of blocks (`tokens`, `bs` per block, block `i` keyed by
/// `keys[i]` besides the LoRA name `lora`) under `scheme`. `seed` is scheme 1's chain seed
/// (the parent's local, or the LoRA name's seed for a first block); scheme 2 does not use it.
pub fn locals_for(
    scheme: u32,
    seed: u64,
    tokens: &[u32],
    bs: usize,
    keys: &[Vec<OwnedBlockKey>],
    lora: Option<&str>,
) -> Result<Vec<u64>, Refusal> {
    match scheme {
        SCHEME_DYNAMO_BLOCK if keys.iter().any(|k| !k.is_empty()) => Err(Refusal::SchemeKeys),
        SCHEME_DYNAMO_BLOCK => Ok(dynamo_block_hashes(dynamo_seed(lora.unwrap_or(""), ""), tokens, bs)),
        _ => Ok(namespace::chain_keyed(seed, tokens, bs, keys)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_2_hashes_each_block_alone_under_the_lora_seed() {
        let t: Vec<u32> = (1..=8).collect();
        let plain = locals_for(2, 99, &t, 4, &[vec![], vec![]], None).unwrap();
        // ai-dynamo-runtime 1.6.1's compute_block_hash_for_seq of the same tokens.
        assert_eq!(plain, vec![14643705804678351452, 16777012769546811212]);
        assert_eq!(locals_for(2, 0, &t[4..], 4, &[vec![]], None).unwrap(), plain[1..], "position-free");
        let lora = locals_for(2, 0, &t, 4, &[], Some("a")).unwrap();
        assert_eq!(lora, vec![17680866786467819158, 10751596618610180438]);
    }

    #[test]
    fn scheme_2_refuses_keys_it_cannot_carry() {
        let keys = [vec![OwnedBlockKey::Text("salt".to_string())], vec![]];
        assert_eq!(locals_for(2, 0, &[1, 2, 3, 4, 5, 6, 7, 8], 4, &keys, None), Err(Refusal::SchemeKeys));
        // Scheme 1 keys them.
        assert!(locals_for(1, 0, &[1, 2, 3, 4, 5, 6, 7, 8], 4, &keys, None).is_ok());
    }

    #[test]
    fn scheme_1_is_the_canonical_chain() {
        let t: Vec<u32> = (1..=8).collect();
        let ours = locals_for(1, 0, &t, 4, &[], None).unwrap();
        assert_eq!(ours, prefixlog_engine::scheme::block_hashes(&t, 4));
        assert!(is_supported(1) && is_supported(2) && !is_supported(3));
    }
}
