//! vLLM blocks with `extra_keys` (multimodal identifiers, a cache salt, a LoRA name) through the
//! decoder and the session: they are stored, and their locals are what a query naming the same
//! inputs hashes to (`scheme::block_hashes_with`, which the replica runs on `TokenIds`), and
//! differ from a query that does not name them. Shapes the rule cannot reproduce are refused.

use prefixlog_bridge::metrics::BridgeMetrics;
use prefixlog_bridge::session::Session;
use prefixlog_bridge::wire::decode_batch;
use prefixlog_engine::scheme::{block_hashes, block_hashes_in, block_hashes_with, Namespace};
use prefixlog_state::KvOp;
use rmpv::Value;

const BS: u32 = 4;
/// A vLLM multimodal identifier (a hex digest of the image).
const IMG: &str = "9a1f0c3e5b7d2f4a6c8e0b1d3f5a7c9e2b4d6f8a0c1e3b5d7f9a2c4e6b8d0f1a";

fn toks(n: u32) -> Vec<u32> {
    (100..100 + n).collect()
}

fn v<T: Into<Value>>(x: T) -> Value {
    x.into()
}

/// A positional vLLM BlockStored: tag, hashes, parent, tokens, block size, lora_id, medium,
/// lora_name, extra_keys, then the upstream tail (group_idx, kind, window) as nils.
fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32], lora: Option<&str>, extra: Value) -> Value {
    Value::Array(vec![
        v("BlockStored"),
        Value::Array(hashes.iter().map(|&h| v(h)).collect()),
        parent.map_or(Value::Nil, v),
        Value::Array(tokens.iter().map(|&t| v(t)).collect()),
        v(BS),
        Value::Nil,
        v("GPU"),
        lora.map_or(Value::Nil, v),
        extra,
        Value::Nil,
        Value::Nil,
        Value::Nil,
    ])
}

/// `extra_keys`: one entry per block, `None` = nil, else the tuple's elements.
fn keys(entries: Vec<Option<Vec<Value>>>) -> Value {
    Value::Array(entries.into_iter().map(|e| e.map_or(Value::Nil, Value::Array)).collect())
}

/// Encodes `events` as a vLLM positional batch, decodes it and runs it through a session.
fn run(s: &mut Session, seq: u64, events: Vec<Value>, m: &BridgeMetrics) -> Vec<KvOp> {
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, &Value::Array(vec![v(0.5), Value::Array(events), v(0)])).unwrap();
    s.accept(seq, seq, &decode_batch(&buf).unwrap(), m).ops
}

fn locals(op: &KvOp) -> Vec<u64> {
    match op {
        KvOp::Stored { blocks, .. } => blocks.iter().map(|b| b.local).collect(),
        other => panic!("not a store: {other:?}"),
    }
}

#[test]
fn a_multimodal_block_is_keyed_by_its_identifier() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(12);
    // The image covers blocks 1 and 2 (vLLM lists its identifier on each block it overlaps).
    let extra = keys(vec![None, Some(vec![v(IMG)]), Some(vec![v(IMG)])]);
    let ops = run(&mut s, 0, vec![stored(&[1, 2, 3], None, &t, None, extra)], &m);
    assert_eq!(ops.len(), 1, "stored, not refused");
    let got = locals(&ops[0]);
    let named = [(1, vec![IMG]), (2, vec![IMG])];
    let query = block_hashes_with(&Namespace { extra: &named, ..Default::default() }, &t, BS as usize);
    assert_eq!(got, query, "a query naming the image per block matches");
    let plain = block_hashes(&t, BS as usize);
    assert_eq!(got[0], plain[0], "the block before the image is a plain block");
    assert!(got[1] != plain[1] && got[2] != plain[2], "a query without the image does not match");
    let wrong = [(1, vec!["another-image"]), (2, vec!["another-image"])];
    let other = block_hashes_with(&Namespace { extra: &wrong, ..Default::default() }, &t, BS as usize);
    assert_ne!(got[1], other[1], "nor one naming another image");
}

