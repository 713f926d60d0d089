//! The Dynamo HTTP indexer facade end to end: embedded Kafka, a replica serving Dynamo's routes
//! on its own port, and a plain HTTP/1.1 client written from the documented JSON
//! (docs/compat/dynamo-mooncake-http.md), not from this crate's types. Workers' blocks published
//! on the log are answered per instance and dp rank in tokens, as upstream's indexer answers
//! (its differential test against ai-dynamo-runtime is `tests/upstream/test_dynamo_http.py`);
//! `/workers` lists the workers the bridge announced, from their metadata.

mod support;

use prefixlog_engine::scheme::{self, dynamo_block_hashes, dynamo_seed, DYNAMO_SEED};
use prefixlog_engine::KeyspaceId;
use prefixlog_facades::http::limit::{BodyLimits, Limits};
use prefixlog_facades::http::HttpIndexerExtension;
use prefixlog_facades::sglang::{SglangConfig, SglangExtension};
use prefixlog_ingest::Publisher;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::Extensions;
use prefixlog_state::record::{KvOp, Lifecycle, Tier};
use prefixlog_state::token_of;
use prefixlog_state::BlockHashes;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use support::http;
use tokio::io::AsyncWriteExt;

const BLOCK: u32 = 4;

fn stored_on(tier: Tier, locals: &[u64]) -> Vec<KvOp> {
    vec![KvOp::Stored {
        tier,
        lane: 0,
        parent_ext: None,
        blocks: locals.iter().map(|&l| (l, l)).map(BlockHashes::from).collect(),
    }]
}

fn stored(locals: &[u64]) -> Vec<KvOp> {
    stored_on(Tier::Gpu, locals)
}

