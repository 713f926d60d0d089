//! The optional dead-letter copy of refused records: the record's key and bytes, unchanged, to
//! another topic, with headers that say where it came from and why it was refused — so a bad
//! record can be inspected or replayed after a fix without searching the log for it.
//!
//! Best effort and never blocking: the replica's state does not depend on the copy (the record
//! is skipped either way), so a full producer queue or a broker error drops the copy and counts
//! it ([`DeadLetterCounts`], exported by the replica's `/metrics` as
//! `prefixlog_dead_letter_copies_total{outcome="copied"|"failed"}`) instead of stalling the
//! partition.
//!
//! Headers: `prefixlog-source-topic`, `prefixlog-source-partition`, `prefixlog-source-offset`
//! (decimal), `prefixlog-reason` ([`prefixlog_state::BadReason`]'s name).

use crate::log_spec::{ClientRole, KafkaConnection};
use prefixlog_state::DeadLetterCounts;
use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Counts deliveries (from librdkafka's delivery reports, on its polling thread).
struct Reports(Arc<DeadLetterCounts>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => {
                self.0.copied.fetch_add(1, Relaxed);
            }
            Err((e, _)) => {
                self.0.failed.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, "dead-letter copy not delivered");
            }
        }
    }
}

/// Copies refused records to `topic`.
pub struct DeadLetter {
    producer: ThreadedProducer<Reports>,
    topic: String,
    counts: Arc<DeadLetterCounts>,
}

impl DeadLetter {
    /// A producer on the replica's Kafka connection, counting into `counts`.
    pub fn new(
        kafka: &KafkaConnection,
        topic: &str,
        counts: Arc<DeadLetterCounts>,
    ) -> Result<Self, KafkaError> {
        let producer =
            kafka.client_config(ClientRole::DeadLetter).create_with_context(Reports(counts.clone()))?;
        Ok(Self { producer, topic: topic.into(), counts })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Enqueues one copy; returns at once.
    pub fn copy(&self, src: Source<'_>, key: Option<&[u8]>, payload: Option<&[u8]>) {
        let (partition, offset) = (src.partition.to_string(), src.offset.to_string());
        let headers = OwnedHeaders::new()
            .insert(Header { key: "prefixlog-source-topic", value: Some(src.topic) })
            .insert(Header { key: "prefixlog-source-partition", value: Some(&partition) })
            .insert(Header { key: "prefixlog-source-offset", value: Some(&offset) })
            .insert(Header { key: "prefixlog-reason", value: Some(src.reason) });
        let mut record = BaseRecord::<[u8], [u8]>::to(&self.topic).headers(headers);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(p) = payload {
            record = record.payload(p);
        }
        if let Err((e, _)) = self.producer.send(record) {
            self.counts.failed.fetch_add(1, Relaxed);
            tracing::warn!(error = %e, topic = %self.topic, "dead-letter copy dropped");
        }
    }
}

impl Drop for DeadLetter {
    fn drop(&mut self) {
        // Deliver what is queued (bounded: a stopping replica must not hang on a dead broker).
        let _ = self.producer.flush(Duration::from_secs(5));
    }
}

/// Where a refused record came from, and why it was refused.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    pub topic: &'a str,
    pub partition: u32,
    pub offset: i64,
    pub reason: &'a str,
}
