//! `prefixlog-lab demo`: the whole system in one process, with zero setup.
//!
//! The embedded broker, two replicas (each: ingest, gRPC query server, peer service, and
//! anti-entropy against the other), and a simulated fleet driven by the Mooncake trace:
//! `--workers` workers with LRU block caches publish their KV events through the real
//! `Publisher` (one ordered queue per worker), and `--gateways` gateways take the requests in
//! turn: each asks a replica over gRPC (`IndexClient`, fail open), routes by matched depth
//! minus a load cost ([`policy::Load::choose`]), lets the worker serve it, and publishes a placement carrying
//! the answer's offsets.
//!
//! Scored per request, in blocks: the hit the shared index's choice got, the oracle (the most
//! any worker held at that moment), and the gateway-local policy: every gateway also keeps its
//! own prefix tree fed only with its own decisions, and routes a shadow fleet (same workers,
//! same requests, no Kafka) by it — what the fleet would get if gateways only had local trees.
//!
//! After the run (`prefixlog.v1` gateways), `audit loss` judges the placements in the log and
//! is compared with the live oracle, decision by decision ([`audit_loss`]).
//!
//! `--gateway-protocol smg`: the replicas host SMG's `radix_index.RadixIndex` facade, and the
//! fleet speaks it instead of `prefixlog.v1` ([`smg`]): workers publish their KV events and
//! gateways ask and place through it, scored the same way.
//!
//! `--faults`: a fault schedule ([`faults`]) runs while the request stream ([`replay`]) goes on,
//! and a table per window ends the run.

mod audit_loss;
mod cluster;
mod faults;
mod offload;
pub mod policy;
mod policy_feeds;
mod replay;
mod report;
pub mod routing_sim;
pub(crate) mod smg;

use indicatif::{ProgressBar, ProgressStyle};
use offload::HostTier;
use parking_lot::Mutex;
use policy::{Load, LocalTree};
use policy_feeds::{Judged, Policy};
use prefixlog::fleet_records::keyspace;
use prefixlog_client::tonic::Code;
use prefixlog_client::{IndexClient, MatchOutcome, MatchQuery, Prompt, Unavailable};
use prefixlog_ingest::Publisher;
use prefixlog_state::record::encode_kv_events;
use prefixlog_state::{KvOp, NextOffset, Tier};
use prefixlog_workload::{expand_request, load_trace, Fleet, TraceRequest};
use report::{Answered, Outcome};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Mooncake-format JSONL trace.
    #[arg(long, env = "PREFIXLOG_TRACE", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/mooncake/conversation_trace.jsonl"))]
    pub trace: std::path::PathBuf,
    /// Replay only the first N requests of the trace (0: all of it).
    #[arg(long, env = "PREFIXLOG_DEMO_REQUESTS", default_value_t = 3000)]
    pub requests: usize,
    /// Simulated inference workers.
    #[arg(long, env = "PREFIXLOG_DEMO_WORKERS", default_value_t = 16)]
    pub workers: usize,
    /// Simulated gateways (requests are dealt to them in turn).
    #[arg(long, env = "PREFIXLOG_DEMO_GATEWAYS", default_value_t = 4)]
    pub gateways: usize,
    /// Trace time runs this many times faster than real time.
    #[arg(long, env = "PREFIXLOG_DEMO_SPEEDUP", default_value_t = 20.0)]
    pub speedup: f64,
    /// LRU capacity of each worker, in blocks.
    #[arg(long, env = "PREFIXLOG_DEMO_CAPACITY", default_value_t = 16384)]
    pub capacity: usize,
    /// Host-memory blocks per worker: evicted GPU blocks are offloaded there (published on the
    /// `host` tier), gateways weigh a host hit at 0.6 of a GPU hit, and the table gives hit
    /// ratios by tier. 0: no host tier.
    #[arg(long, env = "PREFIXLOG_DEMO_HOST_CAPACITY", default_value_t = 0)]
    pub host_capacity: usize,
    /// What a host hit is worth next to a GPU hit (0..=1): the gateways' tier weight, and the
    /// weight the table's hit ratios use.
    #[arg(long, env = "PREFIXLOG_DEMO_HOST_WEIGHT", default_value_t = 0.6)]
    pub host_weight: f64,
    /// Blocks per trace id (a 512-token id at block size 64 is 8).
    #[arg(long, env = "PREFIXLOG_DEMO_STRETCH", default_value_t = 8)]
    pub stretch: usize,
    /// Log partitions (the embedded broker keeps at most 100k records / 5 MiB per partition).
    #[arg(long, env = "PREFIXLOG_DEMO_PARTITIONS", default_value_t = 64)]
    pub partitions: u32,
    /// Gateway query deadline; past it the gateway routes without the index (fail open).
    #[arg(long, env = "PREFIXLOG_DEMO_DEADLINE", default_value = "20ms", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
    /// Anti-entropy round interval.
    #[arg(long, env = "PREFIXLOG_DEMO_ANTI_ENTROPY_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub anti_entropy_interval: Duration,
    /// The protocol the fleet speaks to the replicas: `prefixlog` (`prefixlog.v1` queries,
    /// records published to the log directly) or `smg` (SMG's `radix_index.RadixIndex` on the
    /// replicas' query ports, docs/compat/smg.md: workers publish their KV events and gateways
    /// ask and place through it, as SMG's bridge and gateway would).
    #[arg(long, env = "PREFIXLOG_DEMO_GATEWAY_PROTOCOL", value_enum, default_value_t = GatewayProtocol::Prefixlog)]
    pub gateway_protocol: GatewayProtocol,
    /// Replicas (`--faults` needs at least 2).
    #[arg(long, env = "PREFIXLOG_DEMO_REPLICAS", default_value_t = 2)]
    pub replicas: usize,
    /// Run a fault schedule while the traffic goes on (the trace replays in a loop until it is
    /// over) and count what the gateways saw per window ([`faults`]); none by default.
    #[arg(long, value_enum)]
    pub faults: Option<faults::FaultSet>,
    /// `--faults`: length of the calm baseline window before the first fault.
    #[arg(long, default_value = "8s", value_parser = humantime::parse_duration)]
    pub fault_baseline: Duration,
    /// `--faults`: traffic after every replica is ready again, still counted in the fault's window.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub fault_settle: Duration,
    /// `--faults broker|all`: how long the leaders' broker stays stopped (of three).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub fault_broker_down: Duration,
    /// `--faults broker|all`: how long after the stop the other brokers elect a new leader (a
    /// clean Kafka shutdown moves leadership before it stops; a crash waits out the
    /// controller's broker session timeout, 9 s by default in KRaft).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub fault_election: Duration,
    /// Where to write the hit-ratio plot (SVG).
    #[arg(long, env = "PREFIXLOG_DEMO_PLOT", default_value = "demo-hit-ratio.svg")]
    pub plot: std::path::PathBuf,
}

