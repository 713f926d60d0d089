//! Every component over a broker as production runs it: SASL/SCRAM-SHA-256 over TLS
//! ([`prefixlog_tests::secured::SecuredKafka`]: tansu with `--authentication` behind a TLS
//! terminator, certificates made at start). Each client is configured only through
//! `KafkaConnection` properties, what `-X key=value` passes.
//!
//! - the publisher and the replica: records published over SASL_SSL are applied;
//! - audit: a replay from the log start over SASL_SSL rebuilds the replica's state;
//! - the bridge: a stand-in engine's events (ZeroMQ) reach the replica through it;
//! - a wrong CA or a wrong password: the start-up check fails within seconds and names the cause.
//!
//! Runs when `PREFIXLOG_TANSU_BIN` is set (scripts/with-tansu.sh, the tansu leg of
//! scripts/test.sh); elsewhere each test prints NOT RUN and passes.

use prefixlog_engine::{KeyspaceId, MatchOptions};
use prefixlog_ingest::{check_topic, create_topic, probe_log, LogSpec, ProbeError, Publisher};
use prefixlog_node::ReplicaNode;
use prefixlog_state::BlockHashes;
use prefixlog_state::{KvOp, Landed, Tier};
use prefixlog_tests::secured::{tansu_bin, SecuredKafka, PASSWORD};
use prefixlog_tests::{replicas, unique_topic};
use std::time::Duration;

const P: u32 = 4;

fn ks() -> KeyspaceId {
    KeyspaceId::new("secured", 4, 1)
}

/// The secured broker and a fresh topic on it, or None (NOT RUN) without tansu.
async fn secured_log(test: &str) -> Option<(SecuredKafka, LogSpec)> {
    let bin = match tansu_bin() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("[{test}] NOT RUN: {why}");
            return None;
        }
    };
    let kafka = SecuredKafka::start(&bin).await.expect("secured tansu starts");
    let topic = unique_topic("prefixlog.secured");
    create_topic(&kafka.connection(), &topic, P, &[]).await.expect("topic created over SASL_SSL");
    let spec = LogSpec::new(kafka.connection(), topic, P);
    Some((kafka, spec))
}

/// Each of `workers` stores three blocks; returns where the records landed.
async fn publish(p: &Publisher, workers: u64) -> Vec<Landed> {
    let mut landed = Vec::new();
    for w in 0..workers {
        let blocks: Vec<BlockHashes> =
            (0..3).map(|j| (w << 8 | j, 100 * w + j + 1)).map(BlockHashes::from).collect();
        let ops = [KvOp::Stored { tier: Tier::Gpu, lane: 0, parent_ext: None, blocks }];
        landed.push(p.publish_kv_events(&ks(), w, 0, 1, 1, false, &ops, None).await.expect("published"));
    }
    landed
}

