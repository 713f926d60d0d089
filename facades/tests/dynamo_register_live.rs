//! The Dynamo dialect's writes and dump end to end, on an embedded broker: `/register` writes a
//! registration to the log and its registrar replica (and only it) subscribes to the engine,
//! also after a restart; `/unregister` removes it; `/dump` gives what each holder holds as
//! Dynamo's router events. Engines' events end to end are `tests/upstream/test_dynamo_http.py`
//! (vLLM's own publisher, against the real `dynamo.indexer`).

mod support;

use prefixlog_engine::scheme::{dynamo_block_hashes, DYNAMO_SEED};
use prefixlog_engine::KeyspaceId;
use prefixlog_facades::http::Dialect;
use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, LogSpec, Publisher};
use prefixlog_node::ReplicaNode;
use prefixlog_state::record::{KvOp, Lifecycle, Tier};
use prefixlog_state::token_of;
use prefixlog_state::BlockHashes;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;
use support::{http, replica, when_ready};

/// Whether `node` runs a subscription to `endpoint` (its bridge metrics are exported).
fn subscribed(node: &ReplicaNode, endpoint: &str) -> bool {
    let text = prefixlog_query::metrics::render(node.registry());
    text.lines().any(|l| l.starts_with("prefixlog_bridge_messages_received_total{") && l.contains(endpoint))
}

/// Asks `cond` until it holds, a bounded number of times.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not after 1000 tries");
}

fn reg(worker: u64, dp: u32, endpoint: &str, block_size: u32) -> Value {
    json!({"instance_id": worker, "endpoint": endpoint, "model_name": "llama", "block_size": block_size, "dp_rank": dp})
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    when_ready(addr, "POST", path, Some(body)).await
}

