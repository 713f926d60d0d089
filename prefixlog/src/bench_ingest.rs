//! `prefixlog bench-ingest`: Kafka → apply throughput next to raw consume throughput, same run,
//! same records, embedded broker.

use crate::bench_env::BenchLog;
use crate::fleet_records::{fleet_records, keyspace, WorkloadArgs};
use prefixlog_ingest::Replica;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Partitions of the benchmark topic.
    #[arg(long, default_value_t = 16)]
    pub partitions: u32,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let topic = "prefixlog.bench";
    let env = BenchLog::start(topic, a.partitions)?;
    let brokers = env.brokers().to_string();
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
        a.partitions
    );

    // Raw consume: every record fetched and touched, nothing applied.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", "bench-raw")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..a.partitions {
        tpl.add_partition_offset(topic, p as i32, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let t = Instant::now();
    let (mut got, mut bytes) = (0usize, 0usize);
    while got < n {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m?;
            bytes += m.payload().map_or(0, |p| std::hint::black_box(p).len());
            got += 1;
        }
    }
    let raw_s = t.elapsed().as_secs_f64();
    drop(consumer);

    // Replica: consume + decode + apply.
    let applier = env.fresh_applier();
    let engine = applier.engine().clone();
    let t = Instant::now();
    let replica = Replica::start(env.replica_cfg.clone(), applier)?;
    while replica.status().records_applied.load(std::sync::atomic::Ordering::Acquire) < n as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let apply_s = t.elapsed().as_secs_f64();
    let hb = engine.holder_blocks();
    drop(replica);

    let raw = blocks as f64 / raw_s / 1e6;
    let apply = blocks as f64 / apply_s / 1e6;
    println!("\n| path | records/s | M blocks/s | seconds |");
    println!("|---|---:|---:|---:|");
    println!("| raw consume (librdkafka, no apply) | {:.0} | {raw:.2} | {raw_s:.2} |", n as f64 / raw_s);
    println!("| replica consume + decode + apply | {:.0} | {apply:.2} | {apply_s:.2} |", n as f64 / apply_s);
    println!("\napply / raw = {:.2} (target ≥ 0.7); {bytes} payload bytes; {hb} resident holder-blocks after apply", apply / raw);
    Ok(())
}
