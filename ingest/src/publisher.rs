//! Publishing records to the log (bridges, gateways, trace replayers).
//!
//! One idempotent producer (`enable.idempotence=true`: retries never duplicate or reorder a
//! partition), records keyed by worker and placed explicitly with
//! [`prefixlog_engine::partition_of`], so every language's publisher agrees on the partition.
//! librdkafka batches (`linger.ms`) and bounds in-flight memory (`queue.buffering.max.*`);
//! when the queue is full, `publish` waits (back-pressure) up to `enqueue_timeout`, then fails
//! with a clear error — it never drops an acknowledged record. On success it returns the
//! (partition, offset) the record landed at: the consistency token for read-your-writes.

use crate::record::{encode_lifecycle, encode_placement, encode_tick, worker_key, KvBatch, KvOp, Lifecycle};
use prefixlog_engine::{partition_of, HolderKey, KeyspaceId};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct PublisherConfig {
    pub brokers: String,
    pub topic: String,
    pub partitions: u32,
    /// How long `publish` waits for room in a full queue before failing.
    pub enqueue_timeout: Duration,
    /// Extra librdkafka properties (SASL/SSL, tuning), applied last.
    pub properties: Vec<(String, String)>,
}

impl PublisherConfig {
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>, partitions: u32) -> Self {
        Self {
            brokers: brokers.into(),
            topic: topic.into(),
            partitions,
            enqueue_timeout: Duration::from_secs(30),
            properties: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("kafka rejected the record for partition {partition}: {source}")]
    Kafka { partition: u32, source: rdkafka::error::KafkaError },
    #[error("producer setup: {0}")]
    Setup(rdkafka::error::KafkaError),
}

/// Where a record landed: pass it as a consistency token to see your own write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Landed {
    pub partition: u32,
    pub offset: i64,
}

#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer,
    cfg: PublisherConfig,
}

impl Publisher {
    pub fn new(cfg: PublisherConfig) -> Result<Self, PublishError> {
        let mut cc = ClientConfig::new();
        cc.set("bootstrap.servers", &cfg.brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "100000")
            .set("queue.buffering.max.kbytes", "262144")
            .set("message.timeout.ms", "300000");
        for (k, v) in &cfg.properties {
            cc.set(k, v);
        }
        Ok(Self { producer: cc.create().map_err(PublishError::Setup)?, cfg })
    }

    pub fn config(&self) -> &PublisherConfig {
        &self.cfg
    }

    /// Publishes an encoded record for `worker` with log time `timestamp_ms` (None: now).
    /// Note: librdkafka treats a timestamp of 0 as "now" too; log times must be positive.
    pub async fn publish_raw(
        &self,
        worker: u64,
        value: &[u8],
        timestamp_ms: Option<i64>,
    ) -> Result<Landed, PublishError> {
        let partition = partition_of(worker, self.cfg.partitions);
        let key = worker_key(worker);
        let mut rec =
            FutureRecord::to(&self.cfg.topic).key(&key[..]).payload(value).partition(partition as i32);
        if let Some(ts) = timestamp_ms {
            rec = rec.timestamp(ts);
        }
        match self.producer.send(rec, Timeout::After(self.cfg.enqueue_timeout)).await {
            Ok(d) => Ok(Landed { partition: d.partition as u32, offset: d.offset }),
            Err((source, _)) => Err(PublishError::Kafka { partition, source }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub async fn publish_kv_events(
        &self,
        keyspace: &KeyspaceId,
        worker: u64,
        dp_rank: u32,
        epoch: u64,
        seq: u64,
        gap_before: bool,
        events: &[KvOp],
        timestamp_ms: Option<i64>,
    ) -> Result<Landed, PublishError> {
        let batch = KvBatch { keyspace, worker, dp_rank, epoch, seq, gap_before, events, lanes: &[] };
        self.publish_kv_batch(&batch, timestamp_ms).await
    }

    /// Publishes a batch with everything a record can carry (bridges: lane metadata too).
    pub async fn publish_kv_batch(
        &self,
        batch: &KvBatch<'_>,
        timestamp_ms: Option<i64>,
    ) -> Result<Landed, PublishError> {
        self.publish_raw(batch.worker, &batch.encode(), timestamp_ms).await
    }

    pub async fn publish_placement(
        &self,
        keyspace: &KeyspaceId,
        holder: HolderKey,
        locals: &[u64],
        answered_at: &[(u32, i64)],
        gateway: &str,
        timestamp_ms: Option<i64>,
    ) -> Result<Landed, PublishError> {
        let v = encode_placement(keyspace, holder, locals, answered_at, gateway);
        self.publish_raw(holder.worker, &v, timestamp_ms).await
    }

    pub async fn publish_lifecycle(&self, worker: u64, change: &Lifecycle) -> Result<Landed, PublishError> {
        self.publish_raw(worker, &encode_lifecycle(worker, change), None).await
    }

    /// Appends a tick to every partition (advances log time on quiet partitions).
    pub async fn publish_ticks(&self, timestamp_ms: Option<i64>) -> Result<Vec<Landed>, PublishError> {
        let mut out = Vec::new();
        for p in 0..self.cfg.partitions {
            let w = crate::record::worker_for_partition(p, self.cfg.partitions);
            out.push(self.publish_raw(w, &encode_tick(w), timestamp_ms).await?);
        }
        Ok(out)
    }

    /// Waits until everything queued is acknowledged.
    pub fn flush(&self, timeout: Duration) -> Result<(), PublishError> {
        self.producer.flush(timeout).map_err(|e| PublishError::Kafka { partition: u32::MAX, source: e })
    }
}
