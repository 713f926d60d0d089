//! What each Kafka backend does not implement, documented by test. prefixlog depends on none of
//! these: time → offset lookups use its own checkpoints (audit), never the broker's
//! offsets-for-times, and replicas use manual assignment, never consumer groups (ListGroups).
//! Tests that need to delete records or topics (tests/continuity.rs) run where the backend can.
//! Measured once, not asserted (it would disturb the shared broker): DeleteRecords answers
//! UnsupportedFeature on the embedded broker and makes tansu 0.6 drop the connection.

use prefixlog_tests::{kafka_backends, unique_topic};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_for_times_differs_by_backend() {
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.features");
        b.create_topic(&topic, 1).await.unwrap();
        let p: FutureProducer = ClientConfig::new().set("bootstrap.servers", &b.brokers).create().unwrap();
        for ts in [1_000_000i64, 2_000_000, 3_000_000] {
            p.send(
                FutureRecord::to(&topic).key("k").payload("v").partition(0).timestamp(ts),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        }
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &b.brokers)
            .set("group.id", "features")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Offset(2_000_000)).unwrap();
        let got = c
            .offsets_for_times(tpl, Duration::from_secs(10))
            .ok()
            .and_then(|r| r.elements().first().map(|e| e.offset()));
        eprintln!("[backend features] {}: offsets_for_times(2,000,000 ms) = {got:?}", b.name);
        match b.name {
            // librdkafka's mock cluster does not implement it: the lookup answers End.
            "embedded" => assert_eq!(got, Some(Offset::End)),
            // tansu (SQLite storage) and real Kafka answer the first offset at or after the time.
            _ => assert_eq!(got, Some(Offset::Offset(1)), "{}", b.name),
        }
    }
}

/// Deleting and recreating a topic (its offsets start again at 0): the "recreated topic" case
/// of prefixlog's continuity checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_topic_by_backend() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    for b in kafka_backends().await {
        let topic = unique_topic("prefixlog.recreate");
        b.create_topic(&topic, 1).await.unwrap();
        let p: FutureProducer = ClientConfig::new().set("bootstrap.servers", &b.brokers).create().unwrap();
        for i in 0..5 {
            p.send(
                FutureRecord::to(&topic).key("k").payload(&format!("v{i}")).partition(0),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        }
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", &b.brokers).create().unwrap();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let r = tokio::time::timeout(Duration::from_secs(20), admin.delete_topics(&[&topic], &opts)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let again = b.create_topic(&topic, 1).await;
        let c: BaseConsumer =
            ClientConfig::new().set("bootstrap.servers", &b.brokers).set("group.id", "f").create().unwrap();
        let wm = c.fetch_watermarks(&topic, 0, Duration::from_secs(10));
        eprintln!(
            "[backend features] {}: delete_topics -> {r:?}; watermarks after recreating {wm:?}",
            b.name
        );
        match b.name {
            // The mock cluster implements no DeleteTopics: the request times out, the topic stays.
            "embedded" => assert!(r.is_err() && again.is_err(), "{r:?} {again:?}"),
            // tansu deletes and recreates it: its offsets start again at 0.
            _ => assert_eq!((again.is_ok(), wm.ok()), (true, Some((0, 0))), "{}", b.name),
        }
    }
}
