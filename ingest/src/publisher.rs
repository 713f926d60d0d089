//! Publishing records to the log (bridges, gateways, trace replayers).
//!
//! One idempotent producer (`enable.idempotence=true`: retries never duplicate or reorder a
//! partition), records keyed by worker and placed explicitly with
//! [`prefixlog_engine::partition_of`], so every language's publisher agrees on the partition.
//! librdkafka batches (`linger.ms`) and bounds in-flight memory (`queue.buffering.max.*`);
//! when the queue is full, `publish` waits (back-pressure) up to `enqueue_timeout`, then fails
//! with a clear error — it never drops an acknowledged record. On success it returns the
//! (partition, offset) the record landed at: the consistency token for read-your-writes.

use crate::log_spec::{ClientRole, LogSpec};
use crate::probe::{check_topic, ProbeError};
use prefixlog_engine::{partition_of, HolderKey, KeyspaceId};
use prefixlog_state::record::{
    encode_lifecycle, encode_placement, encode_tick, worker_key, KvBatch, KvOp, Lifecycle,
};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::util::Timeout;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("kafka rejected the record for partition {partition}: {source}")]
    Kafka { partition: u32, source: rdkafka::error::KafkaError },
    #[error("producer setup: {0}")]
    Setup(rdkafka::error::KafkaError),
    /// The start-up check of [`Publisher::connect`] (its message says what failed).
    #[error(transparent)]
    Check(#[from] ProbeError),
}

use prefixlog_ids::{Landed, NextOffset};

#[derive(Clone)]
pub struct Publisher {
    producer: FutureProducer,
    topic: String,
    partitions: u32,
    /// How long `publish` waits for room in a full queue before failing.
    enqueue_timeout: Duration,
}

impl Publisher {
    pub fn new(spec: &LogSpec) -> Result<Self, PublishError> {
        let producer = spec.client_config(ClientRole::Publisher).create().map_err(PublishError::Setup)?;
        Ok(Self {
            producer,
            topic: spec.topic.clone(),
            partitions: spec.partitions,
            enqueue_timeout: Duration::from_secs(30),
        })
    }

    /// [`Publisher::new`] after [`check_topic`]: the brokers answer with these connection
    /// settings and the topic has the spec's partition count. What a publishing process calls
    /// at start: a wrong TLS or SASL setting fails here in about a second, named, instead of
    /// the first publish timing out after `message.timeout.ms` (5 min).
    pub async fn connect(spec: &LogSpec) -> Result<Self, PublishError> {
        let checked = spec.clone();
        tokio::task::spawn_blocking(move || check_topic(&checked))
            .await
            .map_err(|_| ProbeError::Kafka(rdkafka::error::KafkaError::Canceled))??;
        Self::new(spec)
    }

    /// How long `publish` waits for room in a full queue before failing (default 30 s).
    pub fn with_enqueue_timeout(mut self, t: Duration) -> Self {
        self.enqueue_timeout = t;
        self
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// Publishes an encoded record for `worker` with log time `timestamp_ms` (None: now).
    /// Note: librdkafka treats a timestamp of 0 as "now" too; log times must be positive.
    pub async fn publish_raw(
        &self,
        worker: u64,
        value: &[u8],
        timestamp_ms: Option<i64>,
    ) -> Result<Landed, PublishError> {
        let partition = partition_of(worker, self.partitions);
        let key = worker_key(worker);
        let mut rec = FutureRecord::to(&self.topic).key(&key[..]).payload(value).partition(partition as i32);
        if let Some(ts) = timestamp_ms {
            rec = rec.timestamp(ts);
        }
        match self.producer.send(rec, Timeout::After(self.enqueue_timeout)).await {
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
        answered_at: &[NextOffset],
        gateway: &str,
        timestamp_ms: Option<i64>,
    ) -> Result<Landed, PublishError> {
        let v = encode_placement(keyspace, holder, locals, answered_at, gateway);
        self.publish_raw(holder.worker, &v, timestamp_ms).await
    }

    pub async fn publish_lifecycle(&self, worker: u64, change: &Lifecycle) -> Result<Landed, PublishError> {
        self.publish_raw(worker, &encode_lifecycle(worker, change), None).await
    }

    /// Appends a tick to each of `partitions` (advances log time on quiet partitions).
    pub async fn publish_ticks(
        &self,
        partitions: &[u32],
        timestamp_ms: Option<i64>,
    ) -> Result<Vec<Landed>, PublishError> {
        let mut out = Vec::new();
        for &p in partitions {
            let w = prefixlog_state::record::worker_for_partition(p, self.partitions);
            out.push(self.publish_raw(w, &encode_tick(w), timestamp_ms).await?);
        }
        Ok(out)
    }

    /// Waits until everything queued is acknowledged.
    pub fn flush(&self, timeout: Duration) -> Result<(), PublishError> {
        self.producer.flush(timeout).map_err(|e| PublishError::Kafka { partition: u32::MAX, source: e })
    }
}

/// The Kafka producer as the facades' way to append records (they do not link Kafka).
impl prefixlog_state::LogAppend for Publisher {
    fn append(&self, worker: u64, record: Vec<u8>) -> prefixlog_state::log::Appending<'_> {
        Box::pin(async move {
            self.publish_raw(worker, &record, None).await.map_err(prefixlog_state::LogError::new)
        })
    }
}