/// vLLM 0.34 keys a multimodal block by (identifier, offset of the input's placeholder from the
/// block's start): the same image at two offsets is two different blocks. A query placing the
/// input (`mm_inputs`: identifier, offset in the prompt, length) matches exactly those blocks.
#[test]
fn a_multimodal_block_is_keyed_by_identifier_and_offset() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(12);
    let pair = |off: i64| Value::Array(vec![v(IMG), Value::from(off)]);
    // The image's placeholder is tokens 6..11: block 1 (4..8) at offset 2, block 2 (8..12) at -2.
    let extra = keys(vec![None, Some(vec![pair(2)]), Some(vec![pair(-2)])]);
    let ops = run(&mut s, 0, vec![stored(&[1, 2, 3], None, &t, None, extra)], &m);
    let got = locals(&ops[0]);
    let placed = |offset| {
        let mm = [prefixlog_engine::scheme::MmInput { id: IMG, offset, length: 5 }];
        block_hashes_with(&Namespace { mm_inputs: &mm, ..Default::default() }, &t, BS as usize)
    };
    assert_eq!(got, placed(6), "a query placing the image where the engine had it matches");
    let elsewhere = placed(7);
    assert_eq!(elsewhere[0], got[0], "block 0 has no image either way");
    assert_ne!(elsewhere[1], got[1], "the same image one token later is another block");
    let by_id = [(1, vec![IMG]), (2, vec![IMG])];
    let id_only = block_hashes_with(&Namespace { extra: &by_id, ..Default::default() }, &t, BS as usize);
    assert_ne!(id_only[1], got[1], "the identifier without its offset is not the block vLLM hashed");
}

#[test]
fn a_cache_salt_salts_the_chain_and_continuations_inherit_it() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(16);
    // vLLM puts the salt in the first block's tuple only.
    let first = stored(&[1, 2], None, &t[..8], None, keys(vec![Some(vec![v("tenant-42")]), None]));
    // A later store continues from block 2: no extra keys, the salt comes through the parent.
    let later = stored(&[3, 4], Some(2), &t[8..], None, Value::Nil);
    let ops = run(&mut s, 0, vec![first, later], &m);
    let got: Vec<u64> = ops.iter().flat_map(locals).collect();
    let salted = Namespace { cache_salt: "tenant-42", ..Default::default() };
    assert_eq!(got, block_hashes_with(&salted, &t, BS as usize), "a query naming the salt matches");
    let plain = block_hashes(&t, BS as usize);
    assert!(got.iter().zip(&plain).all(|(a, b)| a != b), "a query without it matches no block");
    let other = block_hashes_with(&Namespace { cache_salt: "tenant-7", ..Default::default() }, &t, 4);
    assert_ne!(got[0], other[0], "nor one naming another tenant's salt");
}

#[test]
fn a_lora_name_with_an_image_and_a_salt() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(8);
    // vLLM's order: LoRA name, multimodal identifiers, cache salt (block 0 only).
    let extra =
        keys(vec![Some(vec![v("sql-lora"), v(IMG), v("tenant-42")]), Some(vec![v("sql-lora"), v(IMG)])]);
    let lora_only = keys(vec![Some(vec![v("sql-lora")]), Some(vec![v("sql-lora")])]);
    let ops = run(
        &mut s,
        0,
        vec![
            stored(&[1, 2], None, &t, Some("sql-lora"), extra),
            stored(&[5, 6], None, &t, Some("sql-lora"), lora_only),
        ],
        &m,
    );
    let img = [(0, vec![IMG]), (1, vec![IMG])];
    let all = Namespace { lora: "sql-lora", cache_salt: "tenant-42", extra: &img, ..Default::default() };
    assert_eq!(locals(&ops[0]), block_hashes_with(&all, &t, BS as usize));
    assert_eq!(locals(&ops[1]), block_hashes_in("sql-lora", &t, BS as usize), "LoRA alone: its namespace");
    let without_lora = Namespace { lora: "", ..all };
    let base = block_hashes_with(&without_lora, &t, BS as usize);
    assert!(locals(&ops[0]).iter().zip(&base).all(|(a, b)| a != b), "the base model's query does not match");
    assert_eq!(m.get("refused_extra_keys"), Some(0));
}

