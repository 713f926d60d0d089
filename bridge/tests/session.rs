//! The bridge's session policy without sockets: canonical hashing across split prompts,
//! parent tracking, refusals, lanes, duplicates, gaps and restarts.

use prefixlog_bridge::metrics::BridgeMetrics;
use prefixlog_bridge::session::{chain_from, Arrival, Session};
use prefixlog_bridge::wire::{Batch, Event, ExtraKey, ExtraKeys, Lookahead, Residency, Salt, Tokens};
use prefixlog_engine::scheme::block_hashes;
use prefixlog_state::BlockHashes;
use prefixlog_state::{KvOp, Tier};

const BS: u32 = 4;

fn toks(base: u32, n: u32) -> Vec<u32> {
    (base..base + n).collect()
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> Event {
    Event::Stored {
        hashes: hashes.to_vec(),
        parent,
        tokens: Tokens::Ids(tokens),
        block_size: Some(u64::from(BS)),
        medium: Some("GPU".into()),
        lora_id: None,
        lora_name: None,
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

#[test]
fn chain_from_reproduces_the_canonical_scheme() {
    for bs in [1usize, 4, 16] {
        let t: Vec<u32> = (0..(bs as u32 * 7 + 3)).map(|i| i.wrapping_mul(2_654_435_761)).collect();
        let whole = block_hashes(&t, bs);
        assert_eq!(chain_from(0, &t, bs), whole);
        for split in 0..=7 {
            let (a, b) = t.split_at(split * bs);
            let mut parts = chain_from(0, a, bs);
            let seed = parts.last().copied().unwrap_or(0);
            parts.extend(chain_from(seed, b, bs));
            assert_eq!(parts, whole, "bs {bs}, split after block {split}");
        }
    }
    assert!(chain_from(5, &[1, 2, 3], 0).is_empty());
}

#[test]
fn stores_chain_through_known_parents_and_refuse_unknown_ones() {
    let m = BridgeMetrics::default();
    let mut s = Session::new(BS, 100);
    let t = toks(1000, 16);
    let want = block_hashes(&t, BS as usize);
    let ops = s.accept(0, 1, &batch(vec![stored(&[11, 12], None, t[..8].to_vec())]), &m).ops;
    assert_eq!(
        ops,
        vec![KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: [(11, want[0]), (12, want[1])].map(BlockHashes::from).to_vec()
        }]
    );
    let ops = s.accept(1, 2, &batch(vec![stored(&[13], Some(12), t[8..12].to_vec())]), &m).ops;
    assert_eq!(
        ops,
        vec![KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: Some(12),
            blocks: [(13, want[2])].map(BlockHashes::from).to_vec()
        }]
    );
    // Unknown parent: refused, never hashed from the wrong seed.
    let a = s.accept(2, 3, &batch(vec![stored(&[15], Some(14), t[12..16].to_vec())]), &m);
    assert!(a.ops.is_empty());
    assert!(!a.lost, "a refused store is an undercount, not a gap");
    assert_eq!(m.get("refused_unknown_parent"), Some(1));
    // Removal forgets the block: its children can no longer be hashed.
    let ops = s
        .accept(
            3,
            4,
            &batch(vec![Event::Removed {
                hashes: vec![13],
                medium: None,
                group_idx: None,
                residency: Residency::default(),
            }]),
            &m,
        )
        .ops;
    assert_eq!(ops, vec![KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: vec![13] }]);
    assert!(s.accept(4, 5, &batch(vec![stored(&[14], Some(13), t[12..16].to_vec())]), &m).ops.is_empty());
    assert_eq!(m.get("refused_unknown_parent"), Some(2));
    assert_eq!(s.tracked(), 2);
}