fn added(pairs: &[(&str, &str)]) -> Lifecycle {
    Lifecycle::Added { metadata: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
}

/// Dynamo's i64 block hashes of `tokens` (what `/query_by_hash` carries).
fn signed(h: &[u64]) -> Vec<i64> {
    h.iter().map(|&h| h as i64).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamo_client_sees_each_instance_match_in_tokens() {
    let s = support::serve("prefixlog.dynamo", 2, Default::default()).await;
    let (p, addr) = (Publisher::new(&s.spec).unwrap(), s.addr);
    let tokens: Vec<u32> = (100..116).collect();
    let dynamo = dynamo_block_hashes(DYNAMO_SEED, &tokens, BLOCK as usize);
    let lora = dynamo_block_hashes(dynamo_seed("sql", ""), &tokens, BLOCK as usize);
    let chain = scheme::block_hashes(&tokens, BLOCK as usize);
    let by_hash = KeyspaceId::new("llama", BLOCK, 2);
    let by_chain = KeyspaceId::new("llama", BLOCK, 1);
    let mut landed = Vec::new();
    let llama = [("model", "llama"), ("block_size", "4")];
    for (w, group) in [(1, None), (2, None), (3, Some("blue")), (4, None)] {
        let mut meta = llama.to_vec();
        meta.extend(group.map(|g| ("routing_group", g)));
        landed.push(p.publish_lifecycle(w, &added(&meta)).await.unwrap());
    }
    for (w, dp, ks, seq, ops) in [
        // Worker 1: three blocks on the GPU in Dynamo's scheme, the fourth in host memory, and a
        // LoRA adapter's first block.
        (1, 0, &by_hash, 1, stored(&dynamo[..3])),
        (1, 0, &by_hash, 2, stored_on(Tier::Host, &dynamo[..4])),
        (1, 0, &by_hash, 3, stored(&lora[..1])),
        // Worker 2 (rank 1): one block in prefixlog's chain (a bridge of the default scheme).
        (2, 1, &by_chain, 1, stored(&chain[..1])),
        // Worker 3 is in another routing group, with everything; worker 4 holds other blocks.
        (3, 0, &by_hash, 1, stored(&dynamo)),
        (4, 0, &by_hash, 1, stored(&[77])),
    ] {
        landed.push(p.publish_kv_events(ks, w, dp, 1, seq, false, &ops, None).await.unwrap());
    }
    assert!(s.node.status().wait_for(&token_of(&landed), Duration::from_secs(60)).await);

    let query = json!({"token_ids": (100..118).collect::<Vec<u32>>(), "model_name": "llama"});
    let (code, v) = support::when_ready(addr, "POST", "/query", Some(query.clone())).await;
    // Upstream lists the instances that match something, in tokens; worker 4 matches nothing.
    assert_eq!(
        (code, &v),
        (
            200,
            &json!({
                "scores": {"1": {"0": 12}, "2": {"1": 4}},
                "frequencies": [],
                "instances": {
                    "1": {"longest_matched": 16, "gpu": 12, "dp": {"0": 12}, "cpu": 16, "disk": 16},
                    "2": {"longest_matched": 4, "gpu": 4, "dp": {"1": 4}, "cpu": 4, "disk": 4}
                }
            })
        )
    );
    let (_, v) = http(
        addr,
        "POST",
        "/query",
        Some(json!({"token_ids": tokens, "model_name": "llama", "lora_name": "sql"})),
    )
    .await;
    assert_eq!(v["scores"], json!({"1": {"0": 4}}), "the adapter's own blocks only: {v}");
    let blue = json!({"token_ids": tokens, "model_name": "llama", "routing_group": "blue"});
    assert_eq!(http(addr, "POST", "/query", Some(blue)).await.1["scores"], json!({"3": {"0": 16}}));
    // Dynamo's own hashes: the scheme-2 keyspace only (worker 2's chain is prefixlog's).
    let (_, v) = http(
        addr,
        "POST",
        "/query_by_hash",
        Some(json!({"block_hashes": signed(&dynamo), "model_name": "llama"})),
    )
    .await;
    assert_eq!(v["scores"], json!({"1": {"0": 12}}), "{v}");
    assert_eq!(v["instances"]["1"]["cpu"], 16, "{v}");
    // A prompt far over prefixlog.v1's 8,192-block limit: upstream answers it, so does the facade.
    let mut long = tokens.clone();
    long.extend(std::iter::repeat_n(5, 100_000));
    let (code, v) =
        http(addr, "POST", "/query", Some(json!({"token_ids": long, "model_name": "llama"}))).await;
    assert_eq!((code, &v["scores"]), (200, &json!({"1": {"0": 12}, "2": {"1": 4}})), "{v}");
    // Less than a block: nothing to match, an empty answer.
    let (_, v) = http(addr, "POST", "/query", Some(json!({"token_ids": [1], "model_name": "llama"}))).await;
    assert_eq!(v, json!({"scores": {}, "frequencies": [], "instances": {}}));

    // No worker of the model in the group: upstream's 404, with its words.
    for (model, group) in [("gpt", "default"), ("llama", "x"), ("llama", "")] {
        let q = json!({"token_ids": tokens, "model_name": model, "routing_group": group});
        let (code, v) = http(addr, "POST", "/query", Some(q)).await;
        let msg = format!("no indexer for model={model} routing_group={group}");
        assert_eq!((code, v), (404, json!({"error": msg})));
    }
    let salted = json!({"block_hashes": [1], "model_name": "llama", "cache_salt": "s"});
    let (code, v) = http(addr, "POST", "/query_by_hash", Some(salted)).await;
    assert_eq!(code, 400);
    assert!(v["error"].as_str().unwrap().starts_with("cache_salt is not accepted by /query_by_hash"), "{v}");
    bodies_are_read_as_upstream_reads_them(addr).await;
    a_worker_that_changes_group_is_answered_in_its_new_one(&s, &p, &tokens).await;

    let text = prefixlog_query::metrics::render(s.node.registry());
    let ok = r#"prefixlog_facade_requests_total{code="OK",protocol="dynamo-http",rpc="query_by_hash",shard="all"} 1"#;
    assert!(text.contains(ok), "{text}");
    assert!(text.contains(r#"code="NOT_FOUND",protocol="dynamo-http",rpc="query",shard="all"} 4"#), "{text}");
}

/// The facade keeps each `(model, routing_group)`'s indexer between queries while nothing is
/// applied: worker 3 announced again in the default group is answered there at once, and the
/// blue group, now empty, is upstream's 404.
async fn a_worker_that_changes_group_is_answered_in_its_new_one(
    s: &support::Served,
    p: &Publisher,
    tokens: &[u32],
) {
    let addr = s.addr;
    let default = json!({"token_ids": tokens, "model_name": "llama"});
    let blue = json!({"token_ids": tokens, "model_name": "llama", "routing_group": "blue"});
    for _ in 0..2 {
        assert_eq!(http(addr, "POST", "/query", Some(default.clone())).await.1["scores"].get("3"), None);
        assert_eq!(http(addr, "POST", "/query", Some(blue.clone())).await.0, 200);
    }
    let moved = p.publish_lifecycle(3, &added(&[("model", "llama"), ("block_size", "4")])).await.unwrap();
    assert!(s.node.status().wait_for(&token_of(&[moved]), Duration::from_secs(60)).await);
    let (_, v) = http(addr, "POST", "/query", Some(default)).await;
    assert_eq!(v["scores"]["3"], json!({"0": 16}), "worker 3 in the default group: {v}");
    let (code, v) = http(addr, "POST", "/query", Some(blue)).await;
    assert_eq!((code, v), (404, json!({"error": "no indexer for model=llama routing_group=blue"})));
}

/// axum's `Json` extractor, as upstream's: 415 without a JSON content type, 400 for what is not
/// JSON, 422 for JSON of another shape (its text names the field), `/health` an empty 200.
async fn bodies_are_read_as_upstream_reads_them(addr: std::net::SocketAddr) {
    let q = br#"{"token_ids": [1], "model_name": "llama"}"#;
    let (code, ctype, body) = support::raw(addr, "POST /query HTTP/1.1", q).await;
    assert_eq!(
        (code, ctype.as_str(), body.as_str()),
        (415, "text/plain; charset=utf-8", "Expected request with `Content-Type: application/json`")
    );
    let json_head = "POST /query HTTP/1.1\r\nContent-Type: application/json";
    let (code, _, body) = support::raw(addr, json_head, b"{").await;
    assert_eq!(
        (code, body.as_str()),
        (400, "Failed to parse the request body as JSON: EOF while parsing an object at line 1 column 1")
    );
    let (code, _, body) = support::raw(addr, json_head, br#"{"token_ids": [-1], "model_name": "m"}"#).await;
    let want = "Failed to deserialize the JSON body into the target type: token_ids[0]: invalid value: integer `-1`, expected u32 at line 1 column 17";
    assert_eq!((code, body.as_str()), (422, want));
    let (code, _, body) = support::raw(addr, json_head, b"[]").await;
    assert_eq!((code, body.as_str()), (422, "Failed to deserialize the JSON body into the target type: invalid length 0, expected struct QueryRequest with 6 elements at line 1 column 2"));
    let (code, ctype, body) = support::raw(addr, "GET /health HTTP/1.1", b"").await;
    assert_eq!((code, ctype.as_str(), body.as_str()), (200, "", ""));
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

/// A client sending its body slowly holds none of the bounded places in flight (a place is
/// taken once the body has arrived): with the bound at 1, other queries are answered while it
/// trickles, `/health` answers, and the slow one is answered 408 once it misses the body
/// deadline (shortened here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_takes_no_place_and_others_are_answered() {
    let kafka = EmbeddedKafka::start("prefixlog.dynamo.slow", 1).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.dynamo.slow", 1);
    let limits = Limits { max_in_flight: 1, request_timeout: Duration::from_secs(3600) };
    let bodies = BodyLimits { timeout: Duration::from_secs(3), ..BodyLimits::default() };
    let ext = HttpIndexerExtension::bind("127.0.0.1:0".parse().unwrap())
        .unwrap()
        .with_limits(limits)
        .with_bodies(bodies);
    let ext = Arc::new(ext);
    let addr = ext.addr();
    let opts = NodeOptions { ready_lag: 0, extensions: Extensions(vec![ext]), ..Default::default() };
    let node = ReplicaNode::start(spec, opts).await.unwrap();
    let query = json!({"token_ids": [1, 2, 3, 4], "model_name": "m"});
    // Ready first, so queries are answered (404: no such model, not 503).
    assert_eq!(support::when_ready(addr, "POST", "/query", Some(query.clone())).await.0, 404);

    let in_flight = |n: u64| {
        let text = prefixlog_query::metrics::render(node.registry());
        let gauge = text.lines().find(|l| l.starts_with("prefixlog_facade_http_in_flight{"));
        let gauge = gauge.expect("the gauge is registered");
        assert!(gauge.contains(r#"protocol="dynamo-http""#), "{gauge}");
        gauge.ends_with(&format!(" {n}"))
    };
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /query HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(b"{\"token_ids\": [").await.unwrap();

    for _ in 0..3 {
        let (status, answer) = http(addr, "POST", "/query", Some(query.clone())).await;
        assert_eq!(status, 404, "the only place is free while a body trickles: {answer}");
    }
    assert_eq!(http(addr, "GET", "/health", None).await.0, 200, "health is not bounded");
    assert!(in_flight(0), "a body being received takes no place");

    let mut answer = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut slow, &mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "the slow body misses its deadline: {answer}");
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
            "endpoints": {"0": "tcp://a:5557", "1": "tcp://a:5558"},
            "listeners": {
                "0": {"endpoint": "tcp://a:5557", "status": "active"},
                "1": {"endpoint": "tcp://a:5558", "status": "active"}
            }
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
        // A filter given is compared as given, even empty (upstream).
        ("?model_name=", vec![]),
    ] {
        let (code, v) = http(s.addr, "GET", &format!("/workers{query}"), None).await;
        assert_eq!((code, ids(&v)), (200, want), "{query}: {v}");
    }
    let text = prefixlog_query::metrics::render(s.node.registry());
    let ok =
        r#"prefixlog_facade_requests_total{code="OK",protocol="dynamo-http",rpc="workers",shard="all"} 7"#;
    assert!(text.contains(ok), "{text}");
}