#[test]
fn keys_no_gateway_can_supply_are_refused_and_counted() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(8);
    let embeds = Value::Binary(vec![7; 32]);
    let events = vec![
        // Prompt-embeds hashes (bytes).
        stored(&[1, 2], None, &t, None, keys(vec![Some(vec![embeds]), None])),
        // An element of unknown shape (an int).
        stored(&[3, 4], None, &t, None, keys(vec![Some(vec![v(5)]), None])),
        // Not one entry per block.
        stored(&[5, 6], None, &t, None, keys(vec![Some(vec![v(IMG)])])),
        // A LoRA request whose tuple does not start with its name.
        stored(&[7, 8], None, &t, Some("sql-lora"), keys(vec![Some(vec![v(IMG)]), None])),
        // Not a list at all.
        stored(&[9, 10], None, &t, None, v("salt")),
        // Nil entries everywhere: a plain block, stored.
        stored(&[11, 12], None, &t, None, keys(vec![None, None])),
    ];
    let ops = run(&mut s, 0, events, &m);
    assert_eq!(ops.len(), 1);
    assert_eq!(locals(&ops[0]), block_hashes(&t, BS as usize));
    assert_eq!(m.get("refused_extra_keys"), Some(5));
    // A child of a refused block has no known parent: refused as such, never mis-hashed.
    let child = stored(&[13], Some(2), &toks(12)[8..], None, Value::Nil);
    assert!(run(&mut s, 1, vec![child], &m).is_empty());
    assert_eq!(m.get("refused_unknown_parent"), Some(1));
}

#[test]
fn the_map_layout_carries_extra_keys_too() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(4);
    let ev = Value::Map(vec![
        (v("type"), v("BlockStored")),
        (v("block_hashes"), Value::Array(vec![v(1)])),
        (v("parent_block_hash"), Value::Nil),
        (v("token_ids"), Value::Array(t.iter().map(|&x| v(x)).collect())),
        (v("block_size"), v(BS)),
        (v("lora_id"), Value::Nil),
        (v("medium"), v("GPU")),
        (v("lora_name"), Value::Nil),
        (v("extra_keys"), keys(vec![Some(vec![v(IMG), v("tenant-42")])])),
    ]);
    let mut buf = Vec::new();
    let batch = Value::Map(vec![(v("ts"), v(0.5)), (v("events"), Value::Array(vec![ev]))]);
    rmpv::encode::write_value(&mut buf, &batch).unwrap();
    let ops = s.accept(0, 0, &decode_batch(&buf).unwrap(), &m).ops;
    let img = [(0, vec![IMG])];
    let want =
        block_hashes_with(&Namespace { cache_salt: "tenant-42", extra: &img, ..Default::default() }, &t, 4);
    assert_eq!(locals(&ops[0]), want);
}

/// A map-layout BlockStored (vLLM >= 0.34, SGLang: tagged structs, defaults omitted) with the
/// given extra fields.
fn stored_map(hashes: &[u64], parent: Option<u64>, tokens: &[u32], extra: Vec<(&str, Value)>) -> Value {
    let mut m = vec![
        (v("type"), v("BlockStored")),
        (v("block_hashes"), Value::Array(hashes.iter().map(|&h| v(h)).collect())),
        (v("parent_block_hash"), parent.map_or(Value::Nil, v)),
        (v("token_ids"), Value::Array(tokens.iter().map(|&t| v(t)).collect())),
        (v("block_size"), v(BS)),
        (v("lora_id"), Value::Nil),
        (v("medium"), v("GPU")),
        (v("lora_name"), Value::Nil),
    ];
    m.extend(extra.into_iter().map(|(k, x)| (v(k), x)));
    Value::Map(m)
}

fn token_lists(lists: &[&[u32]]) -> Value {
    Value::Array(lists.iter().map(|l| Value::Array(l.iter().map(|&t| v(t)).collect())).collect())
}