async fn caught_up(r: &ReplicaNode, landed: &[Landed]) {
    let token = prefixlog_state::token_of(landed);
    assert!(r.status().wait_for(&token, Duration::from_secs(60)).await, "the replica applied {token:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_and_replica_over_sasl_ssl() {
    let Some((kafka, spec)) = secured_log("publisher_and_replica_over_sasl_ssl").await else { return };
    let publisher = Publisher::connect(&spec).await.expect("the publisher's start-up check passes");
    let landed = publish(&publisher, 6).await;
    let replica = replicas::replica(&spec, "secured-a").await;
    caught_up(&replica, &landed).await;
    {
        let a = replica.applier().lock();
        for w in 0..6u64 {
            let chain: Vec<u64> = (0..3).map(|j| 100 * w + j + 1).collect();
            let hits = a.engine().match_chain(&ks(), &chain, &MatchOptions::default()).unwrap();
            assert!(hits.iter().any(|m| m.holder.worker == w && m.depth == 3), "worker {w}: {hits:?}");
        }
    }
    replica.shutdown().await.unwrap();
    drop(kafka);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_replays_over_sasl_ssl() {
    let Some((_kafka, spec)) = secured_log("audit_replays_over_sasl_ssl").await else { return };
    let publisher = Publisher::connect(&spec).await.unwrap();
    let landed = publish(&publisher, 4).await;
    let replica = replicas::replica(&spec, "secured-b").await;
    caught_up(&replica, &landed).await;
    let token = prefixlog_state::token_of(&landed);
    let audit = tokio::task::spawn_blocking({
        let (spec, point) = (spec.clone(), prefixlog_audit::Point::Offsets(token.clone()));
        move || prefixlog_audit::reconstruct(None, &spec, &point, false)
    })
    .await
    .unwrap()
    .expect("the audit's replay over SASL_SSL");
    assert_eq!(audit.checkpoint, None, "replayed from the log start");
    assert_eq!(audit.replayed as usize, landed.len());
    assert_eq!(
        audit.applier.engine().digest(),
        replica.engine().digest(),
        "the audit rebuilt the replica's state"
    );
    replica.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_publishes_over_sasl_ssl() {
    use prefixlog_bridge::{self as bridge, BridgeOptions, EngineSpec};
    let Some((_kafka, spec)) = secured_log("bridge_publishes_over_sasl_ssl").await else { return };
    let replica = replicas::replica(&spec, "secured-c").await;
    // A stand-in engine: vLLM's [topic, seq, payload] messages, one stored block of 4 tokens.
    let engine = prefixlog_tests::zmtp_pub::StandInPub::bind().await.unwrap();
    let endpoint = engine.endpoint().to_string();
    let payload =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../bridge/tests/fixtures/dynamo_tail.msgpack"))
            .unwrap();
    let engines =
        vec![EngineSpec { endpoint, replay_endpoint: None, worker: 42, dp_rank: None, topic: String::new() }];
    let publisher = Publisher::connect(&spec).await.unwrap();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let exported = std::sync::Arc::new(bridge::metrics::BridgeCollector::default());
    let running = tokio::spawn({
        let exported = exported.clone();
        async move {
            bridge::run(
                engines,
                BridgeOptions::new(KeyspaceId::new("secured", 4, 1)),
                publisher,
                true,
                stop_rx,
                &exported,
            )
            .await
        }
    });
    // A subscriber misses what is sent before it joined: the first message (seq 0) goes out
    // until the block is in the replica (repeats of one seq are duplicates to the bridge).
    let mut stored = false;
    for _ in 0..600 {
        engine.send(&[b"", &0u64.to_be_bytes(), &payload]).await;
        if replica.engine().holder_blocks() > 0 {
            stored = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(stored, "the engine's block reached the replica through the bridge over SASL_SSL");
    stop_tx.send(true).unwrap();
    running.await.unwrap().expect("the bridge stops cleanly (worker-removed published, producer flushed)");
    replica.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_or_password_fails_fast_and_names_the_cause() {
    let Some((kafka, spec)) = secured_log("wrong_ca_or_password_fails_fast_and_names_the_cause").await else {
        return;
    };
    let with = |key: &str, value: &str| {
        let conn = prefixlog_ingest::KafkaConnection::new(&kafka.brokers)
            .with_properties(kafka.properties_with(key, value));
        LogSpec::new(conn, spec.topic.clone(), P)
    };
    let other_ca = kafka.other_ca.display().to_string();
    let cases = [
        (with("ssl.ca.location", &other_ca), "certificate verify failed"),
        (with("sasl.password", &format!("not-{PASSWORD}")), "SASL authentication error"),
    ];
    for (bad, cause) in cases {
        // The replica's and the audit's start-up probe, and the publishers' check: both refuse
        // at the first conclusive failure instead of waiting out the metadata timeout.
        let probed = tokio::task::spawn_blocking({
            let bad = bad.clone();
            move || (probe_log(&bad).map(|_| ()), check_topic(&bad))
        })
        .await
        .unwrap();
        for (what, got) in [("probe_log", probed.0), ("check_topic", probed.1)] {
            match got {
                Err(e @ ProbeError::Refused { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.contains(cause), "{what}: the error names the cause ({cause:?}): {msg}");
                }
                other => panic!("{what}: expected Refused naming {cause:?}, got {other:?}"),
            }
        }
        let replica = ReplicaNode::start(bad.clone(), replicas::options("secured-bad")).await;
        let err = replica.err().expect("a replica with wrong settings does not start").to_string();
        eprintln!("[secured] a replica with a wrong {cause:?} setting: {err}");
        assert!(err.contains(cause), "the replica's start-up error names the cause ({cause:?}): {err}");
        let publisher =
            Publisher::connect(&bad).await.err().expect("a publisher with wrong settings does not start");
        assert!(publisher.to_string().contains(cause), "{publisher}");
    }
}
