//! What the Kafka benchmarks share: an embedded broker with one topic, a publisher, replicas
//! started the one way (`ReplicaNode`), and publishing records grouped by worker.

use prefixlog_ingest::{EmbeddedKafka, KafkaConnection, Landed, LogSpec, Publisher};
use prefixlog_node::{NodeOptions, ReplicaNode};
use std::collections::BTreeMap;

pub struct BenchLog {
    pub publisher: Publisher,
    pub spec: LogSpec,
    /// Last: fields drop in order, and the broker must outlive its clients.
    _kafka: EmbeddedKafka,
}

/// A benchmark replica: a query port only (no admin or peer port, no ticks).
pub fn bench_options() -> NodeOptions {
    NodeOptions { replica_id: "bench".into(), admin_addr: None, peer_addr: None, ..NodeOptions::default() }
}

impl BenchLog {
    pub fn start(topic: &str, partitions: u32) -> anyhow::Result<Self> {
        let kafka = EmbeddedKafka::start(topic, partitions)?;
        let spec = LogSpec::new(KafkaConnection::new(kafka.bootstrap_servers()), topic, partitions);
        Ok(Self { publisher: Publisher::new(&spec)?, spec, _kafka: kafka })
    }

    /// A replica of the benchmark log.
    pub async fn node(&self, opts: NodeOptions) -> anyhow::Result<ReplicaNode> {
        Ok(ReplicaNode::start(self.spec.clone(), opts).await?)
    }

    /// Publishes `(worker, timestamp ms, value)` with one task per worker (each worker's records
    /// in order). Returns where they landed. Fails if the embedded broker dropped any record:
    /// its retention is fixed (5 MiB or 100,000 messages per partition) and a benchmark over a
    /// truncated log would compare different states.
    pub async fn publish(&self, items: Vec<(u64, i64, Vec<u8>)>) -> anyhow::Result<Vec<Landed>> {
        let landed = publish_by_worker(&self.publisher, items).await?;
        let probe = prefixlog_ingest::probe_log(&self.spec)?;
        if let Some((p, w)) = probe.watermarks.iter().find(|(_, w)| w.low > 0) {
            let low = w.low;
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

/// A consistency token covering every landed record (next offsets).
pub fn token(landed: &[Landed]) -> Vec<(u32, i64)> {
    prefixlog_ingest::token_of(landed)
}
