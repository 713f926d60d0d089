//! Creating and deleting a log's topic, and adding partitions to it (benchmarks, tests,
//! tooling). Replicas never change topics: the topic is the log, and its lifecycle belongs to
//! the operator.

use crate::log_spec::{ClientRole, KafkaConnection};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error("admin client: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("topic {topic}: {code}")]
    Refused { topic: String, code: rdkafka::types::RDKafkaErrorCode },
}

fn admin(conn: &KafkaConnection) -> Result<AdminClient<DefaultClientContext>, TopicError> {
    Ok(conn.client_config(ClientRole::Probe).create()?)
}

fn options() -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))
}

/// Creates `topic` with `partitions` partitions (replication 1: single-broker setups) and the
/// given topic configs.
pub async fn create_topic(
    conn: &KafkaConnection,
    topic: &str,
    partitions: u32,
    configs: &[(&str, &str)],
) -> Result<(), TopicError> {
    let mut t = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(1));
    for (k, v) in configs {
        t = t.set(k, v);
    }
    for r in admin(conn)?.create_topics([&t], &options()).await? {
        r.map_err(|(topic, code)| TopicError::Refused { topic, code })?;
    }
    Ok(())
}

/// Deletes `topic` (brokers without DeleteTopics, like the embedded one, refuse).
pub async fn delete_topic(conn: &KafkaConnection, topic: &str) -> Result<(), TopicError> {
    for r in admin(conn)?.delete_topics(&[topic], &options()).await? {
        r.map_err(|(topic, code)| TopicError::Refused { topic, code })?;
    }
    Ok(())
}

/// Grows `topic` to `total` partitions (Admin CreatePartitions; the embedded broker and tansu
/// 0.6 do not implement it and refuse).
pub async fn add_partitions(conn: &KafkaConnection, topic: &str, total: u32) -> Result<(), TopicError> {
    let p = NewPartitions::new(topic, total as usize);
    // A broker without the API may never answer: give up after the operation timeout.
    let opts = options().request_timeout(Some(Duration::from_secs(10)));
    for r in admin(conn)?.create_partitions([&p], &opts).await? {
        r.map_err(|(topic, code)| TopicError::Refused { topic, code })?;
    }
    Ok(())
}
