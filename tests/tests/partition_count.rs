//! A partition-count change at run time (issue 34 item 5) is noticed within a bounded time (the
//! watermark thread reads the topic's metadata every `PARTITIONS_CHECK_EVERY`) and answered
//! with not-ready, the gauges `prefixlog_topic_partitions` / `prefixlog_topic_partitions_changed`
//! and an error log. It is not followed: a worker's partition depends on the count.
//!
//! Where the broker implements Admin CreatePartitions (Kafka), the topic really grows under a
//! running replica. Neither the embedded broker nor tansu 0.6 implements it (both refuse, and
//! deleting and recreating the topic under a running client crashes librdkafka 2.12,
//! confluentinc/librdkafka#4964), so there the replica is started for fewer partitions than
//! the topic has — what it sees after such a change — through the ingest layer, which (unlike a
//! node's start-up probe) does not refuse it.

use prefixlog_engine::KeyspaceId;
use prefixlog_ingest::{add_partitions, LogSpec, Publisher};
use prefixlog_node::watermarks::PARTITIONS_CHECK_EVERY;
use prefixlog_node::{IngestOptions, IngestThread};
use prefixlog_query::{ReplicaInfo, ReplicaStatus, Served, ServerConfig};
use prefixlog_state::BlockHashes;
use prefixlog_state::{Applier, KvOp, Tier};
use prefixlog_tests::http::{http_get, sample};
use prefixlog_tests::{kafka_backends, replicas, unique_topic, KafkaBackend};
use std::sync::Arc;
use std::time::{Duration, Instant};

const P: u32 = 2;

/// Waits (bounded: one metadata check period plus generous slack for a loaded machine) until
/// the replica reports the topic with `observed` partitions.
async fn noticed(status: &ReplicaStatus, observed: u32) -> Duration {
    let t = Instant::now();
    while status.partition_count_changed() != Some((P, observed)) {
        assert!(
            t.elapsed() < PARTITIONS_CHECK_EVERY + Duration::from_secs(30),
            "the partition count change was not noticed: {:?}",
            status.partitions_observed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_count_change_is_noticed_and_makes_the_replica_not_ready() {
    let mut ran = Vec::new();
    for b in kafka_backends().await {
        changed(&b).await;
        ran.push(b.name);
    }
    eprintln!("[kafka backend] ran: {ran:?}");
}

async fn changed(b: &KafkaBackend) {
    let topic = unique_topic("prefixlog.partition-count");
    b.create_topic(&topic, P).await.unwrap();
    let spec: LogSpec = replicas::spec(&b.brokers, &topic, P);
    let publisher = Publisher::new(&spec).unwrap();
    let ks = KeyspaceId::new("m", 16, 1);
    let ops = [KvOp::Stored {
        tier: Tier::Gpu,
        lane: 0,
        parent_ext: None,
        blocks: [(1, 1)].map(BlockHashes::from).to_vec(),
    }];
    publisher.publish_kv_events(&ks, 1, 0, 1, 1, false, &ops, None).await.unwrap();

    let start =
        |spec: &LogSpec| IngestThread::start(spec, Applier::new(P, spec.settings), IngestOptions::default());
    let running = start(&spec).unwrap();
    wait_observed(running.status(), P).await;
    let grow = async {
        if b.name == "embedded" {
            return Err("the embedded broker does not implement it".to_string());
        }
        add_partitions(&spec.kafka, &topic, P + 1).await.map_err(|e| e.to_string())
    };
    let (replica, how) = match grow.await {
        Ok(()) => (running, "CreatePartitions under a running replica"),
        Err(e) => {
            running.halt();
            eprintln!(
                "[partition-count] {}: CreatePartitions refused ({e}): a replica of {P} partitions on a topic of {}",
                b.name,
                P + 1
            );
            let grown = unique_topic("prefixlog.partition-count");
            b.create_topic(&grown, P + 1).await.unwrap();
            let r = start(&replicas::spec(&b.brokers, &grown, P)).unwrap();
            (r, "a replica started for fewer partitions than the topic has")
        }
    };
    let took = noticed(replica.status(), P + 1).await;
    eprintln!("[partition-count] {}: {how}: noticed in {:.1}s", b.name, took.as_secs_f64());

    // What a node says about it: not ready, with the counts; the gauges.
    let served = Served {
        engine: replica.applier().lock().engine().clone(),
        status: replica.status().clone(),
        applier: Some(replica.applier().clone()),
        info: ReplicaInfo {
            replica_id: "r".into(),
            topic: topic.clone(),
            partition_count: P,
            owned: (0..P).collect(),
            shard: (0, 1),
            peers: vec![],
        },
        registry: prometheus::Registry::new(),
        admin: None,
    };
    let cfg = ServerConfig {
        grpc_addr: ([127, 0, 0, 1], 0).into(),
        admin_addr: Some(([127, 0, 0, 1], 0).into()),
        ..Default::default()
    };
    let server = prefixlog_query::start(cfg, served).await.unwrap();
    let admin = server.admin_addr.unwrap();
    let (code, body) = http_get(admin, "/readyz").await;
    assert!(code == 503 && body.contains(&format!("now has {} partitions", P + 1)), "{code} {body}");
    let (_, m) = http_get(admin, "/metrics").await;
    assert_eq!(sample(&m, "prefixlog_topic_partitions"), Some(f64::from(P + 1)), "{m}");
    assert_eq!(sample(&m, "prefixlog_topic_partitions_changed"), Some(1.0), "{m}");
    replica.halt();
}

async fn wait_observed(status: &Arc<ReplicaStatus>, n: u32) {
    let t = Instant::now();
    while status.partitions_observed() != Some(n) {
        assert!(t.elapsed() < Duration::from_secs(60), "partition count never read");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
