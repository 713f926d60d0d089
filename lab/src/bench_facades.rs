//! `prefixlog-lab bench-facades`: answer latency through the protocol facades a gateway would
//! use, while the replica ingests and once it has caught up (issue 51: SMG's gateway gives the
//! remote index 2 ms; the target is p99.9 ≤ 1 ms through the SMG facade, the SGLang facade and
//! gRPC `Match`).
//!
//! The fleet workload (`fleet_records`) is published three times into one log, once per
//! protocol's keyspace, each with workers of its own, record by record interleaved: prefixlog's
//! own `("trace", 64, scheme 1)` for gRPC, SMG's `("trace", TOKENS, 64, wire scheme 1)` (scheme
//! 2) and SGLang's page hashes (scheme 4, `serve --sgl-model trace --sgl-block-size 64`). A
//! replica, a separate `prefixlog serve` process with both facades on its query port
//! (checkpoints off), applies it from the start; from its first answer, three open loops run at
//! once, each offering `--rate` queries/s of the workload's prompts for `--seconds`:
//! - gRPC `Match` over `--streams` `MatchStream` streams (the client's multiplexer), `top_k` 8;
//! - SMG `Subscribe`, one query per prompt on `--streams` streams (matched by `query_id`);
//! - SGLang `MatchExternalKvPrefix` (what sgl-router routes on), unary calls. (Not
//!   `MatchExternalKv`, which lists every holder's hashes per tier: three matches with
//!   intervals and a row per worker, far heavier at thousands of workers, and not on the
//!   router's path.)
//!
//! Then the same once it has caught up, for `--caught-up-seconds`. Latency is from each query's
//! send (the client's timer lateness is apart, as in `bench-scale`). The workers have no SMG or
//! SGLang names (they were not written through the facades), so those facades match every
//! holder and then answer with none: their whole match is measured, their answers are short.
//! It ends with one line: `facades: while applying p99.9 grpc X us, smg X us, sglang X us;
//! caught up p99.9 grpc X us, smg X us, sglang X us`.

use crate::bench_env::{workload_queries, BenchLog};
use crate::bench_rounds::landed_token;
use crate::client_thread::ClientThread;
use crate::demo::smg::SmgSubscriber;
use crate::replica_process::{replica_bin, ReplicaProcess};
use crate::stream_bench::{drive_at, open_loop, OpenLoop, Until};
use prefixlog::fleet_records::{fleet_records_in, keyspace, FleetRecord, WorkloadArgs};
use prefixlog_engine::KeyspaceId;
use prefixlog_facades::sglang::pb::{kv_indexer_client::KvIndexerClient, MatchExternalKvPrefixRequest};
use prefixlog_proto::v1::{match_request::Prompt, MatchRequest};
use prefixlog_query::tonic::transport::Endpoint;
use prefixlog_workload::quantile::quantile_us;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub log: crate::bench_env::BenchLogArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Queries offered per second on each of the three paths.
    #[arg(long, default_value_t = 2_000.0)]
    pub rate: f64,
    /// Streams of the gRPC and SMG paths.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub streams: u64,
    /// Seconds offered while the replica applies (from when it first answers).
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
    /// Seconds offered once it has caught up.
    #[arg(long, default_value_t = 5)]
    pub caught_up_seconds: u64,
    /// How long the replica may take to apply the log, in seconds.
    #[arg(long, default_value_t = 600)]
    pub apply_limit_secs: u64,
    #[command(flatten)]
    pub replica: crate::replica_process::ReplicaArgs,
}

/// The three paths, in the order they are reported.
const PATHS: [&str; 3] = ["gRPC MatchStream", "SMG Subscribe", "SGLang MatchExternalKvPrefix"];

pub async fn run(a: Args) -> anyhow::Result<()> {
    let bin = replica_bin(a.replica.replica_bin.as_deref())?;
    let client = ClientThread::start()?;
    let env = BenchLog::start(&a.log, "prefixlog.bench-facades").await?;
    let queries = workload_queries(&a.workload, Some(8))?;
    let items = interleaved(&a.workload)?;
    let blocks: usize = items.iter().map(|r| r.blocks).sum();
    println!(
        "facades: {} workers per protocol, {} records, {blocks} blocks in 3 keyspaces; {} queries/s on each path; replica arguments {:?}",
        a.workload.effective_workers(),
        items.len(),
        a.rate,
        a.replica.replica_arg
    );
    let items = items.into_iter().enumerate().map(|(i, r)| (r.worker, 1_000 + i as i64, r.value)).collect();
    let landed = env.publish(items).await?;
    let data = tempfile::tempdir()?;
    let mut args: Vec<String> =
        ["--smg-radix-index", "--sgl-model", "trace", "--sgl-block-size", "64"].map(String::from).into();
    args.extend(
        ["--allow-unauthenticated-writes", "--checkpoint-interval=0s", "--checkpoint-records=0"]
            .map(String::from),
    );
    args.extend(a.replica.replica_arg.iter().cloned());
    let t = Instant::now();
    let mut replica = ReplicaProcess::start(&bin, &env, data.path(), &args)?;
    let limit = Duration::from_secs(a.apply_limit_secs);
    replica.wait_for(&[], &queries[0], limit).await?;
    let answering = t.elapsed().as_secs_f64();
    let ep = replica.endpoint.clone();
    let (streams, rate) = (a.streams as usize, a.rate);
    let three = |secs: u64| {
        three_loops(ep.clone(), queries.clone(), rate, streams, Until::Asked((rate * secs as f64) as usize))
    };
    let (applying, token) = (client.run(three(a.seconds)), landed_token(&landed));
    let (applying, applied_at) = tokio::join!(applying, replica.wait_applied(&token, limit));
    let applying = applying??;
    let apply_secs = (applied_at? - t).as_secs_f64();
    println!(
        "applied from the start in {apply_secs:.1} s (process start included), {:.2} M blocks/s; the open loops ran from {answering:.1} s for {} s",
        blocks as f64 / apply_secs / 1e6,
        a.seconds
    );
    if apply_secs < answering + a.seconds as f64 {
        println!(
            "note: the replica caught up before the loops \"while applying\" ended: use fewer --seconds"
        );
    }
    let caught_up = client.run(three(a.caught_up_seconds)).await??;
    drop(replica);
    env.finish().await;
    report(&applying, &caught_up)
}