/// vLLM's hash lookahead: block i's identity covers the first token(s) of block i+1, so a
/// query diverging there matches one block fewer, exactly as the engine's own hashes do.
#[test]
fn lookahead_tokens_are_part_of_a_blocks_identity() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(13); // 3 blocks, each followed by one more token
    let la = token_lists(&[&t[4..5], &t[8..9], &t[12..13]]);
    let ops =
        run(&mut s, 0, vec![stored_map(&[1, 2, 3], None, &t[..12], vec![("lookahead_token_ids", la)])], &m);
    let got = locals(&ops[0]);
    let with_la = |tokens: &[u32]| {
        block_hashes_with(&Namespace { lookahead: 1, ..Default::default() }, tokens, BS as usize)
    };
    assert_eq!(got, with_la(&t), "a query with lookahead 1 and the same tokens matches every block");
    let mut diverged = t.clone();
    diverged[8] = 7; // the first token of block 2: block 1's lookahead
    let q = with_la(&diverged);
    assert_eq!((q[0] == got[0], q[1] == got[1]), (true, false), "the divergence costs block 1");
    assert_ne!(block_hashes(&t, BS as usize)[0], got[0], "a query without lookahead matches nothing");
    // Lookahead lists that are not one per block, all as long, are refused.
    for bad in [token_lists(&[&t[4..5]]), token_lists(&[&t[4..5], &t[8..10], &t[12..13]]), v("x")] {
        let ops = run(
            &mut s,
            1,
            vec![stored_map(&[9, 10, 11], None, &t[..12], vec![("lookahead_token_ids", bad)])],
            &m,
        );
        assert!(ops.is_empty());
    }
    assert_eq!(m.get("refused_lookahead"), Some(3));
}

/// SGLang's EAGLE `token_ids` of `tokens`: every overlapping pair.
fn pairs(tokens: &[u32]) -> Value {
    Value::Array(tokens.windows(2).map(|w| Value::Array(vec![v(w[0]), v(w[1])])).collect())
}

/// A map-layout BlockStored whose `token_ids` are `tokens` as given (any shape).
fn stored_raw(hashes: &[u64], parent: Option<u64>, tokens: Value, extra: Vec<(&str, Value)>) -> Value {
    let Value::Map(mut m) = stored_map(hashes, parent, &[], extra) else { unreachable!() };
    for (k, x) in &mut m {
        if k.as_str() == Some("token_ids") {
            *x = tokens.clone();
        }
    }
    Value::Map(m)
}

/// SGLang with EAGLE (bigram radix keys) publishes each page as pairs (token j, token j + 1):
/// the page covers the token after it, so it is indexed as a block with one lookahead token, and
/// a query asking with lookahead 1 matches exactly the pages SGLang would hit. A child stored
/// under a page in the middle of a run (a split) continues the chain.
#[test]
fn sglang_eagle_pages_are_blocks_with_one_lookahead_token() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(13); // 12 bigrams: 3 pages
    let ops = run(&mut s, 0, vec![stored_raw(&[1, 2, 3], None, pairs(&t), vec![])], &m);
    let got = locals(&ops[0]);
    let la = |tokens: &[u32]| {
        block_hashes_with(&Namespace { lookahead: 1, ..Default::default() }, tokens, BS as usize)
    };
    assert_eq!(got, la(&t), "a query with lookahead 1 and the same tokens matches every page");
    assert_eq!(la(&t[..12]).len(), 2, "the last page needs the token after it");
    // A branch after page 1 (SGLang split the run): pairs from token 8 on.
    let mut branch = t[..9].to_vec();
    branch.extend([7, 8, 9, 10]);
    let ops = run(&mut s, 1, vec![stored_raw(&[4], Some(2), pairs(&branch[8..]), vec![])], &m);
    assert_eq!(locals(&ops[0]), la(&branch)[2..].to_vec(), "the branch continues page 1's chain");
    let mut diverged = t.clone();
    diverged[8] = 7; // page 1's next token
    let q = la(&diverged);
    assert_eq!((q[0] == got[0], q[1] == got[1]), (true, false), "the divergence costs page 1");
    // Pairs that do not overlap, or a bigram store naming lookahead tokens as well: refused.
    let mut broken: Vec<Value> = match pairs(&t[..5]) {
        Value::Array(a) => a,
        _ => unreachable!(),
    };
    broken[2] = Value::Array(vec![v(1u32), v(2u32)]);
    let both =
        stored_raw(&[6], None, pairs(&t[..5]), vec![("lookahead_token_ids", token_lists(&[&t[4..5]]))]);
    assert!(run(&mut s, 2, vec![stored_raw(&[5], None, Value::Array(broken), vec![])], &m).is_empty());
    assert!(run(&mut s, 3, vec![both], &m).is_empty());
    assert_eq!((m.get("refused_tokens"), m.get("refused_lookahead")), (Some(1), Some(1)));
}

