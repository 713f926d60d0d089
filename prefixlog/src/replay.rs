//! `prefixlog replay`: publish the trace workload's KV events.

use crate::fleet_records::{fleet_records, WorkloadArgs};
use crate::kafka_args::KafkaArgs;
use prefixlog_ingest::Publisher;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let brokers = a.kafka.require_brokers("replay")?;
    let records = fleet_records(&a.workload, 1)?;
    let publisher = Publisher::connect(&a.kafka.spec(&brokers)?).await?;
    let start = Instant::now();
    let blocks: usize = records.iter().map(|r| r.blocks).sum();
    let n = publish_all(&publisher, &records).await?;
    tracing::info!(records = n, blocks, secs = start.elapsed().as_secs_f64(), "replayed");
    Ok(())
}

/// Publishes the fleet's records, each worker's in order. Returns the number published.
pub async fn publish_all(
    publisher: &Publisher,
    records: &[crate::fleet_records::FleetRecord],
) -> anyhow::Result<usize> {
    let items =
        records.iter().enumerate().map(|(i, r)| (r.worker, 1_000 + i as i64, r.value.clone())).collect();
    Ok(crate::bench_env::publish_by_worker(publisher, items).await?.len())
}
