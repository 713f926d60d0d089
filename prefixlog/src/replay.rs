//! `prefixlog replay`: publish the trace workload's KV events.

use crate::fleet_records::{fleet_records, WorkloadArgs};
use crate::kafka_args::KafkaArgs;
use prefixlog_ingest::{Publisher, PublisherConfig};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let brokers = a.kafka.brokers.clone().ok_or_else(|| {
        anyhow::anyhow!("replay needs --brokers (the address a `prefixlog serve` printed, or a real cluster)")
    })?;
    let records = fleet_records(&a.workload)?;
    let mut cfg = PublisherConfig::new(brokers, &a.kafka.topic, a.kafka.partitions);
    cfg.properties = a.kafka.property.clone();
    let publisher = Publisher::new(cfg)?;
    let start = Instant::now();
    let blocks: usize = records.iter().map(|r| r.blocks).sum();
    let n = publish_all(&publisher, &records).await?;
    tracing::info!(records = n, blocks, secs = start.elapsed().as_secs_f64(), "replayed");
    Ok(())
}

/// Publishes records with bounded concurrency, preserving per-worker order (each worker's
/// records go out in order from one task). Returns the number published.
pub async fn publish_all(
    publisher: &Publisher,
    records: &[crate::fleet_records::FleetRecord],
) -> anyhow::Result<usize> {
    use std::collections::BTreeMap;
    let mut by_worker: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for r in records {
        by_worker.entry(r.worker).or_default().push(r.value.clone());
    }
    let mut tasks = Vec::new();
    for (w, values) in by_worker {
        let p = publisher.clone();
        tasks.push(tokio::spawn(async move {
            for (i, v) in values.iter().enumerate() {
                p.publish_raw(w, v, Some(1_000 + i as i64)).await?;
            }
            Ok::<usize, prefixlog_ingest::PublishError>(values.len())
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await??;
    }
    Ok(n)
}
