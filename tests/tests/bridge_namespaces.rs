//! vLLM blocks whose `extra_keys` carry a multimodal identifier, a cache salt or a LoRA name,
//! end to end: a Python stand-in for vLLM (`python/bridge_fixtures/publisher.py serve-ns`) →
//! `prefixlog_bridge` → Kafka (every available backend) → a replica → gRPC `Match` with token
//! prompts. Each prompt is matched by a query naming the same inputs (`TokenIds.cache_salt`,
//! `TokenIds.extra`, `TokenIds.namespace`) and not by one that does not; a block keyed by
//! prompt-embeds digests is refused and counted.
//!
//! Needs a Python with pyzmq and msgpack, found as in `tests/tests/bridge.rs` (without one the
//! test prints "NOT RUN" and passes unless `PREFIXLOG_BRIDGE_E2E=required`).

use prefixlog_bridge::{self as bridge, BridgeOptions, EngineSpec};
use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::Publisher;
use prefixlog_proto::v1::{
    self, match_request::Prompt as PbPrompt, prefix_index_client::PrefixIndexClient, BlockExtraKeys,
    MatchRequest,
};
use prefixlog_tests::{kafka_backends, listen_port, replicas, unique_topic};
use std::time::{Duration, Instant};

const P: u32 = 2;
const BS: u32 = 4;
/// Mirrors `MM_ID` in the publisher.
const MM_ID: &str = "9a1f0c3e5b7d2f4a6c8e0b1d3f5a7c9e2b4d6f8a0c1e3b5d7f9a2c4e6b8d0f1a";

fn toks(base: u32, n: u32) -> Vec<u32> {
    (base..base + n).collect()
}

fn mm(blocks: &[u32], id: &str) -> Vec<BlockExtraKeys> {
    blocks.iter().map(|&block| BlockExtraKeys { block, mm_ids: vec![id.into()] }).collect()
}

/// Worker 1's depth for a token prompt with its namespace inputs, over gRPC.
async fn depth(client: &mut PrefixIndexClient<tonic::transport::Channel>, tokens: v1::TokenIds) -> u32 {
    let req = MatchRequest {
        keyspace: Some(v1::Keyspace { model: "ns-model".into(), block_size: BS, hash_scheme: 1 }),
        prompt: Some(PbPrompt::Tokens(tokens)),
        ..Default::default()
    };
    let resp = client.r#match(req).await.unwrap().into_inner();
    resp.scores.iter().find(|s| s.worker == 1).map_or(0, |s| s.depth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_keys_blocks_match_queries_naming_the_same_inputs() {
    let Some(py) = prefixlog_tests::bridge_e2e_python("bridge namespaces e2e") else { return };
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.bridge-ns");
        b.create_topic(&topic, P).await.unwrap();
        let spec = replicas::spec(&b.brokers, &topic, P);
        let r = replicas::replica(&spec, "bridge-ns").await;
        let publisher = Publisher::new(&spec).unwrap();
        let port = listen_port();
        let engines = vec![EngineSpec {
            endpoint: format!("tcp://127.0.0.1:{port}"),
            replay_endpoint: None,
            worker: 1,
            dp_rank: None,
            topic: String::new(),
        }];
        let mut opts = BridgeOptions::new(KeyspaceId::new("ns-model", BS, 1));
        opts.log_interval = Duration::ZERO;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let exported = std::sync::Arc::new(bridge::metrics::BridgeCollector::default());
        let bridge_task =
            tokio::spawn(
                async move { bridge::run(engines, opts, publisher, true, stop_rx, &exported).await },
            );
        let args = ["serve-ns".to_string(), "--port".to_string(), port.to_string()];
        prefixlog_tests::run_bridge_publisher(&py, &args, b.name).await;

        let mut client = PrefixIndexClient::connect(r.endpoint()).await.unwrap();
        let tokens = |ids: Vec<u32>| v1::TokenIds { ids, ..Default::default() };
        let salted = v1::TokenIds { cache_salt: "tenant-42".into(), ..tokens(toks(11000, 12)) };
        // The last record (the salted chain's third block) applied: everything before it is.
        let deadline = Instant::now() + Duration::from_secs(30);
        while depth(&mut client, salted.clone()).await != 3 {
            assert!(Instant::now() < deadline, "{}: the salted chain was not applied", b.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let with_image = v1::TokenIds { extra: mm(&[0, 1], MM_ID), ..tokens(toks(10000, 12)) };
        let other_image = v1::TokenIds { extra: mm(&[0, 1], "another-image"), ..with_image.clone() };
        let lora = v1::TokenIds { namespace: "sql-lora".into(), ..tokens(toks(12000, 8)) };
        let cases = [
            ("image named", with_image, 3),
            ("image not named", tokens(toks(10000, 12)), 0),
            ("another image", other_image, 0),
            ("salt named", salted.clone(), 3),
            ("salt not named", tokens(toks(11000, 12)), 0),
            ("another salt", v1::TokenIds { cache_salt: "tenant-7".into(), ..salted }, 0),
            ("LoRA named", lora.clone(), 2),
            ("LoRA not named", tokens(toks(12000, 8)), 0),
            ("prompt embeddings (refused)", tokens(toks(13000, 4)), 0),
        ];
        for (what, t, want) in cases {
            assert_eq!(depth(&mut client, t).await, want, "{}: {what}", b.name);
        }
        stop_tx.send(true).unwrap();
        let metrics =
            tokio::time::timeout(Duration::from_secs(30), bridge_task).await.unwrap().unwrap().unwrap();
        let get = |name: &str| metrics.iter().find(|(s, _)| s.worker == 1).and_then(|(_, m)| m.get(name));
        assert_eq!(
            (get("refused_extra_keys"), get("refused_namespaced"), get("refused_unknown_parent")),
            (Some(1), Some(0), Some(0)),
            "{}",
            b.name
        );
        ran.push(b.name);
    }
    eprintln!("[bridge namespaces e2e] ran on {ran:?}");
}
