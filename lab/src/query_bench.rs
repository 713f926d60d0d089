//! `prefixlog-lab bench-query`: Match latency over gRPC on loopback, idle and while the replica
//! ingests at full rate, next to a trivial Echo RPC in the same run (embedded broker).
//!
//! Method: the trace workload's KV events are published once. Phase "idle": a replica applies
//! all of them, then one client (one HTTP/2 connection, one call in flight) alternates Match
//! (the workload's own queries, as precomputed block hashes) and Echo (a payload of the same
//! size as the Match request) calls, so both see the same conditions. Phase "ingesting": a
//! fresh replica starts from offset 0 and the same alternating loop runs against it until it
//! has caught up — the replica's ingest thread applies as fast as it can meanwhile. One
//! catch-up lasts under a second (~1,100–1,700 calls here, whose p99 is their 12th–18th
//! slowest), so the phase runs `--catch-ups` of them, one fresh replica after another, and pools
//! their calls. The client's calls (and its decoding of the answers) run on a thread of its own
//! ([`crate::client_thread::ClientThread`]); its HTTP/2 connection task runs on the runtime's workers, as before.
//! With `--in-flight N`, the idle replica's CPU per query on `MatchStream` is also measured
//! beside unary `Match` at N in flight ([`crate::stream_bench`]).

use crate::bench_env::{bench_options, BenchLog};
use crate::client_thread::ClientThread;
use prefixlog::fleet_records::{fleet_records, WorkloadArgs};
use prefixlog_node::{NodeOptions, ReplicaNode};
use prefixlog_proto::v1::{
    echo_client::EchoClient, match_request::Prompt, prefix_index_client::PrefixIndexClient, EchoMessage,
    MatchRequest,
};
use prefixlog_query::tonic::transport::{Channel, Endpoint};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Match + Echo pairs in the idle phase.
    #[arg(long, env = "PREFIXLOG_BENCH_IDLE_QUERIES", default_value_t = 20_000)]
    pub idle_queries: usize,
    /// Catch-ups in the ingesting phase, each by a fresh replica; their calls are pooled (one
    /// catch-up gives ~1,100–1,700 calls, too few for a steady p99).
    #[arg(long, env = "PREFIXLOG_BENCH_CATCH_UPS", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub catch_ups: u32,
    /// Ask for the k best workers only (default: every worker holding a prefix).
    #[arg(long, env = "PREFIXLOG_BENCH_TOP_K")]
    pub top_k: Option<u32>,
    /// Experiment: renice the replicas' ingest and librdkafka threads by this much (Linux),
    /// so that query threads win the CPU when both are runnable.
    #[arg(long, env = "PREFIXLOG_BENCH_INGEST_NICE")]
    pub ingest_nice: Option<i32>,
    /// Pin the replicas' ingest threads and their consumers' threads to these CPUs
    /// (`serve --ingest-cpus`), leaving the others to the query path.
    #[arg(long, env = "PREFIXLOG_BENCH_INGEST_CPUS")]
    pub ingest_cpus: Option<prefixlog_ingest::CpuSet>,
    /// Pin the rest of the process (the replicas' query servers, the client) to these CPUs
    /// before its runtime starts (`serve --query-cpus`).
    #[arg(long, env = "PREFIXLOG_BENCH_QUERY_CPUS")]
    pub query_cpus: Option<prefixlog_ingest::CpuSet>,
    /// The replicas keep two copies of every keyspace (`serve --query-copy`): queries never
    /// wait on the writer.
    #[arg(long, env = "PREFIXLOG_BENCH_QUERY_COPY")]
    pub query_copy: bool,
    /// Also measure the idle replica's CPU per query on `MatchStream` (one stream, the client's
    /// multiplexer) beside unary `Match`, with this many queries in flight (`--idle-queries`
    /// of each).
    #[arg(long, env = "PREFIXLOG_BENCH_IN_FLIGHT")]
    pub in_flight: Option<usize>,
    /// Streams the `--in-flight` queries are spread over (the replica works on one stream's
    /// queries on one task: one core).
    #[arg(long, env = "PREFIXLOG_BENCH_STREAMS", default_value_t = 1)]
    pub streams: usize,
}

/// Renices this process's threads whose name starts with one of `prefixes` (Linux `renice`
/// on thread ids).
fn renice_threads(prefixes: &[&str], by: i32) -> usize {
    let mut n = 0;
    for t in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if prefixes.iter().any(|p| comm.starts_with(p)) {
            let tid = t.file_name().to_string_lossy().to_string();
            let ok = std::process::Command::new("renice")
                .args(["-n", &by.to_string(), "-p", &tid])
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            n += usize::from(ok);
        }
    }
    n
}

struct Lat {
    name: &'static str,
    v: Vec<Duration>,
}