/// What the demo's gateways and workers speak to the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GatewayProtocol {
    Prefixlog,
    Smg,
}

impl GatewayProtocol {
    fn name(self) -> &'static str {
        match self {
            GatewayProtocol::Prefixlog => "prefixlog.v1",
            GatewayProtocol::Smg => "SMG radix_index",
        }
    }
}

/// The fleet as it really is (routed by the shared index) and the shadow fleet routed by
/// gateway-local trees, plus each worker's ordered publish queue.
struct World {
    fleet: Fleet,
    host: HostTier,
    load: Load,
    shadow: Fleet,
    shadow_host: HostTier,
    shadow_load: Load,
    seq: Vec<u64>,
    /// Each worker's KV events, `(seq, op)` in order.
    queues: Vec<mpsc::UnboundedSender<(u64, KvOp)>>,
    /// The round-robin policy's fleet, and the shadow fleets' event queues ([`policy_feeds`]).
    rr: policy_feeds::RoundRobin,
    feeds: Option<policy_feeds::Feeds>,
}

/// What every gateway shares: the world, results, published offsets.
struct Shared {
    world: Mutex<World>,
    results: Mutex<Vec<Option<Outcome>>>,
    landed: Mutex<BTreeMap<u32, i64>>,
    published: AtomicU64,
    stretch: usize,
    capacity: usize,
    /// Workers offload to a host tier, and gateways weigh it.
    host_tier: bool,
    /// A host block's weight, per mille.
    host_weight: u32,
    /// The fault window now (`--faults`), and whether gateways ask with their own token.
    clock: Arc<faults::Clock>,
    read_your_writes: bool,
}

impl Shared {
    /// Keeps, per partition, the token (next offset) covering every record landed so far.
    fn landed(&self, l: prefixlog_state::Landed) {
        self.published.fetch_add(1, Ordering::Relaxed);
        let NextOffset { partition: p, offset: next } = l.token();
        let mut m = self.landed.lock();
        let e = m.entry(p).or_insert(next);
        *e = (*e).max(next);
    }
}

