//! `prefixlog-lab demo --faults`: a fault schedule run while the gateways' request stream goes
//! on, and what the gateways saw in each window.
//!
//! Windows are contiguous: `calm` (the baseline, no fault) first, then one window per fault,
//! from the moment the fault starts until every replica is ready again plus a settle time. Each
//! decision is counted in the window its query started in ([`Clock`]):
//! - **exact**: answered, at or past the gateway's own read-your-writes token;
//! - **stale**: answered by a replica behind that token (or flagged stale);
//! - **blind**: no answer within the deadline (the gateway routed fail-open);
//! - routing quality (hit / oracle hit), p50/p99 of the answer latency (a blind decision
//!   counts at the time it gave up), and the recovery time (fault start → every replica ready).
//!
//! Faults ([`Fault`]): `rolling` (every replica in turn: clean stop, final checkpoint, restart
//! from it, catch up), `crash` (one replica killed mid-apply, no final checkpoint, restarted),
//! `empty` (a replica's disk wiped, restarted from nothing while traffic runs), `broker` (on a
//! three-broker embedded cluster, the broker leading every partition is stopped for
//! `--fault-broker-down`; after `--fault-election` the others elect a new leader, as a Kafka
//! controller does; the stopped broker comes back as a follower). A broker window's recovery is
//! fault start → every replica has applied the log's end as it stood once the new leader took
//! over: the index is whole again while the old broker is still down.

use super::cluster::Cluster;
use super::report::{percentile_ms, Answered, Outcome};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What `--faults` selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultSet {
    Rolling,
    Crash,
    Empty,
    Broker,
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Rolling,
    Crash,
    Empty,
    Broker,
}

impl FaultSet {
    pub fn faults(self) -> Vec<Fault> {
        match self {
            FaultSet::Rolling => vec![Fault::Rolling],
            FaultSet::Crash => vec![Fault::Crash],
            FaultSet::Empty => vec![Fault::Empty],
            FaultSet::Broker => vec![Fault::Broker],
            FaultSet::All => vec![Fault::Rolling, Fault::Crash, Fault::Empty, Fault::Broker],
        }
    }
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Rolling => "rolling",
            Fault::Crash => "crash",
            Fault::Empty => "empty",
            Fault::Broker => "broker",
        }
    }
}

impl FaultSet {
    /// Brokers the demo's embedded cluster needs: three (replication factor 3) to stop one.
    pub fn brokers(self) -> u8 {
        if self.faults().contains(&Fault::Broker) {
            3
        } else {
            1
        }
    }
}

/// The leader every partition starts on, and the one a broker window stops.
const LEADER: u8 = 1;
/// The broker elected leader in a broker window.
const SUCCESSOR: u8 = 2;

/// The window decisions are counted in now (0: the calm baseline). Shared by the schedule
/// (which moves it) and the gateways (which read it when a query starts).
#[derive(Default)]
pub struct Clock {
    window: AtomicU8,
    /// Set when the schedule is over: the replay stops.
    done: AtomicBool,
}

impl Clock {
    pub fn window(&self) -> u8 {
        self.window.load(Ordering::Relaxed)
    }

    pub fn done(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }
}

/// One window as run.
pub struct Window {
    pub name: &'static str,
    /// Fault start → every replica ready (None for the calm baseline).
    pub recovery: Option<Duration>,
    pub note: String,
}

pub struct Schedule {
    pub faults: Vec<Fault>,
    pub baseline: Duration,
    pub settle: Duration,
    /// How long a broker window keeps the leaders' broker stopped.
    pub broker_down: Duration,
    /// How long after the stop a new leader is elected.
    pub election: Duration,
}

/// Runs the schedule against `cluster` (given back at the end) while traffic goes on; marks
/// the clock done in every case so that the replay stops.
pub async fn drive(
    mut cluster: Cluster,
    schedule: Option<Schedule>,
    clock: Arc<Clock>,
) -> anyhow::Result<(Cluster, Vec<Window>)> {
    let result = match schedule {
        None => Ok(Vec::new()),
        Some(s) => run(&mut cluster, &s, &clock).await,
    };
    clock.done.store(true, Ordering::Relaxed);
    Ok((cluster, result?))
}

async fn run(cluster: &mut Cluster, s: &Schedule, clock: &Clock) -> anyhow::Result<Vec<Window>> {
    let mut windows = vec![Window { name: "calm", recovery: None, note: "no fault (baseline)".into() }];
    tokio::time::sleep(s.baseline).await;
    for &f in &s.faults {
        clock.window.store(windows.len() as u8, Ordering::Relaxed);
        let t = Instant::now();
        let (note, recovery) = if f == Fault::Broker {
            broker_window(cluster, s, t).await?
        } else {
            (inject(cluster, f).await?, None)
        };
        anyhow::ensure!(
            cluster.wait_all_ready(Duration::from_secs(120)).await,
            "{}: replicas not ready 120 s after the fault",
            f.name()
        );
        windows.push(Window {
            name: f.name(),
            recovery: Some(recovery.unwrap_or_else(|| t.elapsed())),
            note,
        });
        tokio::time::sleep(s.settle).await;
    }
    Ok(windows)
}