/// SGLang's top-level `cache_salt` names every block of a store (its radix tree is per salt):
/// the root store is salted like a gateway's salted query, a child under it continues the
/// chain, a child claiming another salt is refused.
#[test]
fn sglang_cache_salt_names_the_whole_chain() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(12);
    let salt = |x: &str| vec![("cache_salt", v(x))];
    let ops = run(&mut s, 0, vec![stored_map(&[1], None, &t[..4], salt("tenant-42"))], &m);
    let ops2 = run(&mut s, 1, vec![stored_map(&[2, 3], Some(1), &t[4..], salt("tenant-42"))], &m);
    let mut got = locals(&ops[0]);
    got.extend(locals(&ops2[0]));
    let query =
        block_hashes_with(&Namespace { cache_salt: "tenant-42", ..Default::default() }, &t, BS as usize);
    assert_eq!(got, query, "a salted query matches the salted chain");
    assert!(
        got.iter().zip(block_hashes(&t, BS as usize)).all(|(a, b)| *a != b),
        "an unsalted one matches nothing"
    );
    assert!(run(&mut s, 2, vec![stored_map(&[4], Some(1), &t[4..8], salt("tenant-7"))], &m).is_empty());
    assert!(run(&mut s, 3, vec![stored_map(&[5], None, &t[..4], vec![("cache_salt", v(5))])], &m).is_empty());
    assert_eq!(m.get("refused_salt"), Some(2));
}

/// vLLM's `locality` / `ownership`: a remote store or a secondary tier's copy is not the
/// worker's own block: refused, and so is its removal (the primary copy stays credited).
/// `session_id` is attribution only. A field the bridge does not know refuses the store.
#[test]
fn residency_session_and_unknown_fields() {
    let (m, mut s) = (BridgeMetrics::default(), Session::new(BS, 1));
    let t = toks(8);
    let own = run(
        &mut s,
        0,
        vec![stored_map(&[1], None, &t[..4], vec![("locality", v("LOCAL")), ("session_id", v("s1"))])],
        &m,
    );
    assert_eq!(locals(&own[0]), block_hashes(&t[..4], BS as usize), "LOCAL and a session id: indexed");
    let remote = stored_map(&[2], Some(1), &t[4..], vec![("locality", v("REMOTE"))]);
    let owned = stored_map(&[2], Some(1), &t[4..], vec![("ownership", v("kvcr")), ("medium", v("CPU"))]);
    let unknown = stored_map(&[2], Some(1), &t[4..], vec![("new_hash_input", v(3))]);
    let harmless = stored_map(&[2], Some(1), &t[4..], vec![("new_field_at_default", Value::Nil)]);
    assert!(run(&mut s, 1, vec![remote, owned, unknown], &m).is_empty());
    assert_eq!((m.get("refused_residency"), m.get("refused_unknown_field")), (Some(2), Some(1)));
    assert_eq!(run(&mut s, 2, vec![harmless], &m).len(), 1, "a field left at nil says nothing");
    let removal = |extra: Vec<(&str, Value)>| {
        let mut e = vec![
            (v("type"), v("BlockRemoved")),
            (v("block_hashes"), Value::Array(vec![v(1u64)])),
            (v("medium"), v("GPU")),
        ];
        e.extend(extra.into_iter().map(|(k, x)| (v(k), x)));
        Value::Map(e)
    };
    assert!(
        run(&mut s, 3, vec![removal(vec![("locality", v("REMOTE"))])], &m).is_empty(),
        "not ours to remove"
    );
    assert_eq!(m.get("refused_residency"), Some(3));
    assert_eq!(run(&mut s, 4, vec![removal(vec![("locality", v("LOCAL"))])], &m).len(), 1);
}