async fn worker_publisher(
    w: u64,
    mut rx: mpsc::UnboundedReceiver<(u64, KvOp)>,
    p: Publisher,
    s: Arc<Shared>,
) {
    let ks = keyspace();
    while let Some((seq, op)) = rx.recv().await {
        let v = encode_kv_events(&ks, w, 0, 1, seq, false, &[op]);
        match p.publish_raw(w, &v, None).await {
            Ok(l) => s.landed(l),
            Err(e) => tracing::warn!(worker = w, error = %e, "worker could not publish its KV events"),
        }
    }
}

/// How a gateway reaches the index.
enum Index {
    /// `prefixlog.v1` queries; placements go to Kafka through the publisher (the name marks
    /// the records).
    Native { client: IndexClient, publisher: Publisher, name: String },
    /// SMG's protocol through the replicas' facade.
    Smg { gateway: smg::SmgGateway, deadline: Duration },
}

impl Index {
    /// The answer as `(worker, depth)`, the offsets it reflects, and whether it was stale (behind
    /// `token`, the gateway's own read-your-writes token, or flagged so). With `tiers` (the host
    /// weight), the depth is the tier-weighted one, in blocks.
    async fn ask(
        &self,
        locals: &[u64],
        tiers: Option<u32>,
        token: &[NextOffset],
    ) -> (Answered, Vec<(u32, u32)>, Vec<NextOffset>, bool) {
        match self {
            Index::Native { client, .. } => {
                let mut q = MatchQuery::new(keyspace(), Prompt::Hashes(locals.to_vec())).at_least(token);
                if let Some(host_weight) = tiers {
                    q = q.weigh(Tier::Gpu, offload::GPU_WEIGHT).weigh(Tier::Host, host_weight);
                }
                let behind = |a: &prefixlog_client::Answer| {
                    a.stale
                        || token.iter().any(|t| {
                            a.applied.iter().any(|a| a.partition == t.partition && a.offset < t.offset)
                        })
                };
                match client.match_prompt(&q).await {
                    MatchOutcome::Scores(a) => {
                        let d = a
                            .scores
                            .iter()
                            .map(|x| {
                                let weighted = ((x.weighted_score + 500) / 1000) as u32;
                                (x.worker as u32, if tiers.is_some() { weighted } else { x.depth })
                            })
                            .collect();
                        let stale = behind(&a);
                        (Answered::Scores, d, a.applied, stale)
                    }
                    MatchOutcome::Empty(a) => {
                        let stale = behind(&a);
                        (Answered::Empty, vec![], a.applied, stale)
                    }
                    // Until a worker's first KV event creates the demo's keyspace, the replica
                    // answers NOT_FOUND: an answer in time that no worker holds anything yet
                    // (the demo's keyspace is right by construction), not a blind decision.
                    MatchOutcome::Unavailable(Unavailable::Rejected { code: Code::NotFound, .. }) => {
                        (Answered::Empty, vec![], vec![], false)
                    }
                    MatchOutcome::Unavailable(why) => {
                        tracing::debug!(?why, ?token, "blind decision: no index answer in time");
                        (Answered::Unavailable, vec![], vec![], false)
                    }
                }
            }
            Index::Smg { gateway, deadline } => match gateway.query(locals, *deadline).await {
                Some(d) if d.is_empty() => (Answered::Empty, d, vec![], false),
                Some(d) => (Answered::Scores, d, vec![], false),
                None => (Answered::Unavailable, vec![], vec![], false),
            },
        }
    }

    /// Publishes the placement; returns its token (partition, next offset) when it landed.
    async fn place(
        &self,
        chosen: u32,
        locals: &[u64],
        applied: &[NextOffset],
        s: &Shared,
    ) -> Option<NextOffset> {
        match self {
            Index::Native { publisher, name, .. } => {
                let id = u64::from(chosen);
                policy_feeds::place(publisher, Policy::SharedIndex, name, id, locals, applied, s).await
            }
            Index::Smg { gateway, .. } => {
                gateway.place(chosen, locals);
                None
            }
        }
    }
}