/// Does fault `f` and restarts what it stopped; returns what happened, for the table.
async fn inject(cluster: &mut Cluster, f: Fault) -> anyhow::Result<String> {
    let n = cluster.nodes.len();
    Ok(match f {
        Fault::Rolling => {
            let mut checkpoints = 0;
            for i in 0..n {
                checkpoints += usize::from(cluster.stop(i).await?);
                cluster.restart(i, false).await?;
                anyhow::ensure!(
                    cluster.wait_all_ready(Duration::from_secs(120)).await,
                    "rolling: replica {i} not ready 120 s after its restart"
                );
            }
            format!("{n} clean stops, {checkpoints} final checkpoints, restarts from them")
        }
        Fault::Crash => {
            cluster.kill(0).await;
            cluster.restart(0, false).await?;
            "replica 0 killed (no final checkpoint), restarted".into()
        }
        Fault::Empty => {
            cluster.stop(n - 1).await?;
            cluster.restart(n - 1, true).await?;
            format!("replica {} restarted from an empty disk", n - 1)
        }
        Fault::Broker => unreachable!("the broker window runs in broker_window"),
    })
}

/// Stops the leaders' broker for `s.broker_down`, elects another after `s.election`; returns
/// what happened and the recovery (`start` → every replica applied the log's end as it stood
/// once the new leader took over).
async fn broker_window(
    cluster: &Cluster,
    s: &Schedule,
    start: Instant,
) -> anyhow::Result<(String, Option<Duration>)> {
    anyhow::ensure!(s.election < s.broker_down, "--fault-election must be shorter than --fault-broker-down");
    cluster.stop_broker(LEADER)?;
    tracing::info!(broker = LEADER, "fault: the leaders' broker stopped");
    tokio::time::sleep(s.election).await;
    cluster.elect_leader(SUCCESSOR)?;
    tracing::info!(broker = SUCCESSOR, "fault: a new leader of every partition elected");
    let end = cluster.log_end().await?;
    anyhow::ensure!(
        cluster.wait_caught_up(&end, Duration::from_secs(120)).await,
        "broker: replicas did not apply the log's end 120 s after the new leader took over"
    );
    let recovery = start.elapsed();
    tracing::info!(secs = recovery.as_secs_f64(), "fault: every replica applied the log's end");
    tokio::time::sleep(s.broker_down.saturating_sub(start.elapsed())).await;
    cluster.start_broker(LEADER)?;
    let note = format!(
        "broker {LEADER} (leader of every partition) stopped {:.0} s; broker {SUCCESSOR} elected after {:.1} s",
        s.broker_down.as_secs_f64(),
        s.election.as_secs_f64()
    );
    Ok((note, Some(recovery)))
}

/// What gateways saw in one window.
struct Seen {
    decisions: usize,
    exact: usize,
    stale: usize,
    blind: usize,
    quality: f64,
    sorted_us: Vec<u64>,
}

fn seen(v: &[&Outcome]) -> Seen {
    let blind = v.iter().filter(|o| o.answered == Answered::Unavailable).count();
    let stale = v.iter().filter(|o| o.answered != Answered::Unavailable && o.stale).count();
    let hit: u64 = v.iter().map(|o| o.hit.weighted(o.host_weight)).sum();
    let oracle: u64 = v.iter().map(|o| o.oracle.weighted(o.host_weight)).sum();
    let mut sorted_us: Vec<u64> = v.iter().map(|o| o.query_us).collect();
    sorted_us.sort_unstable();
    Seen {
        decisions: v.len(),
        exact: v.len() - blind - stale,
        stale,
        blind,
        quality: if oracle == 0 { 1.0 } else { hit as f64 / oracle as f64 },
        sorted_us,
    }
}

fn in_window(v: &[Outcome], w: usize) -> Vec<&Outcome> {
    v.iter().filter(|o| usize::from(o.window) == w).collect()
}

/// The per-window table and the summary line.
pub fn report(v: &[Outcome], windows: &[Window]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| window | decisions | exact | stale | blind | quality vs oracle | p50 ms | p99 ms | recovery s | what |"
    );
    let _ = writeln!(t, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for (w, win) in windows.iter().enumerate() {
        let s = seen(&in_window(v, w));
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {:.3} | {:.2} | {:.2} | {} | {} |",
            win.name,
            s.decisions,
            s.exact,
            s.stale,
            s.blind,
            s.quality,
            percentile_ms(&s.sorted_us, 0.5),
            percentile_ms(&s.sorted_us, 0.99),
            win.recovery.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64())),
            win.note
        );
    }
    t.push_str(&summary_line(v, windows));
    t
}

/// `faults: blind N of M, stale N, quality X.XXx oracle, p99 during faults X.XXx without,
/// recovery max N s`: blind and stale over the whole run, quality of the worst fault window,
/// p99 over every fault window against the calm one's.
pub fn summary_line(v: &[Outcome], windows: &[Window]) -> String {
    let all = seen(&v.iter().collect::<Vec<_>>());
    let calm = seen(&in_window(v, 0));
    let faulty: Vec<&Outcome> = v.iter().filter(|o| o.window > 0).collect();
    let during = if faulty.is_empty() { seen(&in_window(v, 0)) } else { seen(&faulty) };
    let worst = (1..windows.len())
        .map(|w| seen(&in_window(v, w)).quality)
        .fold(None, |m: Option<f64>, q| Some(m.map_or(q, |m| m.min(q))))
        .unwrap_or(calm.quality);
    let p99 = |s: &Seen| percentile_ms(&s.sorted_us, 0.99);
    let ratio = p99(&during) / p99(&calm).max(1e-9);
    let recovery = windows.iter().filter_map(|w| w.recovery).max().unwrap_or_default();
    format!(
        "faults: blind {} of {}, stale {}, quality {:.2}x oracle, p99 during faults {:.2}x without, recovery max {} s",
        all.blind,
        all.decisions,
        all.stale,
        worst,
        ratio,
        recovery.as_secs_f64().ceil() as u64
    )
}
