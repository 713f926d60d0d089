//! A session of a scheme-2 keyspace (`prefixlog bridge --hash-scheme 2`): stored blocks get
//! Dynamo's position-free block hashes (the values ai-dynamo-runtime 1.6.1 computes), parents
//! are still resolved by engine hash, and a store with keys Dynamo's hash cannot carry is
//! refused and counted.

use prefixlog_bridge::metrics::{BridgeMetrics, Refusal};
use prefixlog_bridge::session::Session;
use prefixlog_bridge::wire::{Batch, Event, ExtraKey, ExtraKeys, Lookahead, Residency, Salt, Tokens};
use prefixlog_engine::scheme::{dynamo_block_hashes, dynamo_seed, DYNAMO_SEED};
use prefixlog_state::BlockHashes;
use prefixlog_state::{KvOp, Tier};
use std::sync::atomic::Ordering::Relaxed;

const BS: u32 = 4;

fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>, lora: Option<&str>) -> Event {
    Event::Stored {
        hashes: hashes.to_vec(),
        parent,
        tokens: Tokens::Ids(tokens),
        block_size: Some(u64::from(BS)),
        medium: Some("GPU".into()),
        lora_id: None,
        lora_name: lora.map(String::from),
        extra_keys: ExtraKeys::Absent,
        group_idx: None,
        kv_cache_spec_kind: None,
        kv_cache_spec_sliding_window: None,
        lookahead: Lookahead::Absent,
        cache_salt: Salt::Absent,
        residency: Residency::default(),
        mm_infos: false,
        unknown: vec![],
    }
}

fn batch(events: Vec<Event>) -> Batch {
    Batch { events, ..Default::default() }
}

fn blocks(op: &KvOp) -> Vec<BlockHashes> {
    match op {
        KvOp::Stored { blocks, .. } => blocks.clone(),
        other => panic!("a store: {other:?}"),
    }
}

#[test]
fn scheme_2_stores_carry_dynamos_block_hashes() {
    let m = BridgeMetrics::default();
    let mut s = Session::new(BS, 1).with_scheme(2);
    let t: Vec<u32> = (1..=12).collect();
    let first = s.accept(0, 1, &batch(vec![stored(&[11, 12], None, t[..8].to_vec(), None)]), &m).ops;
    // ai-dynamo-runtime 1.6.1's compute_block_hash_for_seq(1..=8, 4).
    assert_eq!(
        blocks(&first[0]),
        [(11, 14643705804678351452), (12, 16777012769546811212)].map(BlockHashes::from)
    );
    // A continuation under a known parent: each block hashed alone, the parent by engine hash.
    let next = s.accept(1, 2, &batch(vec![stored(&[13], Some(12), t[8..].to_vec(), None)]), &m).ops;
    assert_eq!(
        next[0],
        KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: Some(12),
            blocks: [(13, dynamo_block_hashes(DYNAMO_SEED, &t[8..], 4)[0])].map(BlockHashes::from).to_vec(),
        }
    );
    // A LoRA adapter's blocks: Dynamo's seed for the adapter (1.6.1's value for adapter "a").
    let lora = s.accept(2, 3, &batch(vec![stored(&[21], None, t[..4].to_vec(), Some("a"))]), &m).ops;
    assert_eq!(blocks(&lora[0]), [BlockHashes::new(21, 17680866786467819158)]);
    assert_eq!(blocks(&lora[0])[0].local, dynamo_block_hashes(dynamo_seed("a", ""), &t[..4], 4)[0]);
    // The parent must still be one the session saw stored.
    let orphan = s.accept(3, 4, &batch(vec![stored(&[31], Some(99), t[..4].to_vec(), None)]), &m).ops;
    assert!(orphan.is_empty());
    assert_eq!(m.refused(Refusal::UnknownParent).load(Relaxed), 1);
}

#[test]
fn scheme_2_refuses_stores_keyed_beyond_the_lora_name() {
    let m = BridgeMetrics::default();
    let mut s = Session::new(BS, 1).with_scheme(2);
    let mut salted = stored(&[41], None, (1..=4).collect(), None);
    if let Event::Stored { extra_keys, .. } = &mut salted {
        // vLLM's cache_salt, a key of the prompt's first block.
        *extra_keys = ExtraKeys::Blocks(vec![Some(vec![ExtraKey::Text("tenant-a".into())])]);
    }
    let mut lora_keys = stored(&[42], None, (1..=4).collect(), Some("sql"));
    if let Event::Stored { extra_keys, .. } = &mut lora_keys {
        // A LoRA request's tuple starts with its name: nothing else, so Dynamo's seed carries it.
        *extra_keys = ExtraKeys::Blocks(vec![Some(vec![ExtraKey::Text("sql".into())])]);
    }
    let ops = s.accept(0, 1, &batch(vec![salted, lora_keys]), &m).ops;
    assert_eq!(ops.len(), 1, "the salted store is refused, the LoRA one kept: {ops:?}");
    assert_eq!(blocks(&ops[0])[0].ext, 42);
    assert_eq!(m.refused(Refusal::SchemeKeys).load(Relaxed), 1);
    assert_eq!(m.get("refused_scheme_keys"), Some(1));
    // Scheme 1 keys the same store instead of refusing it.
    let mut s1 = Session::new(BS, 1);
    let mut salted = stored(&[41], None, (1..=4).collect(), None);
    if let Event::Stored { extra_keys, .. } = &mut salted {
        *extra_keys = ExtraKeys::Blocks(vec![Some(vec![ExtraKey::Text("tenant-a".into())])]);
    }
    assert_eq!(s1.accept(0, 1, &batch(vec![salted]), &m).ops.len(), 1);
}