async fn gateway(
    mut rx: mpsc::UnboundedReceiver<(usize, TraceRequest)>,
    index: Index,
    s: Arc<Shared>,
    bar: ProgressBar,
) {
    let mut tree = LocalTree::new(s.capacity);
    // Read-your-writes (`--faults`): per partition, the next offset past this gateway's own
    // placements; an answer below it is stale.
    let mut own: BTreeMap<u32, i64> = BTreeMap::new();
    while let Some((i, req)) = rx.recv().await {
        let mut chain = expand_request(&req, 0, s.stretch);
        chain.truncate(s.capacity);
        let locals: Vec<u64> = chain.iter().map(|b| b.local).collect();
        let token: Vec<NextOffset> = own.iter().map(|(&p, &o)| NextOffset::new(p, o)).collect();
        let window = s.clock.window();
        let t = Instant::now();
        let (answered, depths, applied, stale) =
            index.ask(&locals, s.host_tier.then_some(s.host_weight), &token).await;
        let query_us = t.elapsed().as_micros() as u64;
        let local_depths = tree.depths(&locals);
        let (chosen, hit, oracle, local_choice, local, judged, shadow) = {
            let w = &mut *s.world.lock();
            let chosen = w.load.choose(&depths);
            let shared_judged = Judged::of(&w.fleet, &w.host, chosen, &chain);
            let hit = w.host.hit(&w.fleet, chosen, &chain);
            let oracle = (0..w.fleet.len() as u32)
                .map(|x| w.host.hit(&w.fleet, x, &chain))
                .max_by_key(|h| h.weighted(s.host_weight))
                .unwrap_or_default();
            w.load.routed(chosen);
            for op in w.host.serve(&mut w.fleet, chosen, &chain) {
                let worker = chosen as usize;
                w.seq[worker] += 1;
                let _ = w.queues[worker].send((w.seq[worker], op));
            }
            let lc = w.shadow_load.choose(&local_depths);
            let local = w.shadow_host.hit(&w.shadow, lc, &chain);
            let local_judged = Judged::of(&w.shadow, &w.shadow_host, lc, &chain);
            w.shadow_load.routed(lc);
            let local_ops = w.shadow_host.serve(&mut w.shadow, lc, &chain);
            let (rr_judged, rr_ops) = w.rr.route(i, &chain);
            let shadow = w.feeds.as_mut().map(|f| f.route(&s, (lc, local_ops), (rr_judged.chosen, rr_ops)));
            (chosen, hit, oracle, lc, local, [shared_judged, local_judged, rr_judged], shadow)
        };
        tree.routed(local_choice, &locals, req.timestamp_ms + 1);
        if let Some(NextOffset { partition: p, offset: next }) =
            index.place(chosen, &locals, &applied, &s).await
        {
            if s.read_your_writes {
                let e = own.entry(p).or_insert(next);
                *e = (*e).max(next);
            }
        }
        if let (Index::Native { publisher, name, .. }, Some(shadow)) = (&index, &shadow) {
            for &(policy, id) in &shadow.placements {
                policy_feeds::place(publisher, policy, name, id, &locals, &shadow.token, &s).await;
            }
        }
        let o = Outcome {
            blocks: chain.len() as u32,
            hit,
            oracle,
            local,
            query_us,
            answered,
            host_weight: s.host_weight,
            prompt_tail: locals.last().copied().unwrap_or(0),
            window,
            stale,
            answer_chosen: depths.iter().find(|d| d.0 == chosen).map_or(0, |d| d.1),
            answer_best: depths.iter().map(|d| d.1).max().unwrap_or(0),
            judged,
        };
        let mut results = s.results.lock();
        if results.len() <= i {
            results.resize(i + 1, None);
        }
        results[i] = Some(o);
        drop(results);
        bar.inc(1);
    }
}

