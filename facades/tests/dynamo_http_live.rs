//! The Dynamo HTTP indexer facade end to end: embedded Kafka, a replica serving `/query` and
//! `/query_by_hash` on its own port, and a plain HTTP/1.1 client written from the documented
//! JSON (docs/compat/dynamo-mooncake-http.md), not from this crate's types. Two workers'
//! blocks published on the log are answered per instance and dp rank, in tokens; `/workers`
//! lists the workers the bridge announced, from their metadata.

mod support;

use prefixlog_engine::{scheme, KeyspaceId};
use prefixlog_facades::http::limit::Limits;
use prefixlog_facades::http::HttpIndexerExtension;
use prefixlog_facades::sglang::{SglangConfig, SglangExtension};
use prefixlog_ingest::Publisher;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::Extensions;
use prefixlog_state::record::{KvOp, Lifecycle, Tier};
use prefixlog_state::token_of;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use support::http;
use tokio::io::AsyncWriteExt;

const BLOCK: u32 = 4;

/// `instance → gpu tokens` of a score response, checking the documented invariants on the way.
fn gpu_by_instance(v: &Value) -> Vec<(String, u64)> {
    let instances = v["instances"].as_object().unwrap_or_else(|| panic!("no instances: {v}"));
    let mut out = Vec::new();
    for (id, i) in instances {
        let gpu = i["gpu"].as_u64().unwrap();
        let dp_max = i["dp"].as_object().unwrap().values().map(|t| t.as_u64().unwrap()).max().unwrap();
        assert_eq!(dp_max, gpu, "gpu is the best rank: {v}");
        assert_eq!(v["scores"][id], i["dp"], "scores carry the dp map: {v}");
        assert!(gpu <= i["cpu"].as_u64().unwrap() && i["cpu"].as_u64() <= i["disk"].as_u64(), "{v}");
        assert_eq!(i["longest_matched"].as_u64(), i["disk"].as_u64(), "{v}");
        out.push((id.clone(), gpu));
    }
    out
}

