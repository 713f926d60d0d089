//! `prefixlog publish-trace`: publish the trace workload's KV events (a simulated fleet's) to a
//! log, each worker's records in order: load for a deployment, input for the benchmarks.

use crate::fleet_records::{fleet_records, FleetRecord, WorkloadArgs};
use crate::kafka_args::KafkaArgs;
use prefixlog_ingest::Publisher;
use prefixlog_state::Landed;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let brokers = a.kafka.require_brokers("publish-trace")?;
    let records = fleet_records(&a.workload, 1)?;
    let publisher = Publisher::connect(&a.kafka.spec(&brokers)?).await?;
    let start = Instant::now();
    let blocks: usize = records.iter().map(|r| r.blocks).sum();
    let n = publish_all(&publisher, &records).await?;
    tracing::info!(records = n, blocks, secs = start.elapsed().as_secs_f64(), "trace published");
    Ok(())
}

/// Publishes the fleet's records, each worker's in order. Returns the number published.
pub async fn publish_all(publisher: &Publisher, records: &[FleetRecord]) -> anyhow::Result<usize> {
    let items =
        records.iter().enumerate().map(|(i, r)| (r.worker, 1_000 + i as i64, r.value.clone())).collect();
    Ok(publish_by_worker(publisher, items).await?.len())
}

/// Publishes `(worker, log time, record)` items, each worker's in the order given (one task per
/// worker, so workers go in parallel). Returns where each landed.
pub async fn publish_by_worker(
    p: &Publisher,
    items: Vec<(u64, i64, Vec<u8>)>,
) -> anyhow::Result<Vec<Landed>> {
    publish_by_worker_counted(p, items, &Arc::default()).await
}

/// [`publish_by_worker`], counting the records acknowledged so far in `landed` as it goes (a
/// benchmark's lag is records landed and not yet applied).
pub async fn publish_by_worker_counted(
    p: &Publisher,
    items: Vec<(u64, i64, Vec<u8>)>,
    landed: &Arc<AtomicUsize>,
) -> anyhow::Result<Vec<Landed>> {
    let mut by_worker: BTreeMap<u64, Vec<(i64, Vec<u8>)>> = BTreeMap::new();
    for (w, t, v) in items {
        by_worker.entry(w).or_default().push((t, v));
    }
    let mut tasks = Vec::new();
    for (w, vals) in by_worker {
        let (p, count) = (p.clone(), landed.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(vals.len());
            for (t, v) in vals {
                out.push(p.publish_raw(w, &v, Some(t)).await?);
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, prefixlog_ingest::PublishError>(out)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.extend(t.await??);
    }
    Ok(out)
}