/// A gateway takes traffic once its connections to every replica are open and each replica
/// answered SERVING: otherwise its first queries would spend their 20 ms deadline on a TCP and
/// HTTP/2 handshake, or on a replica still catching up, and be counted as fail open.
async fn warm_up(client: &IndexClient, replicas: usize) -> anyhow::Result<()> {
    let t = Instant::now();
    while client.warm_up(Duration::from_secs(2)).await < replicas {
        anyhow::ensure!(t.elapsed() < Duration::from_secs(60), "replicas not serving after 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub async fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.workers > 0 && a.gateways > 0, "--workers and --gateways must be at least 1");
    anyhow::ensure!(a.speedup > 0.0, "--speedup must be positive");
    anyhow::ensure!((0.0..=1.0).contains(&a.host_weight), "--host-weight must be within 0..=1");
    let mut trace = load_trace(&a.trace)?;
    if a.requests > 0 {
        trace.truncate(a.requests);
    }
    let n = trace.len();
    anyhow::ensure!(n > 0, "the trace has no request");
    println!(
        "prefixlog-lab demo: {n} requests of {}, {} workers ({}-block LRU), {} gateways ({}), {} replicas, {} partitions, speed-up {}×{}",
        a.trace.display(),
        a.workers,
        a.capacity,
        a.gateways,
        a.gateway_protocol.name(),
        a.replicas,
        a.partitions,
        a.speedup,
        a.faults.map_or(String::new(), |f| format!(", faults: {f:?} (the trace replays in a loop)"))
    );
    let over_smg = a.gateway_protocol == GatewayProtocol::Smg;
    anyhow::ensure!(
        !(over_smg && a.host_capacity > 0),
        "--host-capacity needs --gateway-protocol prefixlog (SMG's protocol has no tiers)"
    );
    anyhow::ensure!(a.replicas >= 1, "--replicas must be at least 1");
    anyhow::ensure!(
        a.faults.is_none() || (a.replicas >= 2 && !over_smg),
        "--faults needs --replicas 2 or more and --gateway-protocol prefixlog"
    );
    // Fixed ports and a data dir per replica, so they can stop and restart.
    let data_root = a.faults.map(|_| tempfile::tempdir()).transpose()?;
    let cluster = cluster::Cluster::start(
        a.partitions,
        a.replicas,
        a.anti_entropy_interval,
        over_smg,
        data_root.as_ref().map(|d| d.path().to_path_buf()),
        a.faults.map_or(1, faults::FaultSet::brokers),
    )
    .await?;
    if over_smg {
        for e in cluster.endpoints() {
            tokio::time::timeout(Duration::from_secs(60), smg::wait_serving(&e)).await??;
        }
    }
    let counters = Arc::new(smg::Counters::default());
    let publisher = Publisher::new(&cluster.spec)?;
    let (queues, receivers): (Vec<_>, Vec<_>) = (0..a.workers).map(|_| mpsc::unbounded_channel()).unzip();
    let s = Arc::new(Shared {
        world: Mutex::new(World {
            fleet: Fleet::new(a.workers, a.capacity),
            host: HostTier::new(a.workers, a.host_capacity),
            load: Load::new(a.workers),
            shadow: Fleet::new(a.workers, a.capacity),
            shadow_host: HostTier::new(a.workers, a.host_capacity),
            shadow_load: Load::new(a.workers),
            seq: vec![0; a.workers],
            queues,
            rr: policy_feeds::RoundRobin::new(a.workers, a.capacity, a.host_capacity),
            feeds: None,
        }),
        results: Mutex::new(vec![None; n]),
        landed: Mutex::default(),
        published: AtomicU64::new(0),
        stretch: a.stretch,
        capacity: a.capacity,
        host_tier: a.host_capacity > 0,
        host_weight: (a.host_weight * 1000.0).round() as u32,
        clock: Arc::default(),
        read_your_writes: a.faults.is_some(),
    });
    if !over_smg {
        s.world.lock().feeds = Some(policy_feeds::Feeds::start(a.workers, a.partitions, &publisher, &s));
    }
    let endpoints = cluster.endpoints();
    let mut workers = Vec::new();
    for (w, rx) in receivers.into_iter().enumerate() {
        workers.push(if over_smg {
            // Each worker's bridge writes to one facade (its holder state lives there).
            let feed =
                smg::worker_feed(w as u32, rx, endpoints[w % endpoints.len()].clone(), counters.clone());
            tokio::spawn(async move {
                if let Err(e) = feed.await {
                    tracing::warn!(worker = w, error = %e, "worker could not publish over SMG");
                }
            })
        } else {
            tokio::spawn(worker_publisher(w as u64, rx, publisher.clone(), s.clone()))
        });
    }

    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} requests  {msg}")?
            .progress_chars("=> "),
    );
    let mut senders = Vec::new();
    let mut gateways = Vec::new();
    for g in 0..a.gateways {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        let index = if over_smg {
            let gateway = smg::SmgGateway::connect(&endpoints[g % endpoints.len()], counters.clone()).await?;
            Index::Smg { gateway, deadline: a.deadline }
        } else {
            let client = IndexClient::new(cluster.endpoints(), a.deadline)?;
            warm_up(&client, cluster.endpoints().len()).await?;
            Index::Native { client, publisher: publisher.clone(), name: format!("demo-gateway-{g}") }
        };
        gateways.push(tokio::spawn(gateway(rx, index, s.clone(), bar.clone())));
    }
    let ticker = {
        let (s, bar) = (s.clone(), bar.clone());
        let status: Vec<_> = cluster.nodes.iter().map(|n| n.status().clone()).collect();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let done: Vec<Outcome> = s.results.lock().iter().flatten().copied().collect();
                let r = report::ratios(&done);
                let lag: Vec<String> = status.iter().map(|st| st.lag().to_string()).collect();
                bar.set_message(format!(
                    "hit ratio: shared {:.3} · oracle {:.3} · local {:.3}  replica lag {}",
                    r.shared,
                    r.oracle,
                    r.local,
                    lag.join("/")
                ));
            }
        })
    };

    let schedule = a.faults.map(|f| faults::Schedule {
        faults: f.faults(),
        baseline: a.fault_baseline,
        settle: a.fault_settle,
        broker_down: a.fault_broker_down,
        election: a.fault_election,
    });
    let start = Instant::now();
    // In this task, not spawned: the embedded broker the cluster owns is not `Send`.
    let (driven, ()) = tokio::join!(
        faults::drive(cluster, schedule, s.clock.clone()),
        replay::replay(&trace, &senders, a.speedup, a.faults.is_some().then_some(&*s.clock), &bar)
    );
    let (cluster, windows) = driven?;
    drop(senders);
    for g in gateways {
        g.await?;
    }
    s.world.lock().queues.clear();
    for w in workers {
        w.await?;
    }
    let feeds = s.world.lock().feeds.take();
    if let Some(f) = feeds {
        f.close().await?;
    }
    publisher.flush(Duration::from_secs(60))?;
    let mut caught_up = true;
    if over_smg {
        // The facades' records carry no offsets back (acks have none): once every update is
        // acked, a tick per partition lands behind all of them and is the token to wait for.
        caught_up &= counters.all_acked(Duration::from_secs(60)).await;
        s.published.store(counters.acked.load(Ordering::Relaxed), Ordering::Relaxed);
        let all: Vec<u32> = (0..a.partitions).collect();
        for l in publisher.publish_ticks(&all, None).await? {
            let next = l.token();
            s.landed.lock().insert(next.partition, next.offset);
        }
    }
    let token: Vec<NextOffset> = s.landed.lock().iter().map(|(&p, &o)| NextOffset::new(p, o)).collect();
    caught_up &= cluster.wait_caught_up(&token, Duration::from_secs(60)).await;
    let seconds = start.elapsed().as_secs_f64();
    ticker.abort();
    bar.finish_and_clear();
    cluster.anti_entropy_round().await;

    let outcomes: Vec<Outcome> = s.results.lock().iter().flatten().copied().collect();
    let nodes = &cluster.nodes;
    let summary = report::Summary {
        workers: a.workers,
        gateways: a.gateways,
        seconds,
        records_published: s.published.load(Ordering::Relaxed),
        over_smg,
        records_applied: nodes.iter().map(|n| n.status().records_applied.load(Ordering::Relaxed)).collect(),
        points_compared: nodes
            .iter()
            .filter_map(|n| n.anti_entropy())
            .map(|ae| ae.stats.points_compared.get())
            .sum(),
        mismatches: nodes.iter().filter_map(|n| n.anti_entropy()).map(|ae| ae.stats.mismatches_total()).sum(),
        rounds: nodes.iter().filter_map(|n| n.anti_entropy()).map(|ae| ae.stats.rounds.get()).sum(),
        digests_equal: nodes.windows(2).all(|w| w[0].engine().digest() == w[1].engine().digest()),
        caught_up,
    };
    println!("\n{}", report::table(&outcomes, &summary));
    if !over_smg {
        let spec = cluster.spec.clone();
        let (o, partitions, workers) = (outcomes.clone(), a.partitions, a.workers);
        let cmp = tokio::task::spawn_blocking(move || audit_loss::compare(&spec, partitions, workers, &o))
            .await??;
        println!("{}", cmp.line());
        let loss_plot = audit_loss::plot_path(&a.plot);
        std::fs::write(&loss_plot, &cmp.svg)?;
        println!("lost prefill tokens over time written to {}", loss_plot.display());
    }
    std::fs::write(&a.plot, report::svg(&outcomes))?;
    println!("hit ratio over time written to {}", a.plot.display());
    // The windows' table ends the run, its summary line last (for people and scripts).
    if a.faults.is_some() {
        println!("\n{}", faults::report(&outcomes, &windows));
    }
    // Clients first (the gateways' and workers' publisher clones went with their tasks), then
    // the replicas, then the broker: nothing is left to retry against a stopped broker.
    drop(publisher);
    cluster.shutdown().await?;
    drop(data_root);
    Ok(())
}
