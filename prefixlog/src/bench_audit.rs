//! `prefixlog bench-audit`: time to reconstruct the state at a point about an hour into a long
//! log from retained checkpoints, next to a full replay from the start to the same point.

use crate::bench_env::{bench_options, token, BenchLog};
use crate::fleet_records::{keyspace, WorkloadArgs};
use prefixlog_audit::{reconstruct, Point};
use prefixlog_ingest::record::encode_kv_events;
use prefixlog_ingest::KvOp;
use prefixlog_node::{CheckpointPolicy, NodeOptions};
use prefixlog_snapshot::{CheckpointStore, Retention};
use prefixlog_workload::{expand_request, load_trace, Event, Fleet};
use std::time::{Duration, Instant};

/// Log time of the start of the log (any positive value; 0 means "now" to librdkafka).
const BASE: u64 = 1_000_000;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Hours of log: the trace (one hour) is replayed this many times back to back, each time
    /// with fresh content.
    #[arg(long, env = "PREFIXLOG_BENCH_HOURS", default_value_t = 3)]
    pub hours: u64,
    /// A checkpoint is taken every this many minutes of log time.
    #[arg(long, env = "PREFIXLOG_BENCH_CHECKPOINT_MINUTES", default_value_t = 5)]
    pub checkpoint_minutes: u64,
    /// The audited point, in seconds of log time from the start.
    #[arg(long, env = "PREFIXLOG_BENCH_AT_SECS", default_value_t = 3750)]
    pub at_secs: u64,
    #[arg(long, env = "PREFIXLOG_BENCH_PARTITIONS", default_value_t = 16)]
    pub partitions: u32,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let env = BenchLog::start("prefixlog.bench-audit", a.partitions)?;
    let trace = load_trace(&a.workload.trace)?;
    let hour = 3_600_000u64;
    let mut fleet = Fleet::new(a.workload.workers, a.workload.capacity);
    let mut seq = vec![0u64; a.workload.workers];
    // (time, worker, value)
    let mut records: Vec<(u64, u64, Vec<u8>)> = Vec::new();
    for h in 0..a.hours {
        for req in &trace {
            let chain = expand_request(req, h as usize, a.workload.stretch);
            let conv = req.hash_ids.get(1).copied().unwrap_or(0);
            let w = (prefixlog_engine::digest::mix64(conv ^ h) % a.workload.workers as u64) as u32;
            for ev in fleet.serve(w, &chain) {
                let (w, op) = match ev {
                    Event::Stored { worker, parent_ext, blocks } => {
                        (worker, KvOp::Stored { lane: 0, parent_ext, blocks })
                    }
                    Event::Removed { worker, exts } => (worker, KvOp::Removed { lane: 0, exts }),
                };
                seq[w as usize] += 1;
                let v = encode_kv_events(&keyspace(), u64::from(w), 0, 1, seq[w as usize], false, &[op]);
                // Log time starts at BASE: a timestamp of 0 would make librdkafka stamp the wall clock.
                records.push((BASE + h * hour + req.timestamp_ms, u64::from(w), v));
            }
        }
    }
    let dir = std::env::temp_dir().join(format!("prefixlog-bench-audit-{}", std::process::id()));
    // Checkpoints only when asked; all of them kept (the audit picks among them).
    let opts = NodeOptions {
        data_dir: Some(dir.clone()),
        checkpoints: CheckpointPolicy {
            interval: Duration::ZERO,
            records: 0,
            retention: Retention { keep_last: usize::MAX, ..Default::default() },
        },
        ..bench_options()
    };
    let replica = env.node(opts).await?;
    let step = a.checkpoint_minutes.max(1) * 60_000;
    let mut i = 0;
    let mut checkpoints = 0;
    let t = Instant::now();
    while i < records.len() {
        let window_end = (records[i].0 / step + 1) * step;
        let mut items = Vec::new();
        while i < records.len() && records[i].0 < window_end {
            items.push((records[i].1, records[i].0 as i64, std::mem::take(&mut records[i].2)));
            i += 1;
        }
        let token = token(&env.publish(items).await?);
        anyhow::ensure!(replica.status().wait_for(&token, Duration::from_secs(600)).await, "ingest stalled");
        replica.checkpoint_now()?;
        checkpoints += 1;
    }
    replica.kill().await;
    println!(
        "log: {} hours of trace time, {} records; {checkpoints} checkpoints (every {} min) written while ingesting in {:.1} s",
        a.hours,
        records.len(),
        a.checkpoint_minutes,
        t.elapsed().as_secs_f64()
    );
    let store = CheckpointStore::open_reader(&dir.join("checkpoints"))?;
    let point = Point::Time(BASE + a.at_secs * 1000);
    let t = Instant::now();
    let r = reconstruct(Some(&store), &env.spec, &point, false)?;
    let audit_s = t.elapsed().as_secs_f64();
    let (ck, replayed, d1) = (r.checkpoint, r.replayed, r.applier.engine().digest());
    drop(r);
    let t = Instant::now();
    let f = reconstruct(None, &env.spec, &point, false)?;
    let full_s = t.elapsed().as_secs_f64();
    anyhow::ensure!(f.applier.engine().digest() == d1, "audit and full replay disagree");
    println!("\n| path to the state at {} s of log time | records replayed | seconds |", a.at_secs);
    println!("|---|---:|---:|");
    println!(
        "| audit: checkpoint {} + replay | {replayed} | {audit_s:.2} |",
        ck.map_or("-".into(), |c| c.to_string())
    );
    println!("| full replay from offset 0 | {} | {full_s:.2} |", f.replayed);
    println!("\naudit / full = {:.3} (target ≤ 0.1); identical digests", audit_s / full_s);
    std::fs::remove_dir_all(&dir).ok();
    Ok(())
}
