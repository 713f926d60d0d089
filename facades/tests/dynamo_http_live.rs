//! The Dynamo HTTP indexer facade end to end: embedded Kafka, a replica serving `/query` and
//! `/query_by_hash` on its own port, and a plain HTTP/1.1 client written from the documented
//! JSON (docs/compat/dynamo-mooncake-http.md), not from this crate's types. Two workers'
//! blocks published on the log are answered per instance and dp rank, in tokens.

use prefixlog_engine::{scheme, KeyspaceId};
use prefixlog_facades::http::limit::Limits;
use prefixlog_facades::http::DynamoHttpExtension;
use prefixlog_facades::sglang::{SglangConfig, SglangExtension};
use prefixlog_ingest::Publisher;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_query::Extensions;
use prefixlog_state::record::{KvOp, Lifecycle};
use prefixlog_state::token_of;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BLOCK: u32 = 4;

/// One HTTP/1.1 request on a fresh connection: (status, JSON body).
async fn http(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.unwrap();
    // A refused body may be cut short by the server (413 before reading it): read its answer.
    let _ = s.write_all(body.as_bytes()).await;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).expect("utf-8 response");
    let (head, payload) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    (status, serde_json::from_str(payload).unwrap_or(Value::String(payload.into())))
}

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
    vec![KvOp::Stored { lane: 0, parent_ext: None, blocks: locals.iter().map(|&l| (l, l)).collect() }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dynamo_client_sees_each_instance_match_in_tokens() {
    let kafka = EmbeddedKafka::start("prefixlog.dynamo", 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), "prefixlog.dynamo", 2);
    let ext = Arc::new(DynamoHttpExtension::bind("127.0.0.1:0".parse().unwrap()).unwrap());
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

    // A LoRA's blocks are another chain, and no block is salted: zeros, listed.
    for extra in [json!({"lora_name": "sql"}), json!({"cache_salt": "s"})] {
        let mut q = json!({"token_ids": tokens, "model_name": "llama"});
        q.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (code, v) = http(addr, "POST", "/query", Some(q)).await;
        assert_eq!((code, gpu_by_instance(&v)), (200, vec![("1".into(), 0), ("2".into(), 0)]), "{v}");
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
    let ext = Arc::new(DynamoHttpExtension::bind("127.0.0.1:0".parse().unwrap()).unwrap());
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
    let ext = DynamoHttpExtension::bind("127.0.0.1:0".parse().unwrap()).unwrap().with_limits(limits);
    let ext = Arc::new(ext);
    let addr = ext.addr();
    let opts = NodeOptions { ready_lag: 0, extensions: Extensions(vec![ext]), ..Default::default() };
    let _node = ReplicaNode::start(spec, opts).await.unwrap();
    let query = json!({"token_ids": [1, 2, 3, 4], "model_name": "m"});
    // Ready first: a replica that is not ready answers 503 before the slow body is read, and
    // that request would hold nothing (counted tries, not timed).
    let mut status = 503;
    for _ in 0..3000 {
        status = http(addr, "POST", "/query", Some(query.clone())).await.0;
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, 404, "ready: the query is answered (no such model)");

    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("POST /query HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 1000\r\n\r\n");
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(b"{\"token_ids\": [").await.unwrap();
    // The slow request reaches the server in its own time: ask until it holds the place (a
    // bounded number of tries, so a missing bound fails instead of hanging).
    let mut refused = None;
    for _ in 0..3000 {
        let (status, body) = http(addr, "POST", "/query", Some(query.clone())).await;
        if status == 429 {
            refused = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = refused.expect("a query over the bound of 1 is refused with 429");
    assert!(refused["error"].as_str().is_some_and(|e| !e.is_empty()), "{refused}");
    assert_eq!(http(addr, "GET", "/health", None).await.0, 200, "health is not bounded");

    drop(slow);
    let mut status = 429;
    for _ in 0..3000 {
        status = http(addr, "POST", "/query", Some(query.clone())).await.0;
        if status != 429 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, 404, "the place is free again: the query is answered (no such model)");
}