#[test]
fn refusals_lanes_and_clears() {
    let m = BridgeMetrics::default();
    let mut s = Session::new(BS, 1);
    let mut lane1 = stored(&[21], None, toks(0, 4));
    if let Event::Stored { group_idx, .. } = &mut lane1 {
        *group_idx = Some(1);
    }
    // A medium outside the tier table: refused, never guessed.
    let mut cpu = stored(&[22], None, toks(0, 4));
    if let Event::Stored { medium, .. } = &mut cpu {
        *medium = Some("TAPE".into());
    }
    let mut bigram = stored(&[23], None, vec![]);
    if let Event::Stored { tokens, .. } = &mut bigram {
        *tokens = Tokens::Unsupported;
    }
    let mut other_bs = stored(&[24], None, toks(0, 8));
    if let Event::Stored { block_size, .. } = &mut other_bs {
        *block_size = Some(8);
    }
    // An adapter given by name: indexed, in its own namespace (never as the base model's
    // blocks). One given only by integer id (older vLLM): refused.
    let mut lora = stored(&[26], None, toks(0, 4));
    if let Event::Stored { lora_name, .. } = &mut lora {
        *lora_name = Some("adapter".into());
    }
    let mut lora_child = stored(&[28], Some(26), toks(4, 4));
    if let Event::Stored { lora_name, .. } = &mut lora_child {
        *lora_name = Some("adapter".into());
    }
    let mut lora_by_id = stored(&[29], None, toks(0, 4));
    if let Event::Stored { lora_id, .. } = &mut lora_by_id {
        *lora_id = Some(3);
    }
    let mut salted = stored(&[27], None, toks(0, 4));
    if let Event::Stored { extra_keys, .. } = &mut salted {
        // Prompt-embeds hashes (bytes): no gateway input reproduces them.
        *extra_keys = ExtraKeys::Blocks(vec![Some(vec![ExtraKey::Bytes(32)])]);
    }
    let events = vec![
        lora,
        lora_child,
        lora_by_id,
        salted,
        lane1,
        cpu,
        bigram,
        other_bs,
        stored(&[25], None, toks(0, 6)),
        Event::Unknown("X".into()),
        Event::Malformed("block_hashes"),
        Event::Cleared,
    ];
    let accepted = s.accept(0, 0, &batch(events), &m);
    assert!(accepted.lost, "an unknown and a malformed event: the record is published as a gap");
    let ops = accepted.ops;
    let local = block_hashes(&toks(0, 4), 4)[0];
    let mut adapter_tokens = toks(0, 4);
    adapter_tokens.extend(toks(4, 4));
    let in_adapter = prefixlog_engine::scheme::block_hashes_in("adapter", &adapter_tokens, 4);
    assert_ne!(in_adapter[0], local, "an adapter's block is not the base model's block");
    assert_eq!(
        ops,
        vec![
            KvOp::Stored {
                tier: Tier::Gpu,
                lane: 0,
                parent_ext: None,
                blocks: [(26, in_adapter[0])].map(BlockHashes::from).to_vec()
            },
            KvOp::Stored {
                tier: Tier::Gpu,
                lane: 0,
                parent_ext: Some(26),
                blocks: [(28, in_adapter[1])].map(BlockHashes::from).to_vec()
            },
            KvOp::Stored {
                tier: Tier::Gpu,
                lane: 1,
                parent_ext: None,
                blocks: [(21, local)].map(BlockHashes::from).to_vec()
            },
            KvOp::Cleared { lane: 0 },
            KvOp::Cleared { lane: 1 },
        ]
    );
    for (name, n) in [
        ("refused_medium", 1),
        ("refused_tokens", 1),
        ("refused_token_count", 2),
        ("refused_malformed", 1),
        ("events_unknown_type", 1),
        ("refused_namespaced", 1),
        ("refused_extra_keys", 1),
        ("events_received", 12),
    ] {
        assert_eq!(m.get(name), Some(n), "{name}");
    }
    assert_eq!(s.tracked(), 0, "a clear forgets every tracked block");
}

fn on(medium: &str, mut e: Event) -> Event {
    match &mut e {
        Event::Stored { medium: m, .. } | Event::Removed { medium: m, .. } => *m = Some(medium.into()),
        _ => {}
    }
    e
}

fn removed(hashes: &[u64]) -> Event {
    Event::Removed { hashes: hashes.to_vec(), medium: None, group_idx: None, residency: Residency::default() }
}

/// Every medium vLLM and SGLang report is indexed on its tier; vLLM's lazy CPU offload (a
/// store naming only block hashes) is completed from the GPU store of the same blocks, and
/// stays possible after the GPU copy is gone; a block never seen stored with tokens is refused.
#[test]
fn media_map_onto_tiers_and_offloads_complete_from_the_gpu_store() {
    let m = BridgeMetrics::default();
    let mut s = Session::new(BS, 100);
    let t = toks(500, 12);
    let want = block_hashes(&t, BS as usize);
    let gpu = stored(&[1, 2], None, t[..8].to_vec());
    let disk = on("DISK", stored(&[3], Some(2), t[8..].to_vec()));
    let ops = s.accept(0, 1, &batch(vec![gpu, disk]), &m).ops;
    assert_eq!(
        ops,
        vec![
            KvOp::Stored {
                tier: Tier::Gpu,
                lane: 0,
                parent_ext: None,
                blocks: [(1, want[0]), (2, want[1])].map(BlockHashes::from).to_vec()
            },
            KvOp::Stored {
                tier: Tier::Disk,
                lane: 0,
                parent_ext: Some(2),
                blocks: [(3, want[2])].map(BlockHashes::from).to_vec()
            },
        ]
    );
    // A lazy CPU offload of 2 and 3, by hash only, gets its locals and its parent from what
    // the earlier stores said.
    let lazy = on("CPU", stored(&[2, 3], None, vec![]));
    let sglang = on("CPU_PINNED", stored(&[1], None, vec![]));
    let unseen = on("CPU", stored(&[9], None, vec![]));
    let ops = s.accept(1, 2, &batch(vec![lazy, sglang, unseen, on("external", removed(&[3]))]), &m).ops;
    assert_eq!(
        ops,
        vec![
            KvOp::Stored {
                tier: Tier::Host,
                lane: 0,
                parent_ext: Some(1),
                blocks: [(2, want[1]), (3, want[2])].map(BlockHashes::from).to_vec()
            },
            KvOp::Stored {
                tier: Tier::Host,
                lane: 0,
                parent_ext: None,
                blocks: [(1, want[0])].map(BlockHashes::from).to_vec()
            },
            KvOp::Removed { tier: Tier::External, lane: 0, exts: vec![3] },
        ]
    );
    assert_eq!(m.get("refused_unknown_parent"), Some(1), "a block never stored with tokens");
    // Off the GPU but still on the host: still known, so a disk offload of it completes.
    s.accept(2, 3, &batch(vec![removed(&[1, 2])]), &m);
    assert_eq!(s.tracked(), 3);
    let ops = s.accept(3, 4, &batch(vec![on("disk", stored(&[2], None, vec![]))]), &m).ops;
    assert_eq!(
        ops,
        vec![KvOp::Stored {
            tier: Tier::Disk,
            lane: 0,
            parent_ext: Some(1),
            blocks: [(2, want[1])].map(BlockHashes::from).to_vec()
        }]
    );
    // Removed from every tier that held it: forgotten.
    s.accept(4, 5, &batch(vec![on("cpu", removed(&[1, 2, 3])), on("DISK", removed(&[2, 3]))]), &m);
    assert_eq!(s.tracked(), 0);
}