const EP0: &str = "tcp://127.0.0.1:1";
const EP1: &str = "tcp://127.0.0.1:2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_is_fed_by_its_registrar_only_also_after_a_restart() {
    let topic = "prefixlog.dynamo.register";
    let kafka = EmbeddedKafka::start(topic, 2).unwrap();
    let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), topic, 2);
    let (a, a_addr) = replica(&spec, "a", Dialect::Dynamo).await;
    assert_eq!(post(a_addr, "/register", reg(5, 0, EP0, 4)).await, (201, json!({"status": "ok"})));
    assert!(subscribed(&a, EP0), "the registrar subscribes at once");
    let (_, v) = http(a_addr, "GET", "/workers", None).await;
    assert_eq!(
        v,
        json!([{
            "instance_id": 5, "source": "zmq", "status": "active", "model_name": "llama",
            "routing_group": "default", "block_size": 4, "endpoints": {"0": EP0},
            "listeners": {"0": {"endpoint": EP0, "status": "active"}}
        }])
    );
    // Upstream's conflicts, in its words.
    for (body, code, error) in [
        (reg(5, 0, EP0, 4), 409, "instance 5 dp_rank 0 already registered"),
        (
            json!({"instance_id": 5, "endpoint": EP1, "model_name": "gpt", "block_size": 4, "dp_rank": 1}),
            409,
            "instance 5 is already registered for model=llama routing_group=default",
        ),
        (
            reg(6, 0, EP1, 8),
            409,
            "block_size mismatch for model=llama routing_group=default: existing=4, requested=8",
        ),
        (reg(6, 0, "tcp://h", 4), 400, "invalid ZMQ endpoint `tcp://h`: missing TCP port"),
    ] {
        let (c, v) = post(a_addr, "/register", body).await;
        assert_eq!((c, v["error"].as_str()), (code, Some(error)), "{v}");
    }
    // A worker announced by another publisher is not taken over.
    let p = Publisher::new(&spec).unwrap();
    let bridge_meta = [("model", "llama"), ("block_size", "4"), ("kv_events_endpoint", "tcp://b:1")];
    let announced = Lifecycle::Added {
        metadata: bridge_meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
    };
    let landed = p.publish_lifecycle(8, &announced).await.unwrap();
    assert!(a.status().wait_for(&token_of(&[landed]), Duration::from_secs(30)).await);
    let (c, v) = post(a_addr, "/register", reg(8, 0, EP1, 4)).await;
    assert_eq!(c, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("announced on the log by another publisher"), "{v}");

    // Another replica of the log knows the registration and does not subscribe; it refuses to
    // change a registration replica a feeds.
    let (b, b_addr) = replica(&spec, "b", Dialect::Dynamo).await;
    let (_, v) = when_ready(b_addr, "GET", "/workers?model_name=llama", None).await;
    assert_eq!(v[0]["listeners"], json!({"0": {"endpoint": EP0, "status": "active"}}), "{v}");
    for (path, body) in
        [("/register", reg(5, 1, EP1, 4)), ("/unregister", json!({"instance_id": 5, "model_name": "llama"}))]
    {
        let (c, v) = post(b_addr, path, body).await;
        assert_eq!(c, 409, "{v}");
        assert!(v["error"].as_str().unwrap().contains("registered through replica a"), "{v}");
    }
    assert!(!subscribed(&b, EP0));

    // Replica a restarts (same id): it subscribes again, from the log.
    a.shutdown().await.unwrap();
    let (a, a_addr) = replica(&spec, "a", Dialect::Dynamo).await;
    until("the restarted registrar subscribes again", || subscribed(&a, EP0)).await;
    assert!(!subscribed(&b, EP0), "still one subscriber");
    assert_eq!(post(a_addr, "/register", reg(5, 1, EP1, 4)).await.0, 201);
    until("both ranks subscribed", || subscribed(&a, EP0) && subscribed(&a, EP1)).await;

    // One rank unregistered: its subscription stops, the other stays; then the instance.
    let one = json!({"instance_id": 5, "model_name": "llama", "routing_group": "default", "dp_rank": 1});
    assert_eq!(post(a_addr, "/unregister", one.clone()).await, (200, json!({"status": "ok"})));
    assert!(subscribed(&a, EP0) && !subscribed(&a, EP1));
    let (c, v) = post(a_addr, "/unregister", one).await;
    assert_eq!((c, v), (404, json!({"error": "instance 5 dp_rank 1 not found"})));
    let (_, v) = http(a_addr, "GET", "/workers?model_name=llama", None).await;
    let ranks: Vec<&Value> =
        v.as_array().unwrap().iter().filter(|w| w["instance_id"] == 5).map(|w| &w["endpoints"]).collect();
    assert_eq!(ranks, vec![&json!({"0": EP0})], "{v}");
    assert_eq!(post(a_addr, "/unregister", json!({"instance_id": 5, "model_name": "llama"})).await.0, 200);
    assert!(!subscribed(&a, EP0));
    let (c, v) = post(a_addr, "/unregister", json!({"instance_id": 5, "model_name": "llama"})).await;
    assert_eq!((c, v), (404, json!({"error": "instance 5 not found"})));
    let text = prefixlog_query::metrics::render(a.registry());
    assert!(text.contains(r#"code="OK",protocol="dynamo-http",rpc="unregister",shard="all"} 2"#), "{text}");
    b.kill().await;
}

fn stored(tier: Tier, parent: Option<u64>, blocks: &[BlockHashes]) -> Vec<KvOp> {
    vec![KvOp::Stored { tier, lane: 0, parent_ext: parent, blocks: blocks.to_vec() }]
}

/// `(worker, dp, tier, parent_hash, [(block_hash, tokens_hash)])`: one stored event.
type Event = (u64, u64, String, Option<u64>, Vec<BlockHashes>);

/// Every event of an indexer of a dump.
fn events(v: &Value, key: &str) -> BTreeSet<Event> {
    let ix = &v[key];
    ix["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{key}: {v}"))
        .iter()
        .map(|e| {
            let s = &e["event"]["data"]["stored"];
            assert_eq!(
                (&e["residency_domain"], &s["start_position"]),
                (&json!("worker"), &Value::Null),
                "{e}"
            );
            let blocks = s["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| (b["block_hash"].as_u64().unwrap(), b["tokens_hash"].as_u64().unwrap()))
                .map(BlockHashes::from)
                .collect();
            (
                e["worker_id"].as_u64().unwrap(),
                e["event"]["dp_rank"].as_u64().unwrap(),
                e["storage_tier"].as_str().unwrap().to_string(),
                s["parent_hash"].as_u64(),
                blocks,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dump_gives_each_holders_blocks_as_dynamo_router_events() {
    let s = support::serve("prefixlog.dynamo.dump", 2, Dialect::Dynamo).await;
    let p = Publisher::new(&s.spec).unwrap();
    let t: Vec<u32> = (1..=16).collect();
    let h = dynamo_block_hashes(DYNAMO_SEED, &t, 4);
    let ks = KeyspaceId::new("llama", 4, 2);
    let meta = |group: Option<&str>, model: &str, bs: &str| {
        let mut m: Vec<(String, String)> =
            vec![("model".into(), model.into()), ("block_size".into(), bs.into())];
        m.extend(group.map(|g| ("routing_group".to_string(), g.to_string())));
        Lifecycle::Added { metadata: m.into_iter().collect() }
    };
    let mut landed = vec![
        p.publish_lifecycle(1, &meta(None, "llama", "4")).await.unwrap(),
        p.publish_lifecycle(2, &meta(Some("blue"), "llama", "4")).await.unwrap(),
        p.publish_lifecycle(9, &meta(None, "mistral", "16")).await.unwrap(),
    ];
    // Worker 1: a chain of three, a branch under the first, the first also in host memory.
    for (seq, ops) in [
        (1, stored(Tier::Gpu, None, &[(11, h[0]), (12, h[1]), (13, h[2])].map(BlockHashes::from))),
        (2, stored(Tier::Gpu, Some(11), &[(14, h[3])].map(BlockHashes::from))),
        (3, stored(Tier::Host, None, &[(11, h[0])].map(BlockHashes::from))),
    ] {
        landed.push(p.publish_kv_events(&ks, 1, 0, 1, seq, false, &ops, None).await.unwrap());
    }
    // Worker 2 (group blue) names the first block by another engine hash.
    let ops = stored(Tier::Gpu, None, &[(21, h[0])].map(BlockHashes::from));
    landed.push(p.publish_kv_events(&ks, 2, 1, 1, 1, false, &ops, None).await.unwrap());
    // A scheme-1 keyspace's locals are not Dynamo's: not dumped.
    let chain = KeyspaceId::new("llama", 4, 1);
    landed.push(
        p.publish_kv_events(
            &chain,
            1,
            0,
            1,
            1,
            false,
            &stored(Tier::Gpu, None, &[(31, 31)].map(BlockHashes::from)),
            None,
        )
        .await
        .unwrap(),
    );
    assert!(s.node.status().wait_for(&token_of(&landed), Duration::from_secs(60)).await);

    let (code, v) = when_ready(s.addr, "GET", "/dump", None).await;
    assert_eq!(code, 200, "{v}");
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["llama:blue", "llama:default", "mistral:default"], "{v}");
    assert_eq!(
        (&v["llama:default"]["block_size"], &v["mistral:default"]),
        (&json!(4), &json!({"block_size": 16, "events": []}))
    );
    let dev = |w, dp, parent, blocks: &[BlockHashes]| (w, dp, "device".to_string(), parent, blocks.to_vec());
    assert_eq!(
        events(&v, "llama:default"),
        BTreeSet::from([
            dev(1, 0, None, &[(11, h[0])].map(BlockHashes::from)),
            dev(1, 0, Some(11), &[(12, h[1]), (13, h[2])].map(BlockHashes::from)),
            dev(1, 0, Some(11), &[(14, h[3])].map(BlockHashes::from)),
            (1, 0, "host_pinned".to_string(), None, [(11, h[0])].map(BlockHashes::from).to_vec()),
        ])
    );
    assert_eq!(
        events(&v, "llama:blue"),
        BTreeSet::from([dev(2, 1, None, &[(21, h[0])].map(BlockHashes::from))])
    );

    // Removing the middle of the chain cuts off what is below it, as upstream's tree does.
    let removed = [KvOp::Removed { tier: Tier::Gpu, lane: 0, exts: vec![12] }];
    let landed = p.publish_kv_events(&ks, 1, 0, 1, 4, false, &removed, None).await.unwrap();
    assert!(s.node.status().wait_for(&token_of(&[landed]), Duration::from_secs(60)).await);
    let (_, v) = http(s.addr, "GET", "/dump", None).await;
    let device: BTreeSet<_> = events(&v, "llama:default").into_iter().filter(|e| e.2 == "device").collect();
    // (The first block has one child left: one chain.)
    assert_eq!(device, BTreeSet::from([dev(1, 0, None, &[(11, h[0]), (14, h[3])].map(BlockHashes::from))]));
}
