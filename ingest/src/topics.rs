//! Creating and deleting a log's topic (benchmarks, tests, tooling). Replicas never create or
//! delete topics: the topic is the log, and its lifecycle belongs to the operator.

use crate::log_spec::{ClientRole, KafkaConnection};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
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