impl Lat {
    /// The q-quantile in µs (`v` is sorted when measuring ends).
    fn pct(&self, q: f64) -> f64 {
        prefixlog_workload::quantile::quantile_us(&self.v, q)
    }
}

/// One catch-up of the ingesting phase.
struct CatchUp {
    secs: f64,
    match_p99_us: f64,
    /// See [`read_lock_waits`].
    lock_waits: Option<(u64, u64, f64)>,
}

/// `a.catch_ups` fresh replicas, one after another, each answering the alternating loop from
/// its first applied record until it has applied all `n` records; the calls of all of them
/// pooled (Match, Echo), and each catch-up on its own.
async fn ingesting_phase(
    env: &BenchLog,
    a: &Args,
    client: &ClientThread,
    queries: &Arc<[MatchRequest]>,
    n: u64,
) -> anyhow::Result<(Lat, Lat, Vec<CatchUp>)> {
    let (mut matches, mut echoes) = (Lat { name: "Match", v: vec![] }, Lat { name: "Echo", v: vec![] });
    let mut catch_ups = Vec::new();
    for _ in 0..a.catch_ups {
        let r = replica(env, a).await?;
        if let Some(by) = a.ingest_nice {
            let n = renice_threads(&["prefixlog-inges", "prefixlog-water", "rdk:"], by);
            println!("reniced {n} ingest/librdkafka threads by {by}");
        }
        let ch = channel(&r).await?;
        // Until its first record is applied the keyspace does not exist there (NOT_FOUND).
        while r.engine().keyspace(&prefixlog::fleet_records::keyspace()).is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let st = r.status().clone();
        let caught_up = move || {
            st.records_applied.load(Ordering::Acquire) + st.records_skipped.load(Ordering::Acquire) >= n
        };
        let t = Instant::now();
        let (lm, le, _) = client.run(measure(ch, queries.clone(), usize::MAX, caught_up)).await??;
        let secs = t.elapsed().as_secs_f64();
        catch_ups.push(CatchUp {
            secs,
            match_p99_us: lm.pct(0.99),
            lock_waits: read_lock_waits(r.registry()),
        });
        r.kill().await;
        matches.v.extend(lm.v);
        echoes.v.extend(le.v);
    }
    matches.v.sort_unstable();
    echoes.v.sort_unstable();
    Ok((matches, echoes, catch_ups))
}

async fn replica(env: &BenchLog, a: &Args) -> anyhow::Result<ReplicaNode> {
    env.node(NodeOptions { ingest_cpus: a.ingest_cpus.clone(), query_copy: a.query_copy, ..bench_options() })
        .await
}

async fn channel(n: &ReplicaNode) -> anyhow::Result<Channel> {
    Ok(Endpoint::from_shared(n.endpoint())?.tcp_nodelay(true).connect().await?)
}

/// Alternates Match and Echo calls until `n` pairs are done or `stop()` says so.
async fn measure(
    ch: Channel,
    queries: Arc<[MatchRequest]>,
    n: usize,
    stop: impl Fn() -> bool + Send + 'static,
) -> anyhow::Result<(Lat, Lat, (usize, usize))> {
    let mut m = PrefixIndexClient::new(ch.clone());
    let mut e = EchoClient::new(ch);
    let (mut lm, mut le) = (Lat { name: "Match", v: vec![] }, Lat { name: "Echo", v: vec![] });
    let mut hits = 0;
    let mut scores = 0;
    for i in 0..n {
        if stop() {
            break;
        }
        let q = &queries[i % queries.len()];
        // Both requests are built before their timers start: the clock covers the RPC only.
        let (request, payload) = (q.clone(), vec![0u8; prost_len(q)]);
        let t = Instant::now();
        let r = m.r#match(request).await?;
        lm.v.push(t.elapsed());
        hits += usize::from(!r.get_ref().scores.is_empty());
        scores += r.get_ref().scores.len();
        let t = Instant::now();
        e.echo(EchoMessage { payload }).await?;
        le.v.push(t.elapsed());
    }
    lm.v.sort_unstable();
    le.v.sort_unstable();
    Ok((lm, le, (hits, scores)))
}

/// A read-lock wait counted as long by the report: a bucket bound of the histogram, well above
/// one 32-block write chunk (a few µs).
const LONG_WAIT_S: f64 = 128e-6;

/// `(calls, calls that waited over LONG_WAIT_S, total wait in s)` from a replica's read-lock
/// wait histogram.
fn read_lock_waits(r: &prometheus::Registry) -> Option<(u64, u64, f64)> {
    let f = r.gather().into_iter().find(|f| f.name() == "prefixlog_query_read_lock_wait_seconds")?;
    let h = f.get_metric().first()?.get_histogram();
    let within = h.get_bucket().iter().find(|b| (b.upper_bound() - LONG_WAIT_S).abs() < 1e-9)?;
    Some((h.get_sample_count(), h.get_sample_count() - within.cumulative_count(), h.get_sample_sum()))
}