#[test]
fn sequence_policy() {
    let m = BridgeMetrics::default();
    let mut s = Session::new(BS, 1_000);
    // A bridge joining a running engine: the first seq > 0 is a gap from 0.
    assert_eq!(s.classify(5, 50), Arrival::Gap { from: 0 });
    assert_eq!(s.classify(0, 0), Arrival::InOrder);
    s.accept(0, 0, &batch(vec![]), &m);
    s.accept(1, 10, &batch(vec![]), &m);
    assert_eq!(s.classify(2, 20), Arrival::InOrder);
    assert_eq!(s.classify(4, 40), Arrival::Gap { from: 2 });
    // At-least-once delivery: the same seq and payload again is a duplicate …
    assert_eq!(s.classify(1, 10), Arrival::Duplicate);
    // … a different payload at an old seq is a restarted engine.
    assert_eq!(s.classify(0, 99), Arrival::Restart);
    assert_eq!(s.classify(1, 11), Arrival::Restart);
    s.restart();
    assert_eq!((s.epoch(), s.last_seq()), (1_001, None));
    assert_eq!(s.classify(0, 99), Arrival::InOrder);
    // After a restart whose first messages were missed: a gap from 0.
    assert_eq!(s.classify(3, 99), Arrival::Gap { from: 0 });
}

#[tokio::test]
async fn bad_endpoints_are_refused_before_anything_is_published() {
    use prefixlog_bridge::{run, BridgeOptions, EngineSpec};
    use prefixlog_ingest::{KafkaConnection, LogSpec, Publisher};
    let publisher = Publisher::new(&LogSpec::new(KafkaConnection::new("127.0.0.1:1"), "t", 1)).unwrap();
    let spec = EngineSpec {
        endpoint: "tcp://127.0.0.1:5557".into(),
        replay_endpoint: Some("nonsense".into()),
        worker: 9,
        dp_rank: None,
        topic: String::new(),
    };
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let opts = BridgeOptions::new(prefixlog_engine::KeyspaceId::new("m", BS, 1));
    let exported = prefixlog_bridge::metrics::BridgeCollector::default();
    let err = run(vec![spec], opts, publisher, false, rx, &exported).await.unwrap_err();
    assert!(err.to_string().contains("nonsense"), "{err}");
}

/// A worker's `WorkerAdded` metadata names it for gateways: the serving URL under its own key,
/// the ZeroMQ endpoints (one per dp rank) under theirs, never mixed up.
#[test]
fn worker_metadata_names_the_serving_url_and_the_kv_event_endpoints_apart() {
    use prefixlog_bridge::{
        worker_metadata, BridgeOptions, EngineSpec, META_KV_EVENTS, META_POD, META_SERVING_URL,
    };
    let engine = |endpoint: &str, dp| EngineSpec {
        endpoint: endpoint.into(),
        replay_endpoint: None,
        worker: 5,
        dp_rank: Some(dp),
        topic: String::new(),
    };
    let engines = [engine("tcp://10.0.0.5:5557", 0), engine("tcp://10.0.0.5:5558", 1)];
    let mut opts = BridgeOptions::new(prefixlog_engine::KeyspaceId::new("m", BS, 1));
    opts.serving_urls.insert(5, "http://10.0.0.5:8000".into());
    opts.worker_metadata.insert(META_POD.into(), "vllm-0".into());
    let m = worker_metadata(&opts, 5, engines.iter());
    assert_eq!(m[META_SERVING_URL], "http://10.0.0.5:8000");
    assert_eq!(m[META_KV_EVENTS], "tcp://10.0.0.5:5557,tcp://10.0.0.5:5558");
    assert_eq!((m[META_POD].as_str(), m["model"].as_str(), m["block_size"].as_str()), ("vllm-0", "m", "4"));
    assert!(!m.contains_key("endpoint"), "{m:?}");
    // A worker without a known serving URL has no serving_url (gateways skip it), not a guess.
    assert!(!worker_metadata(&opts, 6, engines.iter()).contains_key(META_SERVING_URL));
}
