//! Honest staleness (issue 34 item 8): an answer without a consistency token says
//! `stale = true` while the replica is not ready, and while its broker has not answered for
//! longer than `--stale-after` — which alone does not make the replica not ready (every replica
//! shares the broker; they keep answering from their state). Answers with a token keep their
//! meaning: stale only when the token was not reached.
//!
//! The outage runs on the embedded broker, which can be taken down and brought back in-process;
//! tests/tests/outage.rs does the same on tansu (a broker process it stops and restarts).

use prefixlog_engine::{Engine, EngineConfig, HolderKey, KeyspaceId};
use prefixlog_ingest::Publisher;
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_proto::v1::{
    match_request::Prompt, prefix_index_client::PrefixIndexClient, BlockHashes, Keyspace, MatchRequest,
    MatchResponse, PartitionOffset,
};
use prefixlog_query::{Served, ServerConfig};
use prefixlog_state::NextOffset;
use prefixlog_state::{token_of, KvOp, Tier};
use prefixlog_tests::http::{http_get, sample};
use prefixlog_tests::{kafka_backends, replicas, unique_topic};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const P: u32 = 2;

fn request(token: &[NextOffset]) -> MatchRequest {
    MatchRequest {
        keyspace: Some(Keyspace { model: "m".into(), block_size: 16, hash_scheme: 1 }),
        prompt: Some(Prompt::Hashes(BlockHashes { local: vec![1, 2] })),
        min_offsets: token
            .iter()
            .map(|&NextOffset { partition, offset }| PartitionOffset { partition, offset })
            .collect(),
        ..Default::default()
    }
}

async fn ask(endpoint: &str, token: &[NextOffset]) -> MatchResponse {
    let mut c = PrefixIndexClient::connect(endpoint.to_string()).await.unwrap();
    c.r#match(request(token)).await.unwrap().into_inner()
}

/// Asks without a token until the answer's `stale` is `want` (60 s at most).
async fn until_stale(endpoint: &str, want: bool, what: &str) {
    let t = Instant::now();
    while ask(endpoint, &[]).await.stale != want {
        assert!(t.elapsed() < Duration::from_secs(60), "{what}: never stale = {want}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Not ready (its watermarks never read): every token-less answer says stale; ready: none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_of_a_replica_that_is_not_ready_say_stale() {
    let engine = Arc::new(Engine::new(EngineConfig { partitions: 1, ..Default::default() }));
    let ks = KeyspaceId::new("m", 16, 1);
    engine
        .store(
            &ks,
            HolderKey::new(7, 0, 0),
            None,
            &[(1, 11), (2, 22)].map(prefixlog_state::BlockHashes::from),
            1,
        )
        .unwrap();
    let served = Served::engine_only(engine, "r");
    let status = served.status.clone();
    let cfg = ServerConfig {
        grpc_addr: ([127, 0, 0, 1], 0).into(),
        admin_addr: None,
        ready_lag: 0,
        ..Default::default()
    };
    let server = prefixlog_query::start(cfg, served).await.unwrap();
    let endpoint = format!("http://{}", server.grpc_addr);
    let r = ask(&endpoint, &[]).await;
    assert!(r.stale, "not ready, yet answered as fresh: {r:?}");
    // A token it has reached is answered fresh: the token's meaning is unchanged.
    assert!(!ask(&endpoint, &[(0, 0)].map(NextOffset::from)).await.stale);
    status.partitions[0].watermarks_known.store(true, Ordering::Release);
    until_stale(&endpoint, false, "ready").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_say_stale_once_the_broker_is_silent_longer_than_the_bound() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        let Some(embedded) = b.embedded() else {
            eprintln!(
                "[staleness] {}: NOT RUN: a shared broker cannot be stopped (outage.rs stops its own tansu)",
                b.name
            );
            continue;
        };
        let topic = unique_topic("prefixlog.staleness");
        b.create_topic(&topic, P).await.unwrap();
        let spec = replicas::spec(&b.brokers, &topic, P);
        let publisher = Publisher::new(&spec).unwrap();
        let ks = KeyspaceId::new("m", 16, 1);
        let ops = [KvOp::Stored {
            tier: Tier::Gpu,
            lane: 0,
            parent_ext: None,
            blocks: [(1, 1), (2, 2)].map(prefixlog_state::BlockHashes::from).to_vec(),
        }];
        let landed = publisher.publish_kv_events(&ks, 1, 0, 1, 1, false, &ops, None).await.unwrap();
        let opts =
            NodeOptions { stale_after: Duration::from_secs(2), ready_lag: 0, ..replicas::options("stale") };
        let node = ReplicaNode::start(spec, opts).await.unwrap();
        let token = token_of(&[landed]);
        assert!(node.status().wait_for(&token, Duration::from_secs(60)).await);
        let endpoint = node.endpoint();
        until_stale(&endpoint, false, "caught up and ready").await;

        embedded.set_reachable(false).unwrap();
        until_stale(&endpoint, true, "broker down for longer than --stale-after").await;
        assert!(node.status().since_broker_contact() > Duration::from_secs(2));
        let (ready, why) = node.ready();
        assert!(ready && why.contains("has not answered"), "a broker outage alone is not unready: {why}");
        let admin = node.admin_addr().unwrap();
        let (code, body) = http_get(admin, "/readyz").await;
        assert!(code == 200 && body.contains("stale"), "{code} {body}");
        let (_, m) = http_get(admin, "/metrics").await;
        assert_eq!(sample(&m, "prefixlog_answers_stale{shard=\"all\"}"), Some(1.0), "{m}");
        assert!(sample(&m, "prefixlog_broker_silent_seconds{shard=\"all\"}") > Some(2.0));
        // A reached token still means what it says.
        assert!(!ask(&endpoint, &token).await.stale);

        embedded.set_reachable(true).unwrap();
        until_stale(&endpoint, false, "broker back").await;
        node.shutdown().await.unwrap();
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}
