//! What the Kafka benchmarks share: an embedded broker with one topic, a publisher, the
//! engine/apply/replica configurations, and publishing records grouped by worker.

use prefixlog_engine::{Engine, EngineConfig};
use prefixlog_ingest::{
    Applier, ApplyConfig, EmbeddedKafka, Landed, Publisher, PublisherConfig, ReplicaConfig,
};
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct BenchLog {
    pub publisher: Publisher,
    pub engine_cfg: EngineConfig,
    pub apply_cfg: ApplyConfig,
    pub replica_cfg: ReplicaConfig,
    /// Last: fields drop in order, and the broker must outlive its clients.
    _kafka: EmbeddedKafka,
}

impl BenchLog {
    pub fn start(topic: &str, partitions: u32) -> anyhow::Result<Self> {
        let kafka = EmbeddedKafka::start(topic, partitions)?;
        let brokers = kafka.bootstrap_servers();
        Ok(Self {
            publisher: Publisher::new(PublisherConfig::new(&brokers, topic, partitions))?,
            engine_cfg: EngineConfig { partitions, ..Default::default() },
            apply_cfg: ApplyConfig { partitions, ..Default::default() },
            replica_cfg: ReplicaConfig { brokers, topic: topic.into(), partitions, properties: vec![] },
            _kafka: kafka,
        })
    }

    pub fn brokers(&self) -> &str {
        &self.replica_cfg.brokers
    }

    pub fn fresh_applier(&self) -> Applier {
        Applier::new(Arc::new(Engine::new(self.engine_cfg.clone())), self.apply_cfg.clone())
    }

    /// Publishes `(worker, timestamp ms, value)` with one task per worker (each worker's records
    /// in order). Returns where they landed. Fails if the embedded broker dropped any record:
    /// its retention is fixed (5 MiB or 100,000 messages per partition) and a benchmark over a
    /// truncated log would compare different states.
    pub async fn publish(&self, items: Vec<(u64, i64, Vec<u8>)>) -> anyhow::Result<Vec<Landed>> {
        let landed = publish_by_worker(&self.publisher, items).await?;
        let probe = prefixlog_ingest::probe_log(&self.replica_cfg)?;
        if let Some((p, low)) = probe.low_watermarks.iter().enumerate().find(|(_, &l)| l > 0) {
            anyhow::bail!(
                "the embedded broker dropped the start of partition {p} (low watermark {low}): its \
                 retention is 5 MiB or 100,000 messages per partition; use more --partitions"
            );
        }
        Ok(landed)
    }
}

pub async fn publish_by_worker(
    p: &Publisher,
    items: Vec<(u64, i64, Vec<u8>)>,
) -> anyhow::Result<Vec<Landed>> {
    let mut by_worker: BTreeMap<u64, Vec<(i64, Vec<u8>)>> = BTreeMap::new();
    for (w, t, v) in items {
        by_worker.entry(w).or_default().push((t, v));
    }
    let mut tasks = Vec::new();
    for (w, vals) in by_worker {
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            let mut landed = Vec::with_capacity(vals.len());
            for (t, v) in vals {
                landed.push(p.publish_raw(w, &v, Some(t)).await?);
            }
            Ok::<_, prefixlog_ingest::PublishError>(landed)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.extend(t.await??);
    }
    Ok(out)
}

/// The highest landed offset per partition: a consistency token covering everything.
pub fn token(landed: &[Landed]) -> Vec<(u32, i64)> {
    let mut m: BTreeMap<u32, i64> = BTreeMap::new();
    for l in landed {
        let e = m.entry(l.partition).or_insert(l.offset);
        *e = (*e).max(l.offset);
    }
    m.into_iter().collect()
}