/// The workload in each protocol's keyspace, workers of its own per keyspace, interleaved
/// record by record.
fn interleaved(w: &WorkloadArgs) -> anyhow::Result<Vec<FleetRecord>> {
    let per = w.effective_workers();
    let keyspaces = [
        keyspace(),
        KeyspaceId::new("trace", 64, prefixlog_facades::smg::keyspace::HASH_SCHEME_SMG_TOKENS),
        KeyspaceId::new("trace", 64, prefixlog_facades::sglang::HASH_SCHEME_SGLANG),
    ];
    let sets = keyspaces
        .iter()
        .enumerate()
        .map(|(k, ks)| fleet_records_in(w, 1, ks, k as u64 * per))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut out = Vec::with_capacity(sets.iter().map(Vec::len).sum());
    let mut iters: Vec<_> = sets.into_iter().map(Vec::into_iter).collect();
    'records: loop {
        for it in &mut iters {
            let Some(r) = it.next() else { break 'records };
            out.push(r);
        }
    }
    Ok(out)
}

/// The three open loops at once, on the client thread.
async fn three_loops(
    endpoint: String,
    queries: Arc<[MatchRequest]>,
    rate: f64,
    streams: usize,
    until: Until,
) -> anyhow::Result<[OpenLoop; 3]> {
    let locals: Arc<[Vec<u64>]> = queries
        .iter()
        .map(|q| match &q.prompt {
            Some(Prompt::Hashes(h)) => h.local.clone(),
            _ => Vec::new(),
        })
        .collect();
    let mut subscribers = Vec::new();
    for _ in 0..streams {
        subscribers.push(Arc::new(SmgSubscriber::connect(&endpoint).await?));
    }
    let ch = Endpoint::from_shared(endpoint.clone())?.tcp_nodelay(true).connect().await?;
    let sglang = KvIndexerClient::new(ch);
    let smg = {
        let locals = locals.clone();
        open_loop(rate, until.clone(), move |i, deadline| {
            let (s, q) = (subscribers[i % streams].clone(), locals[i % locals.len()].clone());
            Box::pin(async move {
                s.ask(&q, deadline.saturating_duration_since(tokio::time::Instant::now())).await.is_some()
            })
        })
    };
    let sgl = open_loop(rate, until.clone(), move |i, _| {
        let hashes = locals[i % locals.len()].iter().map(|&h| h as i64).collect();
        let mut c = sglang.clone();
        Box::pin(async move {
            c.match_external_kv_prefix(MatchExternalKvPrefixRequest { hashes, max_blocks: 0 }).await.is_ok()
        })
    });
    let grpc = drive_at(endpoint, queries, rate, until, streams);
    let (grpc, smg, sgl) = tokio::join!(grpc, smg, sgl);
    Ok([grpc?, smg?, sgl?])
}

/// The table and the summary line. Fails if any query failed once caught up (while applying,
/// the SGLang facade refuses with UNAVAILABLE as long as the replica is not ready, by design).
fn report(applying: &[OpenLoop; 3], caught_up: &[OpenLoop; 3]) -> anyhow::Result<()> {
    println!(
        "\n| phase | path | answered (failed or refused) | p50 / p99 / p99.9 from the send (µs) | sent late p99 (µs) |"
    );
    println!("|---|---|---:|---:|---:|");
    for (phase, loops) in [("while applying", applying), ("caught up", caught_up)] {
        for (path, l) in PATHS.iter().zip(loops) {
            let d = &l.driven;
            println!(
                "| {phase} | {path} | {} ({}) | {:.0} / {:.0} / {:.0} | {:.0} |",
                d.answered,
                d.failed,
                quantile_us(&d.latencies, 0.5),
                quantile_us(&d.latencies, 0.99),
                quantile_us(&d.latencies, 0.999),
                quantile_us(&l.late, 0.99)
            );
        }
    }
    let p999 = |l: &[OpenLoop; 3]| [0, 1, 2].map(|i| quantile_us(&l[i].driven.latencies, 0.999));
    let (a, c) = (p999(applying), p999(caught_up));
    println!(
        "facades: while applying p99.9 grpc {:.0} us, smg {:.0} us, sglang {:.0} us; caught up p99.9 grpc {:.0} us, smg {:.0} us, sglang {:.0} us",
        a[0], a[1], a[2], c[0], c[1], c[2]
    );
    let failed: usize = caught_up.iter().map(|l| l.driven.failed).sum();
    anyhow::ensure!(failed == 0, "{failed} queries failed once the replica had caught up");
    Ok(())
}
