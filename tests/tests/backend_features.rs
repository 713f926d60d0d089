//! What each Kafka backend does not implement, documented by test. prefixlog depends on none of
//! these: time → offset lookups use its own checkpoints (audit), never the broker's
//! offsets-for-times, and replicas use manual assignment, never consumer groups (ListGroups).

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
