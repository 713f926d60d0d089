//! `prefixlog-lab bench-audit`: reconstructing the state at random past points of a long log from
//! the checkpoints a replica keeps under the default retention (the newest few plus the oldest
//! of every hour of log time), next to a full replay from the start to the same points.
//!
//! The log is ingested window by window with a checkpoint after each window of log time, as a
//! live replica checkpointing on its timer would leave them; retention then thins them.

use crate::bench_env::{bench_options, token, BenchLog, BenchLogArgs};
use prefixlog::fleet_records::{fleet_records, WorkloadArgs};
use prefixlog_audit::{reconstruct, Point};
use prefixlog_node::{CheckpointPolicy, NodeOptions};
use prefixlog_snapshot::{CheckpointStore, Retention};
use std::time::{Duration, Instant};

/// Log time of the start of the log (any positive value; 0 means "now" to librdkafka).
const BASE: u64 = 1_000_000;
const HOUR_MS: u64 = 3_600_000;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Hours of log: the trace (one hour) back to back this many times, fresh content each hour.
    /// 24 and more need a real broker (--brokers).
    #[arg(long, env = "PREFIXLOG_BENCH_HOURS", default_value_t = 3)]
    pub hours: usize,
    /// A checkpoint after every this much log time (retention keeps the hourly ones).
    #[arg(long, env = "PREFIXLOG_BENCH_CHECKPOINT_EVERY", default_value = "10m", value_parser = humantime::parse_duration)]
    pub checkpoint_every: Duration,
    /// Audited points, drawn uniformly over the log's time span (seeded: the same points in
    /// every run with the same arguments).
    #[arg(long, env = "PREFIXLOG_BENCH_POINTS", default_value_t = 3)]
    pub points: usize,
    #[arg(long, env = "PREFIXLOG_BENCH_SEED", default_value_t = 1)]
    pub seed: u64,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let env = BenchLog::start(&a.log, "prefixlog.bench-audit").await?;
    let dir = std::env::temp_dir().join(format!("prefixlog-bench-audit-{}", std::process::id()));
    let (records, checkpoints) = ingest_with_checkpoints(&env, &a, &dir).await?;
    let store = CheckpointStore::open_reader(&dir.join("checkpoints"))?;
    let kept = store.ids();
    println!(
        "log: {} hours, {records} records; {checkpoints} checkpoints written (one per {} of log time), {} kept by the default retention",
        a.hours,
        humantime::format_duration(a.checkpoint_every),
        kept.len()
    );

    let span = a.hours as u64 * HOUR_MS;
    println!("\n| point (log time) | audit: from checkpoint | records replayed | audit s | full replay: records | full s | audit / full |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    let (mut audit_total, mut full_total) = (0.0, 0.0);
    for i in 0..a.points as u64 {
        // Seeded, uniform enough over the span: a 64-bit mix of (seed, i).
        let at = prefixlog_engine::digest::mix64(a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i) % span;
        let point = Point::Time(BASE + at);
        let t = Instant::now();
        let r = reconstruct(Some(&store), &env.spec, &point, false)?;
        let audit_s = t.elapsed().as_secs_f64();
        let (ck, replayed, digest) = (r.checkpoint, r.replayed, r.applier.engine().digest());
        drop(r); // one engine at a time
        let t = Instant::now();
        let f = reconstruct(None, &env.spec, &point, false)?;
        let full_s = t.elapsed().as_secs_f64();
        anyhow::ensure!(f.applier.engine().digest() == digest, "audit and full replay disagree at {at} ms");
        println!(
            "| {} | {} | {replayed} | {audit_s:.2} | {} | {full_s:.2} | {:.3} |",
            humantime::format_duration(Duration::from_secs(at / 1000)),
            ck.map_or("none (log start)".into(), |c| format!("#{c}")),
            f.replayed,
            audit_s / full_s
        );
        audit_total += audit_s;
        full_total += full_s;
    }
    println!(
        "\naudit / full replay over {} random points = {:.3} (target ≤ 0.1); digests identical at every point",
        a.points,
        audit_total / full_total.max(1e-9)
    );
    drop(store);
    std::fs::remove_dir_all(&dir).ok();
    env.finish().await;
    Ok(())
}

/// Publishes the workload one checkpoint window at a time into a replica that checkpoints after
/// each window under the default retention. Returns (records, checkpoints written).
async fn ingest_with_checkpoints(
    env: &BenchLog,
    a: &Args,
    dir: &std::path::Path,
) -> anyhow::Result<(usize, usize)> {
    let records = fleet_records(&a.workload, a.hours)?;
    let opts = NodeOptions {
        data_dir: Some(dir.to_path_buf()),
        checkpoints: CheckpointPolicy {
            interval: Duration::ZERO,
            records: 0,
            retention: Retention::default(),
        },
        ..bench_options()
    };
    let replica = env.node(opts).await?;
    let step = (a.checkpoint_every.as_millis() as u64).max(1_000);
    let (mut i, mut checkpoints) = (0, 0);
    let t = Instant::now();
    let progress = indicatif::ProgressBar::new(records.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("ingest {bar:40} {pos}/{len} records {elapsed}")
            .expect("template"),
    );
    while i < records.len() {
        let window_end = (records[i].time_ms / step + 1) * step;
        let mut items = Vec::new();
        while i < records.len() && records[i].time_ms < window_end {
            let r = &records[i];
            // Log time starts at BASE: a timestamp of 0 would make librdkafka stamp the wall clock.
            items.push((r.worker, (BASE + r.time_ms) as i64, r.value.clone()));
            i += 1;
        }
        let token = token(&env.publish(items).await?);
        anyhow::ensure!(replica.status().wait_for(&token, Duration::from_secs(600)).await, "ingest stalled");
        replica.checkpoint_now()?;
        checkpoints += 1;
        progress.set_position(i as u64);
    }
    progress.finish_and_clear();
    replica.kill().await;
    println!("ingested with checkpoints in {:.1} s", t.elapsed().as_secs_f64());
    Ok((records.len(), checkpoints))
}
