//! `bench-query --in-flight N`: the replica's CPU per query on the streaming path (one
//! `MatchStream` through the client's multiplexer) beside unary `Match`, at N queries in
//! flight, in one run (issue 39, item 3: target stream ≤ 0.6× unary).
//!
//! Method: against the idle, caught-up replica, the client thread keeps N queries in flight
//! until `queries` are answered: first as unary calls over one HTTP/2 connection, then over
//! one stream. The channel is made on the client thread, so the client's connection task and
//! decoding run there. The replica's CPU is the run time (`/proc/self/task/*/schedstat`,
//! nanoseconds) of every thread of the process but the client's, read before and after; it
//! includes the idle replica's own background threads, small and alike in both runs.

use crate::client_thread::ClientThread;
use prefixlog_client::StreamMux;
use prefixlog_proto::v1::{prefix_index_client::PrefixIndexClient, MatchRequest};
use prefixlog_query::tonic::transport::Endpoint;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One path's cost.
pub struct Cost {
    pub path: &'static str,
    pub queries: usize,
    pub replica_cpu: Duration,
    pub wall: Duration,
}

impl Cost {
    pub fn us_per_query(&self) -> f64 {
        self.replica_cpu.as_secs_f64() * 1e6 / self.queries.max(1) as f64
    }
}

/// Unary, then `streams` streams, each for `n` queries at `in_flight` in flight.
pub async fn compare(
    client: &ClientThread,
    endpoint: String,
    queries: Arc<[MatchRequest]>,
    (in_flight, streams): (usize, usize),
    n: usize,
) -> anyhow::Result<[Cost; 2]> {
    let mut out = Vec::new();
    for streaming in [false, true] {
        let (ep, qs) = (endpoint.clone(), queries.clone());
        // Warm-up (connections, buffers), not counted.
        let streams = if streaming { streams.max(1) } else { 0 };
        client.run(drive(ep.clone(), qs.clone(), in_flight, streams, Until::Asked(n / 10))).await??;
        let (cpu, t) = (replica_cpu(), Instant::now());
        let driven = client.run(drive(ep, qs, in_flight, streams, Until::Asked(n))).await??;
        anyhow::ensure!(
            driven.failed == 0,
            "{} of {n} queries failed against the idle replica",
            driven.failed
        );
        let (wall, replica_cpu) = (t.elapsed(), replica_cpu().saturating_sub(cpu));
        out.push(Cost {
            path: if streaming { "MatchStream" } else { "Match" },
            queries: n,
            replica_cpu,
            wall,
        });
    }
    let [u, s]: [Cost; 2] = out.try_into().map_err(|_| anyhow::anyhow!("two runs"))?;
    Ok([u, s])
}

/// When a [`drive`] ends.
#[derive(Clone)]
pub enum Until {
    /// Once this many queries are asked.
    Asked(usize),
    /// Once the flag turns true.
    Stopped(Arc<AtomicBool>),
}

impl Until {
    /// Whether query number `i` (from 0) is not to be asked.
    fn done(&self, i: usize) -> bool {
        match self {
            Until::Asked(n) => i >= *n,
            Until::Stopped(stop) => stop.load(Ordering::Acquire),
        }
    }
}

/// What the queries of a [`drive`] got.
#[derive(Default)]
pub struct Driven {
    /// Latencies of answered queries, sorted (at most [`MAX_SAMPLES`] kept).
    pub latencies: Vec<Duration>,
    pub answered: usize,
    pub failed: usize,
}

/// Latency samples kept per drive (a fixed bound: a drive's length depends on the machine).
const MAX_SAMPLES: usize = 4_000_000;

/// Keeps `in_flight` queries going until `until` (on the client thread): unary calls with
/// `streams` = 0, else spread over that many streams (a stream is one task, one core, on the
/// replica). A failed query is counted, not fatal: the caller decides.
pub async fn drive(
    endpoint: String,
    queries: Arc<[MatchRequest]>,
    in_flight: usize,
    streams: usize,
    until: Until,
) -> anyhow::Result<Driven> {
    let ch = Endpoint::from_shared(endpoint)?.tcp_nodelay(true).connect().await?;
    let muxes: Vec<Arc<StreamMux>> = (0..streams).map(|_| Arc::new(StreamMux::new(ch.clone()))).collect();
    let (next, until) = (Arc::new(AtomicUsize::new(0)), Arc::new(until));
    let samples = MAX_SAMPLES / in_flight.max(1);
    let mut set = tokio::task::JoinSet::new();
    for j in 0..in_flight.max(1) {
        let mux = (streams > 0).then(|| muxes[j % streams].clone());
        let (mut unary, next, queries, until) =
            (PrefixIndexClient::new(ch.clone()), next.clone(), queries.clone(), until.clone());
        set.spawn(async move {
            let mut mine = Driven::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if until.done(i) {
                    return mine;
                }
                let q = queries[i % queries.len()].clone();
                let t = Instant::now();
                let ok = match &mux {
                    Some(mux) => {
                        mux.ask(q, tokio::time::Instant::now() + Duration::from_secs(30)).await.is_ok()
                    }
                    None => unary.r#match(q).await.is_ok(),
                };
                if !ok {
                    mine.failed += 1;
                    continue;
                }
                mine.answered += 1;
                if mine.latencies.len() < samples {
                    mine.latencies.push(t.elapsed());
                }
            }
        });
    }
    let mut all = Driven::default();
    while let Some(r) = set.join_next().await {
        let r = r?;
        all.answered += r.answered;
        all.failed += r.failed;
        all.latencies.extend(r.latencies);
    }
    all.latencies.sort_unstable();
    Ok(all)
}

