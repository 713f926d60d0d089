//! `prefixlog bench-ingest`: Kafka → apply throughput next to raw consume throughput, same run,
//! same records, embedded broker.

use crate::bench_env::{bench_options, BenchLog};
use crate::fleet_records::{fleet_records, keyspace, WorkloadArgs};
use prefixlog_ingest::reader::{LogReader, Read};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let env = BenchLog::start(&a.log, "prefixlog.bench").await?;
    let records = fleet_records(&a.workload, 1)?;
    let blocks: usize = records.iter().map(|r| r.blocks).sum();
    let publisher = &env.publisher;
    let t = Instant::now();
    let n = crate::replay::publish_all(publisher, &records).await?;
    publisher.flush(Duration::from_secs(60))?;
    let publish_s = t.elapsed().as_secs_f64();
    println!(
        "workload: {n} records, {blocks} blocks ({} keyspace), {} partitions; published in {publish_s:.2} s",
        keyspace(),
        a.log.partitions
    );

    // Raw consume: every record fetched (by the same reader a replica uses) and touched,
    // nothing applied.
    let mut reader = LogReader::open(&env.spec, (0..a.log.partitions).map(|p| (p, 0)))?;
    let t = Instant::now();
    let (mut got, mut bytes) = (0usize, 0usize);
    while got < n {
        match reader.poll(Duration::from_millis(100)) {
            Read::Record(r) => {
                bytes += r.payload().map_or(0, |p| std::hint::black_box(p).len());
                got += 1;
            }
            Read::Discontinuity(d) => anyhow::bail!("the benchmark log has a gap: {d}"),
            Read::Idle | Read::BrokerError(_) => {}
        }
    }
    let raw_s = t.elapsed().as_secs_f64();
    drop(reader);

    // Replica: consume + decode + apply, timed from the moment the node is up (its start —
    // probing the topic, the compaction check, opening the reader — is reported on its own:
    // it is a fixed cost, not throughput). Records applied during the start are left out of
    // the rate, and the blocks with them in proportion.
    let t = Instant::now();
    let node = env.node(bench_options()).await?;
    let start_s = t.elapsed().as_secs_f64();
    let applied = || node.status().records_applied.load(std::sync::atomic::Ordering::Acquire);
    let before = applied();
    let t = Instant::now();
    while applied() < n as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let apply_s = t.elapsed().as_secs_f64();
    let hb = node.engine().holder_blocks();
    node.kill().await;

    let timed = n as f64 - before as f64;
    let raw = blocks as f64 / raw_s / 1e6;
    let apply = blocks as f64 * (timed / n as f64) / apply_s / 1e6;
    println!("\n| path | records/s | M blocks/s | seconds |");
    println!("|---|---:|---:|---:|");
    println!("| raw consume (librdkafka, no apply) | {:.0} | {raw:.2} | {raw_s:.2} |", n as f64 / raw_s);
    println!("| replica consume + decode + apply | {:.0} | {apply:.2} | {apply_s:.2} |", timed / apply_s);
    println!("| (replica start-up before that: probe, checks, reader; {before} records applied meanwhile) | | | {start_s:.2} |");
    println!(
        "\napply / raw = {:.2} (target ≥ 0.9); {bytes} payload bytes; {hb} resident holder-blocks after apply",
        apply / raw
    );
    env.finish().await;
    Ok(())
}