/// The encoded size of a Match request: the Echo payload size, so both RPCs move the same bytes
/// (EchoMessage adds a tag and a length varint: a few bytes).
fn prost_len(q: &MatchRequest) -> usize {
    prefixlog_query::prost::Message::encoded_len(q)
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    let client = ClientThread::start()?;
    let env = BenchLog::start(&a.log, "prefixlog.bench-query").await?;
    let records = fleet_records(&a.workload, 1)?;
    let blocks: usize = records.iter().map(|r| r.blocks).sum();
    let queries = crate::bench_env::workload_queries(&a.workload, a.top_k)?;
    let n = prefixlog::publish_trace::publish_all(&env.publisher, &records).await?;
    env.publisher.flush(Duration::from_secs(60))?;
    let avg_blocks = queries.iter().map(prompt_blocks).sum::<usize>() as f64 / queries.len() as f64;
    println!(
        "workload: {n} records, {blocks} blocks, {} partitions; {} distinct queries, {avg_blocks:.0} blocks each on average",
        a.log.partitions,
        queries.len()
    );

    // Idle: caught up, nothing to apply.
    let r1 = replica(&env, &a).await?;
    while r1.status().records_applied.load(Ordering::Acquire)
        + r1.status().records_skipped.load(Ordering::Acquire)
        < n as u64
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let engine = r1.engine();
    let ch = channel(&r1).await?;
    client.run(measure(ch.clone(), queries.clone(), 2_000, || false)).await??; // warm-up
    let (im, ie, (hits, scores)) =
        client.run(measure(ch, queries.clone(), a.idle_queries, || false)).await??;
    let hb = engine.holder_blocks();
    let stream_costs = match a.in_flight {
        Some(k) => Some(
            crate::stream_bench::compare(
                &client,
                r1.endpoint(),
                queries.clone(),
                (k, a.streams),
                a.idle_queries,
            )
            .await?,
        ),
        None => None,
    };

    // Ingesting: fresh replicas catching up from offset 0 while they answer.
    let (lm, le, catch_ups) = ingesting_phase(&env, &a, &client, &queries, n as u64).await?;
    r1.kill().await;

    println!(
        "idle: {hits}/{} Match answers had scores, {:.0} workers per answer (top-k {:?}); {hb} resident holder-blocks",
        im.v.len(),
        scores as f64 / im.v.len().max(1) as f64,
        a.top_k
    );
    let i99 = im.pct(0.99);
    for (k, c) in catch_ups.iter().enumerate() {
        print!(
            "ingesting, catch-up {}: {:.2} s to apply {n} records ({:.2} M blocks/s); its Match p99 / idle p99 {:.2}×",
            k + 1,
            c.secs,
            blocks as f64 / c.secs / 1e6,
            c.match_p99_us / i99
        );
        match c.lock_waits {
            Some((count, over, sum)) => println!(
                "; {over} of {count} Match calls waited over {} µs for the keyspace's read lock, {:.1} ms in all",
                LONG_WAIT_S * 1e6,
                sum * 1e3
            ),
            None => println!(),
        }
    }
    println!(
        "(read-lock waits: prefixlog_query_read_lock_wait_seconds; the table pools the catch-ups' calls)\n"
    );
    println!("| RPC | replica | calls | p50 µs | p99 µs | p99.9 µs |");
    println!("|---|---|---:|---:|---:|---:|");
    for (cond, l) in [("idle", &im), ("idle", &ie), ("ingesting", &lm), ("ingesting", &le)] {
        println!(
            "| {} | {cond} | {} | {:.1} | {:.1} | {:.1} |",
            l.name,
            l.v.len(),
            l.pct(0.5),
            l.pct(0.99),
            l.pct(0.999)
        );
    }
    let (m50, e50, l99) = (im.pct(0.5), ie.pct(0.5), lm.pct(0.99));
    println!("\n| target | measured | target | met |");
    println!("|---|---:|---:|---|");
    println!("| idle Match p50 / idle Echo p50 | {:.2}× | ≤ 1.3× | {} |", m50 / e50, yes(m50 / e50 <= 1.3));
    println!(
        "| ingesting Match p99 / idle Match p99 | {:.2}× | ≤ 1.5× | {} |",
        l99 / i99,
        yes(l99 / i99 <= 1.5)
    );
    if let (Some(costs), Some(k)) = (&stream_costs, a.in_flight) {
        crate::stream_bench::print(costs, (k, a.streams));
    }
    env.finish().await;
    Ok(())
}

fn prompt_blocks(q: &MatchRequest) -> usize {
    match &q.prompt {
        Some(Prompt::Hashes(h)) => h.local.len(),
        _ => 0,
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "**no**"
    }
}
