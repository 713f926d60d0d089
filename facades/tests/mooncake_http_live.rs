//! The HTTP indexer facade in the Mooncake dialect end to end: embedded Kafka, a replica
//! serving Mooncake conductor's `/query` on its own port, and a plain HTTP/1.1 client written
//! from the documented JSON (docs/compat/dynamo-mooncake-http.md), not from this crate's types.
//! Workers' blocks published on the log are answered per tenant and instance, in tokens.

mod support;

use prefixlog_engine::{scheme, KeyspaceId};
use prefixlog_facades::http::Dialect;
use prefixlog_ingest::Publisher;
use prefixlog_state::record::{KvOp, Lifecycle, Tier};
use prefixlog_state::token_of;
use prefixlog_state::BlockHashes;
use serde_json::{json, Value};
use std::time::Duration;
use support::http;

fn stored(locals: &[u64]) -> Vec<KvOp> {
    vec![KvOp::Stored {
        tier: Tier::Gpu,
        lane: 0,
        parent_ext: None,
        blocks: locals.iter().map(|&l| (l, l)).map(BlockHashes::from).collect(),
    }]
}

fn added(pairs: &[(&str, &str)]) -> Lifecycle {
    Lifecycle::Added { metadata: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
}

/// A Mooncake `/query` body for `tokens` with `extra` fields merged in.
fn query(tokens: &[u32], block_size: u32, extra: Value) -> Value {
    let mut q = json!({"model": "llama", "token_ids": tokens, "block_size": block_size});
    q.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    q
}

/// One instance's entry as upstream's example shapes it: tokens, GPU only (CPU, DISK 0).
fn hits(gpu: u64, dp: Value) -> Value {
    json!({"longest_matched": gpu, "GPU": gpu, "DP": dp, "CPU": 0, "DISK": 0})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mooncake_client_sees_each_instance_of_its_tenant_in_tokens() {
    let s = support::serve("prefixlog.mooncake", 2, Dialect::Mooncake).await;
    let tokens: Vec<u32> = (100..116).collect();
    let by_4 = KeyspaceId::new("llama", 4, 1);
    let by_8 = KeyspaceId::new("llama", 8, 1);
    let chain4 = scheme::block_hashes(&tokens, 4);
    let chain8 = scheme::block_hashes(&tokens, 8);
    let p = Publisher::new(&s.spec).unwrap();
    let mut landed = Vec::new();
    // Worker 1 is instance "vllm-a" of tenant acme; worker 3 is of acme without an instance
    // name; worker 2 recorded nothing (tenant default, instance "2").
    for (w, meta) in [
        (1, vec![("tenant_id", "acme"), ("instance_id", "vllm-a")]),
        (3, vec![("tenant_id", "acme")]),
        (5, vec![("tenant_id", "offload")]),
    ] {
        landed.push(p.publish_lifecycle(w, &added(&meta)).await.unwrap());
    }
    for (w, dp, ks, blocks) in [
        (1, 0, &by_4, &chain4[..3]),
        (1, 1, &by_4, &chain4[..1]),
        (3, 0, &by_4, &chain4[..2]),
        (2, 0, &by_4, &chain4[..]),
        (2, 0, &by_8, &chain8[..1]),
    ] {
        landed.push(p.publish_kv_events(ks, w, dp, 1, 1, false, &stored(blocks), None).await.unwrap());
    }
    // Worker 5 offloads: its first block on the GPU, the first three in host memory, the
    // fourth on disk under a parent in host memory.
    let on = |tier, parent_ext, blocks: &[u64]| KvOp::Stored {
        tier,
        lane: 0,
        parent_ext,
        blocks: blocks.iter().map(|&l| (l, l)).map(BlockHashes::from).collect(),
    };
    let offloaded = [
        on(Tier::Gpu, None, &chain4[..1]),
        on(Tier::Host, None, &chain4[..3]),
        on(Tier::Disk, Some(chain4[2]), &chain4[3..]),
    ];
    landed.push(p.publish_kv_events(&by_4, 5, 0, 1, 1, false, &offloaded, None).await.unwrap());
    assert!(s.node.status().wait_for(&token_of(&landed), Duration::from_secs(60)).await);

    let (code, v) =
        support::when_ready(s.addr, "POST", "/query", Some(query(&tokens, 4, json!({"tenant_id": "acme"}))))
            .await;
    assert_eq!(code, 200, "{v}");
    let acme = json!({"acme": {
        "vllm-a": hits(12, json!({"0": 12, "1": 4})),
        "3": hits(8, json!({"0": 8}))
    }});
    assert_eq!(v, acme);

    // Media are each tier's own prefix; the longest match and the rank's entry span them.
    let (code, v) =
        http(s.addr, "POST", "/query", Some(query(&tokens, 4, json!({"tenant_id": "offload"})))).await;
    let five = json!({"longest_matched": 16, "GPU": 4, "DP": {"0": 16}, "CPU": 12, "DISK": 0});
    assert_eq!((code, v), (200, json!({"offload": {"5": five}})));

    // No tenant: the default one; a trailing partial block is not matched.
    let longer: Vec<u32> = (100..118).collect();
    let (code, v) = http(s.addr, "POST", "/query", Some(query(&longer, 4, json!({})))).await;
    assert_eq!((code, v), (200, json!({"default": {"2": hits(16, json!({"0": 16}))}})));

    // block_size names the keyspace.
    let (code, v) = http(s.addr, "POST", "/query", Some(query(&tokens, 8, json!({})))).await;
    assert_eq!((code, v), (200, json!({"default": {"2": hits(8, json!({"0": 8}))}})));

    let one = json!({"tenant_id": "acme", "instance_id": "vllm-a"});
    let (code, v) = http(s.addr, "POST", "/query", Some(query(&tokens, 4, one))).await;
    assert_eq!((code, v), (200, json!({"acme": {"vllm-a": hits(12, json!({"0": 12, "1": 4}))}})));
    // An instance of another tenant is not answered under this one.
    let other = json!({"tenant_id": "acme", "instance_id": "2"});
    let (code, v) = http(s.addr, "POST", "/query", Some(query(&tokens, 4, other))).await;
    assert_eq!((code, v), (200, json!({"acme": {}})));

    // A LoRA's blocks are another chain, and no block is stored salted: zeros, listed; lora_id
    // ignored.
    for extra in [json!({"lora_name": "sql"}), json!({"cache_salt": "s", "lora_id": 3})] {
        let (code, v) = http(s.addr, "POST", "/query", Some(query(&tokens, 4, extra))).await;
        assert_eq!((code, v), (200, json!({"default": {"2": hits(0, json!({"0": 0}))}})));
    }

    for (model, block_size) in [("gpt", 4), ("llama", 16)] {
        let q = json!({"model": model, "token_ids": tokens, "block_size": block_size});
        let (code, v) = http(s.addr, "POST", "/query", Some(q)).await;
        assert_eq!(code, 404, "{v}");
        let e = v["error"].as_str().unwrap();
        assert!(e.contains(&format!("model={model} block_size={block_size}")), "{v}");
    }
    // Dynamo's body is not guessed at: it lacks Mooncake's required fields.
    let dynamo = json!({"token_ids": tokens, "model_name": "llama"});
    assert_eq!(http(s.addr, "POST", "/query", Some(dynamo)).await.0, 400);

    let by_hash = json!({"model": "llama", "seq_hashes": [1, 2], "block_size": 4});
    let (code, v) = http(s.addr, "POST", "/query_by_hash", Some(by_hash)).await;
    assert_eq!(code, 501, "{v}");
    assert!(v["error"].as_str().unwrap().contains("seq_hashes"), "{v}");

    // /workers is served in Dynamo's shape in this dialect too (the announced workers).
    let (code, v) = http(s.addr, "GET", "/workers", None).await;
    let listed: Vec<u64> = v.as_array().unwrap().iter().map(|w| w["instance_id"].as_u64().unwrap()).collect();
    assert_eq!((code, listed), (200, vec![1, 3, 5]), "{v}");

    let text = prefixlog_query::metrics::render(s.node.registry());
    for series in [
        r#"{code="OK",protocol="mooncake-http",rpc="query",shard="all"} 8"#,
        r#"{code="NOT_FOUND",protocol="mooncake-http",rpc="query",shard="all"} 2"#,
        r#"{code="UNIMPLEMENTED",protocol="mooncake-http",rpc="query_by_hash",shard="all"} 1"#,
    ] {
        assert!(text.contains(&format!("prefixlog_facade_requests_total{series}")), "{series}: {text}");
    }
    assert!(!text.contains(r#"protocol="dynamo-http""#), "{text}");
}