fn stored(locals: &[u64]) -> Vec<KvOp> {
    vec![KvOp::Stored {
        tier: Tier::Gpu,
        lane: 0,
        parent_ext: None,
        blocks: locals.iter().map(|&l| (l, l)).collect(),
    }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamo_client_sees_each_instance_match_in_tokens() {
    let kafka = EmbeddedKafka::start("prefixlog.dynamo", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.dynamo", 2);
    let ext = Arc::new(HttpIndexerExtension::bind("127.0.0.1:0".parse().unwrap()).unwrap());
    let addr = ext.addr();
    let opts = NodeOptions {
        replica_id: "a".into(),
        ready_lag: 0,
        extensions: Extensions(vec![ext]),
        ..Default::default()
    };
    let node = ReplicaNode::start(spec.clone(), opts).await.unwrap();

    let tokens: Vec<u32> = (100..116).collect();
    let chain = scheme::block_hashes(&tokens, BLOCK as usize);
    // The first two blocks as a vLLM engine run with cache_salt "s" stores them (the bridge
    // indexes salted blocks): held by worker 1 beside its plain chain.
    let salted = scheme::Namespace { cache_salt: "s", ..Default::default() };
    let salted_chain = scheme::block_hashes_with(&salted, &tokens[..8], BLOCK as usize);
    let by_tokens = KeyspaceId::new("llama", BLOCK, 1);
    let by_hash = KeyspaceId::new("llama", BLOCK, 2);
    let hashes: [i64; 3] = [-5, 22, 33];
    let locals: Vec<u64> = hashes.iter().map(|&h| h as u64).collect();
    let p = Publisher::new(&spec).unwrap();
    let mut landed = Vec::new();
    // Worker 3 is in another routing group, with everything.
    let meta = [("routing_group".to_string(), "blue".to_string())].into_iter().collect();
    landed.push(p.publish_lifecycle(3, &Lifecycle::Added { metadata: meta }).await.unwrap());
    for (w, dp, ks, blocks) in [
        (1, 0, &by_tokens, &chain[..3]),
        (2, 1, &by_tokens, &chain[..1]),
        (3, 0, &by_tokens, &chain[..]),
        (1, 0, &by_hash, &locals[..2]),
        (2, 1, &by_hash, &locals[..]),
    ] {
        landed.push(
            p.publish_kv_events(ks, w, dp, 1, 1 + ks.scheme as u64, false, &stored(blocks), None)
                .await
                .unwrap(),
        );
    }
    // Worker 1's next record in this keyspace (seq 3, after its seq 2 above: no gap).
    landed.push(
        p.publish_kv_events(&by_tokens, 1, 0, 1, 3, false, &stored(&salted_chain), None).await.unwrap(),
    );
    // Worker 2 also holds the whole chain in host memory (its seq 3): the facade answers the GPU
    // tier only, so its count stays its one GPU block.
    let host = [KvOp::Stored {
        tier: Tier::Host,
        lane: 0,
        parent_ext: None,
        blocks: chain.iter().map(|&l| (l, l)).collect(),
    }];
    landed.push(p.publish_kv_events(&by_tokens, 2, 1, 1, 3, false, &host, None).await.unwrap());
    assert!(node.status().wait_for(&token_of(&landed), Duration::from_secs(60)).await);

    let (code, v) = http(addr, "GET", "/health", None).await;
    assert_eq!((code, &v), (200, &json!({"status": "ok"})));
    // Readiness is a state, not a time: wait for it (bounded only by the test harness).
    let query = json!({"token_ids": (100..118).collect::<Vec<u32>>(), "model_name": "llama"});
    let v = loop {
        let (code, v) = http(addr, "POST", "/query", Some(query.clone())).await;
        if code != 503 {
            assert_eq!(code, 200, "{v}");
            break v;
        }
        assert!(v["error"].is_string(), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(gpu_by_instance(&v), vec![("1".into(), 12), ("2".into(), 4)], "{v}");
    assert_eq!(v["instances"]["2"]["dp"], json!({"1": 4}), "{v}");
    assert_eq!(v["frequencies"], json!([]));

    let blue = json!({"token_ids": tokens, "model_name": "llama", "routing_group": "blue"});
    let (code, v) = http(addr, "POST", "/query", Some(blue)).await;
    assert_eq!((code, gpu_by_instance(&v)), (200, vec![("3".into(), 16)]), "{v}");

    // A LoRA's blocks and another salt's are other chains: zeros, listed. Worker 1's salted
    // blocks answer a query with the same salt only.
    for (extra, one) in [
        (json!({"lora_name": "sql"}), 0),
        (json!({"cache_salt": "other"}), 0),
        (json!({"cache_salt": "s"}), 8),
    ] {
        let mut q = json!({"token_ids": tokens, "model_name": "llama"});
        q.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (code, v) = http(addr, "POST", "/query", Some(q)).await;
        assert_eq!((code, gpu_by_instance(&v)), (200, vec![("1".into(), one), ("2".into(), 0)]), "{v}");
    }

    let (code, v) =
        http(addr, "POST", "/query_by_hash", Some(json!({"block_hashes": hashes, "model_name": "llama"})))
            .await;
    assert_eq!((code, gpu_by_instance(&v)), (200, vec![("1".into(), 8), ("2".into(), 12)]), "{v}");

    let (code, v) = http(addr, "POST", "/query", Some(json!({"token_ids": [1], "model_name": "gpt"}))).await;
    assert_eq!(code, 404, "{v}");
    assert!(
        v["error"].as_str().unwrap().starts_with("no indexer for model=gpt routing_group=default"),
        "{v}"
    );
    let salted = json!({"block_hashes": [1], "model_name": "llama", "cache_salt": "s"});
    assert_eq!(http(addr, "POST", "/query_by_hash", Some(salted)).await.0, 400);
    assert_eq!(http(addr, "POST", "/query", Some(json!({"model_name": "llama"}))).await.0, 400);

    let text = prefixlog_query::metrics::render(node.registry());
    let ok = r#"prefixlog_facade_requests_total{code="OK",protocol="dynamo-http",rpc="query_by_hash",shard="all"} 1"#;
    assert!(text.contains(ok), "{text}");
    assert!(text.contains(r#"code="NOT_FOUND",protocol="dynamo-http",rpc="query",shard="all"} 1"#), "{text}");
}

/// A body over the upstream limit is refused before it is parsed; the facade runs next to the
/// SGLang one (both register their metrics in the replica's registry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_refused_next_to_the_sglang_facade() {
    let kafka = EmbeddedKafka::start("prefixlog.dynamo.big", 1).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.dynamo.big", 1);
    let ext = Arc::new(HttpIndexerExtension::bind("127.0.0.1:0".parse().unwrap()).unwrap());
    let addr = ext.addr();
    let sgl = SglangExtension::new(
        SglangConfig { model: "m".into(), block_size: 2 },
        Arc::new(Publisher::new(&spec).unwrap()),
    );
    let opts =
        NodeOptions { ready_lag: 0, extensions: Extensions(vec![Arc::new(sgl), ext]), ..Default::default() };
    let _node = ReplicaNode::start(spec, opts).await.unwrap();
    let big = json!({"token_ids": vec![1u32; 5 << 20], "model_name": "m"});
    assert_eq!(http(addr, "POST", "/query", Some(big)).await.0, 413);
}

/// A client sending its body slowly holds one of the bounded places in flight: with the bound at
/// 1, other queries are refused with 429 at once (not queued), `/health` still answers, and the
/// place is free again once that client goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_holds_the_only_place_and_others_get_429() {
    let kafka = EmbeddedKafka::start("prefixlog.dynamo.slow", 1).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.dynamo.slow", 1);
    let limits = Limits { max_in_flight: 1, request_timeout: Duration::from_secs(3600) };
    let ext = HttpIndexerExtension::bind("127.0.0.1:0".parse().unwrap()).unwrap().with_limits(limits);
    let ext = Arc::new(ext);
    let addr = ext.addr();
    let opts = NodeOptions { ready_lag: 0, extensions: Extensions(vec![ext]), ..Default::default() };
    let node = ReplicaNode::start(spec, opts).await.unwrap();
    let query = json!({"token_ids": [1, 2, 3, 4], "model_name": "m"});
    // Ready first, so the query that finds the place free again is answered (404, not 503).
    assert_eq!(support::when_ready(addr, "POST", "/query", Some(query.clone())).await.0, 404);

    // The slow request takes the place once the server has read its head; the gauge of places
    // taken says when (counted tries, not timed). Nothing else is in flight: every earlier
    // request gave its place back before its answer was written.
    let in_flight = |n: u64| {
        let text = prefixlog_query::metrics::render(node.registry());
        let gauge = text.lines().find(|l| l.starts_with("prefixlog_facade_http_in_flight{"));
        let gauge = gauge.expect("the gauge is registered");
        assert!(gauge.contains(r#"protocol="dynamo-http""#), "{gauge}");
        gauge.ends_with(&format!(" {n}"))
    };
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("POST /query HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1000\r\n\r\n");
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(b"{\"token_ids\": [").await.unwrap();
    wait_until("the slow request holds the place", || in_flight(1)).await;

    let (status, refused) = http(addr, "POST", "/query", Some(query.clone())).await;
    assert_eq!(status, 429, "a query over the bound of 1 is refused at once: {refused}");
    assert!(refused["error"].as_str().is_some_and(|e| !e.is_empty()), "{refused}");
    assert_eq!(http(addr, "GET", "/health", None).await.0, 200, "health is not bounded");
    assert!(in_flight(1), "refused queries and /health take no place");

    drop(slow);
    wait_until("the slow request's place is given back", || in_flight(0)).await;
    let status = http(addr, "POST", "/query", Some(query.clone())).await.0;
    assert_eq!(status, 404, "the place is free again: the query is answered (no such model)");
}

/// Asks `cond` until it holds, a bounded number of times (so a missing state fails, not hangs).
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..3000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not after 3000 tries");
}

fn added(pairs: &[(&str, &str)]) -> Lifecycle {
    Lifecycle::Added { metadata: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
}

/// The ids of a `/workers` answer, checking that every entry has upstream's fields.
fn ids(v: &Value) -> Vec<u64> {
    let list = v.as_array().unwrap_or_else(|| panic!("an array: {v}"));
    for w in list {
        for field in ["instance_id", "source", "status", "model_name", "routing_group", "block_size"] {
            assert!(!w[field].is_null(), "{field} missing: {v}");
        }
        assert!(w["endpoints"].is_object() && w["listeners"].is_object(), "{v}");
    }
    list.iter().map(|w| w["instance_id"].as_u64().unwrap()).collect()
}

/// `/workers` lists the workers announced with the bridge's metadata, filtered by model and
/// routing group, an empty array when nothing matches; a removed worker is no longer listed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_lists_bridge_announced_workers_by_model_and_group() {
    let s = support::serve("prefixlog.dynamo.workers", 2, Default::default()).await;
    let p = Publisher::new(&s.spec).unwrap();
    let bridge = |model: &'static str, block: &'static str, kv: &'static str| {
        vec![
            ("model", model),
            ("block_size", block),
            ("kv_events_endpoint", kv),
            ("serving_url", "http://w:8000"),
        ]
    };
    let mut blue = bridge("llama", "4", "tcp://b:5557");
    blue.push(("routing_group", "blue"));
    let mut landed = Vec::new();
    for (w, meta) in [
        (10, bridge("llama", "4", "tcp://a:5557,tcp://a:5558")),
        (11, blue),
        (12, bridge("gpt", "16", "tcp://c:5557")),
        (13, vec![("model", "llama")]),
        (14, bridge("llama", "4", "tcp://gone:5557")),
    ] {
        landed.push(p.publish_lifecycle(w, &added(&meta)).await.unwrap());
    }
    landed.push(p.publish_lifecycle(14, &Lifecycle::Removed).await.unwrap());
    assert!(s.node.status().wait_for(&token_of(&landed), Duration::from_secs(60)).await);

    let (code, v) = support::when_ready(s.addr, "GET", "/workers", None).await;
    assert_eq!((code, ids(&v)), (200, vec![10, 11, 12, 13]), "{v}");
    assert_eq!(
        v[0],
        json!({
            "instance_id": 10, "source": "zmq", "status": "active", "model_name": "llama",
            "routing_group": "default", "block_size": 4,
            "endpoints": {"0": "tcp://a:5557", "1": "tcp://a:5558"}, "listeners": {}
        }),
        "{v}"
    );
    assert_eq!((v[3]["source"].as_str(), v[3]["block_size"].as_u64()), (Some("log"), Some(0)), "{v}");

    for (query, want) in [
        ("?model_name=llama", vec![10, 11, 13]),
        ("?model_name=llama&routing_group=blue", vec![11]),
        ("?routing_group=default", vec![10, 12, 13]),
        ("?model_name=gpt&routing_group=blue", vec![]),
        ("?model_name=mistral", vec![]),
    ] {
        let (code, v) = http(s.addr, "GET", &format!("/workers{query}"), None).await;
        assert_eq!((code, ids(&v)), (200, want), "{query}: {v}");
    }
    let text = prefixlog_query::metrics::render(s.node.registry());
    let ok =
        r#"prefixlog_facade_requests_total{code="OK",protocol="dynamo-http",rpc="workers",shard="all"} 6"#;
    assert!(text.contains(ok), "{text}");
}
