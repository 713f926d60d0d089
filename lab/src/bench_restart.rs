//! `prefixlog-lab bench-restart`: time to ready from a checkpoint plus a tail, next to rebuilding
//! the same state by replaying the whole log (same run, same records, embedded broker).

use crate::bench_env::{bench_options, token, BenchLog};
use prefixlog::fleet_records::{fleet_records, WorkloadArgs};
use prefixlog_node::{CheckpointPolicy, NodeOptions};
use prefixlog_snapshot::{restore, CheckpointStore};
use prefixlog_workload::quantile::median;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// The tail: records of the last this-many ms of trace time are published after the
    /// checkpoint.
    #[arg(long, env = "PREFIXLOG_BENCH_TAIL_MS", default_value_t = 60_000)]
    pub tail_ms: u64,
    /// Hours of log: the one-hour trace back to back this many times, fresh content each hour
    /// (a fleet serving new conversations). The state stays bounded by capacity while the log
    /// a full replay must read grows; production logs are retained for days.
    #[arg(long, env = "PREFIXLOG_BENCH_HOURS", default_value_t = 1)]
    pub hours: usize,
    /// Times the restore (open, read + verify + decode, rebuild) is repeated on the checkpoint;
    /// each phase reports its median (a shared machine varies by tens of percent run to run).
    #[arg(long, env = "PREFIXLOG_BENCH_RESTORES", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub restores: u32,
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let topic = "prefixlog.bench-restart";
    let env = BenchLog::start(&a.log, topic).await?;
    let records = fleet_records(&a.workload, a.hours)?;
    let end = records.iter().map(|r| r.time_ms).max().unwrap_or(0);
    let cut = end.saturating_sub(a.tail_ms);
    let (head, tail): (Vec<_>, Vec<_>) = records.iter().partition(|r| r.time_ms < cut);

    // Head → a replica → checkpoint.
    let stamp = |r: &&prefixlog::fleet_records::FleetRecord| {
        (r.worker, 1_000_000 + r.time_ms as i64, r.value.clone())
    };
    let head_landed = env.publish(head.iter().map(stamp).collect()).await?;
    let dir = tempdir()?;
    // Checkpoints only when asked (no timer, no record count).
    let with_store = NodeOptions {
        data_dir: Some(dir.clone()),
        checkpoints: CheckpointPolicy { interval: Duration::ZERO, records: 0, ..Default::default() },
        ..bench_options()
    };
    let r = env.node(with_store.clone()).await?;
    anyhow::ensure!(
        r.status().wait_for(&token(&head_landed), Duration::from_secs(3600)).await,
        "head not applied"
    );
    {
        let a = r.applier().lock();
        let skipped: u64 = a
            .partitions()
            .iter()
            .map(|p| p.counters.duplicates + p.counters.stale_epochs + p.counters.bad.values().sum::<u64>())
            .sum();
        println!(
            "head applied: {} records applied, {skipped} skipped, {} holder-blocks",
            r.status().records_applied.load(std::sync::atomic::Ordering::Relaxed),
            a.engine().holder_blocks()
        );
    }
    // Queries keep running while the checkpoint is captured and written: measure them.
    let engine = r.engine();
    let q: Vec<u64> = prefixlog_workload::expand_request(
        &prefixlog_workload::TraceRequest { timestamp_ms: 0, hash_ids: vec![0, 1, 2, 3, 4, 5] },
        0,
        a.workload.stretch,
    )
    .iter()
    .map(|b| b.local)
    .collect();
    let baseline = {
        let t = Instant::now();
        let mut lat = Vec::new();
        while t.elapsed() < Duration::from_secs(3) {
            let s = Instant::now();
            std::hint::black_box(engine.match_chain(
                &prefixlog::fleet_records::keyspace(),
                &q,
                &Default::default(),
            ));
            lat.push(s.elapsed());
        }
        lat.sort_unstable();
        lat
    };
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let querier = {
        let (done, ks) = (done.clone(), prefixlog::fleet_records::keyspace());
        std::thread::spawn(move || {
            let mut lat = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let t = Instant::now();
                std::hint::black_box(engine.match_chain(&ks, &q, &Default::default()));
                lat.push(t.elapsed());
            }
            lat
        })
    };
    let t = Instant::now();
    let meta = r.checkpoint_now()?.expect("the node has a store");
    let write_s = t.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Release);
    let mut lat = querier.join().expect("querier");
    lat.sort_unstable();
    let pct = |q: f64| prefixlog_workload::quantile::quantile_us(&lat, q);
    println!(
        "queries during the checkpoint: {} answered, p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        lat.len(),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    let b = |q: f64| prefixlog_workload::quantile::quantile_us(&baseline, q);
    println!(
        "queries without a checkpoint (3 s baseline, same run): {} answered, p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        baseline.len(),
        b(0.5),
        b(0.99),
        b(1.0)
    );
    r.kill().await;
    let tail_landed = env.publish(tail.iter().map(stamp).collect()).await?;
    let all_ends = token(&[head_landed, tail_landed.clone()].concat());
    let hb = meta.holder_blocks();
    println!(
        "workload: {} hours, {} records, {:.0} MB ({} head, {} in the last {} s of trace time), checkpoint of {hb} holder-blocks",
        a.hours,
        records.len(),
        records.iter().map(|r| r.value.len()).sum::<usize>() as f64 / 1e6,
        head.len(),
        tail.len(),
        a.tail_ms / 1000
    );
    println!("checkpoint: written in {write_s:.2} s (queries not blocked)");

    let (open_s, read_s, restore_s) = time_restores(&dir.join("checkpoints"), meta.id, a.restores)?;

    // Restart: a replica on the same data dir (restore + the tail), to caught up.
    let t = Instant::now();
    let r = env.node(with_store).await?;
    anyhow::ensure!(r.status().wait_for(&all_ends, Duration::from_secs(3600)).await, "tail not applied");
    let restart_s = t.elapsed().as_secs_f64();
    let d_restart: Vec<u64> = (0..a.log.partitions).map(|p| r.applier().lock().partition_digest(p)).collect();
    r.kill().await;

    // Full replay from offset 0.
    let t = Instant::now();
    let r = env.node(bench_options()).await?;
    anyhow::ensure!(
        r.status().wait_for(&all_ends, Duration::from_secs(3600)).await,
        "full replay incomplete"
    );
    let full_s = t.elapsed().as_secs_f64();
    let d_full: Vec<u64> = (0..a.log.partitions).map(|p| r.applier().lock().partition_digest(p)).collect();
    r.kill().await;
    anyhow::ensure!(d_restart == d_full, "restarted replica's digests differ from the full replay's");

    println!("\n| path | seconds |");
    println!("|---|---:|");
    println!("| restart: open the store | {open_s:.2} |");
    println!("| restart: read + verify + decode checkpoint (median of {}) | {read_s:.2} |", a.restores);
    println!(
        "| restart: rebuild engine (median of {}: {:.1} M holder-blocks/s) | {restore_s:.2} |",
        a.restores,
        hb as f64 / restore_s / 1e6
    );
    println!("| restart total to caught up (incl. tail replay) | {restart_s:.2} |");
    println!("| full replay from offset 0 | {full_s:.2} |");
    println!(
        "\nrestart / full replay = {:.3} (target ≤ 0.05); restore (read + verify + rebuild) {:.1} M holder-blocks/s (target ≥ 20); digests identical",
        restart_s / full_s,
        hb as f64 / (read_s + restore_s) / 1e6
    );
    std::fs::remove_dir_all(&dir).ok();
    env.finish().await;
    Ok(())
}

/// The restore's phases, timed on their own `n` times: open the store, read + verify + decode
/// the checkpoint, rebuild the engine. Returns each phase's median, in seconds.
fn time_restores(path: &std::path::Path, id: u64, n: u32) -> anyhow::Result<(f64, f64, f64)> {
    let mut runs = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let store = CheckpointStore::open(path)?;
        let open_s = t.elapsed().as_secs_f64();
        let loaded = store.load(id)?;
        let read_s = t.elapsed().as_secs_f64() - open_s;
        let restored = restore(&loaded)?;
        let restore_s = t.elapsed().as_secs_f64() - open_s - read_s;
        // Freeing the engine is not part of getting ready: dropped outside the timing.
        drop((restored, loaded, store));
        println!(
            "restore {}: open {open_s:.3} s, read + verify + decode {read_s:.3} s, rebuild {restore_s:.3} s",
            i + 1
        );
        runs.push([open_s, read_s, restore_s]);
    }
    let median_of = |k: usize| median(runs.iter().map(|r| r[k]));
    Ok((median_of(0), median_of(1), median_of(2)))
}

fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("prefixlog-bench-restart-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