/// What an open loop ([`drive_at`]) got.
pub struct OpenLoop {
    /// Latency from when each query was sent.
    pub driven: Driven,
    /// Latency from when each query was due (what a gateway whose request arrived then would
    /// see, the client's own delays included), sorted.
    pub from_due: Vec<Duration>,
    /// How late each query was sent after it was due (the client's timer: tokio's has 1 ms
    /// resolution, so queries leave in bursts of up to a millisecond's worth), sorted.
    pub late: Vec<Duration>,
}

/// Offers `rate` queries/s until `until` (open loop): query i is due i / rate s after the
/// start and is sent then, whatever is still in flight, so a replica that falls behind shows
/// it in the latencies, not in fewer queries asked. Over `streams` `MatchStream` streams, or
/// as unary `Match` calls with `streams` = 0. Latency counts from the send; how late the
/// client's timer sent each query is reported apart. Run on the client thread.
pub async fn drive_at(
    endpoint: String,
    queries: Arc<[MatchRequest]>,
    rate: f64,
    until: Until,
    streams: usize,
) -> anyhow::Result<OpenLoop> {
    let ch = Endpoint::from_shared(endpoint)?.tcp_nodelay(true).connect().await?;
    let muxes: Vec<Arc<StreamMux>> = (0..streams).map(|_| Arc::new(StreamMux::new(ch.clone()))).collect();
    let unary = PrefixIndexClient::new(ch);
    open_loop(rate, until, |i, deadline| {
        let q = queries[i % queries.len()].clone();
        match muxes.get(i % streams.max(1)).cloned() {
            Some(mux) => Box::pin(async move { mux.ask(q, deadline).await.is_ok() }),
            None => {
                let mut c = unary.clone();
                Box::pin(async move { c.r#match(q).await.is_ok() })
            }
        }
    })
    .await
}

/// One query of an open loop: resolves to whether it was answered.
pub type Asked = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// The open loop of [`drive_at`] over any protocol: `ask(i, deadline)` sends query number `i`
/// when it is due (its future is spawned at once).
pub async fn open_loop(
    rate: f64,
    until: Until,
    mut ask: impl FnMut(usize, tokio::time::Instant) -> Asked,
) -> anyhow::Result<OpenLoop> {
    anyhow::ensure!(rate > 0.0, "an open loop needs a rate");
    let (mut all, mut late, mut from_due) = (Driven::default(), Vec::new(), Vec::new());
    let mut set = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_micros(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let start = tokio::time::Instant::now();
    let mut asked = 0usize;
    while !until.done(asked) {
        tick.tick().await;
        let due_by_now = (start.elapsed().as_secs_f64() * rate) as usize;
        for i in (asked..due_by_now).take_while(|&i| !until.done(i)) {
            let due = start + Duration::from_secs_f64(i as f64 / rate);
            let sent = tokio::time::Instant::now();
            if late.len() < MAX_SAMPLES {
                late.push(sent - due);
            }
            asked = i + 1;
            let answer = ask(i, sent + Duration::from_secs(30));
            set.spawn(async move { (answer.await, sent.elapsed(), due.elapsed()) });
        }
        while let Some(r) = set.try_join_next() {
            tally(&mut all, &mut from_due, r);
        }
    }
    while let Some(r) = set.join_next().await {
        tally(&mut all, &mut from_due, r);
    }
    all.latencies.sort_unstable();
    late.sort_unstable();
    from_due.sort_unstable();
    Ok(OpenLoop { driven: all, from_due, late })
}

/// Counts one open-loop query's outcome: (answered, from sent, from due).
fn tally(
    all: &mut Driven,
    from_due: &mut Vec<Duration>,
    r: Result<(bool, Duration, Duration), tokio::task::JoinError>,
) {
    match r {
        Ok((true, latency, since_due)) => {
            all.answered += 1;
            if all.latencies.len() < MAX_SAMPLES {
                all.latencies.push(latency);
                from_due.push(since_due);
            }
        }
        _ => all.failed += 1,
    }
}

/// Run time of every thread of this process but the bench client's.
fn replica_cpu() -> Duration {
    let mut ns = 0u64;
    for t in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "bench-client" {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        ns += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Duration::from_nanos(ns)
}

/// The report: one row per path, and the target line.
pub fn print(costs: &[Cost; 2], (in_flight, streams): (usize, usize)) {
    println!("\n| path | in flight | queries | replica CPU µs/query | queries/s |");
    println!("|---|---:|---:|---:|---:|");
    for c in costs {
        let path = if c.path == "Match" { c.path.to_string() } else { format!("{} ×{streams}", c.path) };
        println!(
            "| {} | {in_flight} | {} | {:.1} | {:.0} |",
            path,
            c.queries,
            c.us_per_query(),
            c.queries as f64 / c.wall.as_secs_f64()
        );
    }
    let ratio = costs[1].us_per_query() / costs[0].us_per_query();
    println!(
        "replica CPU per query, MatchStream / Match: {ratio:.2}× (target ≤ 0.6×: {})",
        if ratio <= 0.6 { "yes" } else { "**no**" }
    );
}
