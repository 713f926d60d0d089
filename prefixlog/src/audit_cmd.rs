//! `prefixlog audit`: what the index said at any past point, and why a gateway routed as it did.

use prefixlog::kafka_args::{KafkaArgs, SettingsArgs};
use prefixlog_audit::loss_follow::{follow, LossCounters};
use prefixlog_audit::loss_report::{json_lines, table};
use prefixlog_audit::queries::{answer, holder_blocks, worker_blocks, Query};
use prefixlog_audit::{judge_range, reconstruct, LossOptions, Point};
use prefixlog_engine::{HolderKey, KeyspaceId};
use prefixlog_ingest::reader::{LogReader, Read};
use prefixlog_ingest::{LogSpec, Shard};
use prefixlog_query::admin::{AdminPort, AlwaysReady};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::record::{decode, Op};
use prefixlog_state::NextOffset;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The partitions to audit (a sharded replica's store covers only its own).
    #[arg(long, env = "PREFIXLOG_SHARD", default_value = "all")]
    pub shard: Shard,
    /// The replica's --data-dir (its retained checkpoints; read beside the running replica).
    /// Without it the audit replays from the log start.
    #[arg(long, env = "PREFIXLOG_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Settings for a replay from the log start (with a checkpoint, the audit applies the
    /// settings that checkpoint was taken with). Last: its help heading applies to every
    /// argument after it.
    #[command(flatten)]
    pub settings: SettingsArgs,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Reconstruct the state at a point and answer queries / summarise / dump a holder.
    At {
        /// Log time: RFC 3339 (2026-11-30T10:42:07Z) or milliseconds since the epoch.
        #[arg(
            long,
            env = "PREFIXLOG_AUDIT_TIME",
            conflicts_with = "offsets",
            required_unless_present = "offsets"
        )]
        time: Option<String>,
        /// Next offsets per partition, as a query response reports them: `0:120,1:98,...`.
        #[arg(long, env = "PREFIXLOG_AUDIT_OFFSETS")]
        offsets: Option<String>,
        /// JSON file with an array of queries ({"keyspace":{..},"tokens":[..]} or "hashes").
        #[arg(long, env = "PREFIXLOG_AUDIT_QUERIES")]
        queries: Option<PathBuf>,
        /// Print blocks per keyspace and worker.
        #[arg(long, env = "PREFIXLOG_AUDIT_SUMMARY")]
        summary: bool,
        /// Dump one holder's blocks: `KEYSPACE_MODEL/BLOCK_SIZE/SCHEME@WORKER:DP:LANE`.
        #[arg(long, env = "PREFIXLOG_AUDIT_HOLDER")]
        holder: Option<String>,
    },
    /// For a placement record that carries the offsets the gateway routed on: every worker's
    /// score at exactly those offsets, next to the worker chosen.
    Explain {
        /// `partition:offset` of the placement record.
        #[arg(long, env = "PREFIXLOG_AUDIT_RECORD")]
        record: String,
    },
    /// Blocks gained and lost per keyspace and worker between two log times.
    Diff {
        #[arg(long, env = "PREFIXLOG_AUDIT_FROM")]
        from: String,
        #[arg(long, env = "PREFIXLOG_AUDIT_TO")]
        to: String,
        /// Optionally, queries to score at both points.
        #[arg(long, env = "PREFIXLOG_AUDIT_QUERIES")]
        queries: Option<PathBuf>,
    },
    /// Replay a range and check that every retained checkpoint in it is reproduced exactly.
    Verify {
        #[arg(long, env = "PREFIXLOG_AUDIT_FROM", default_value = "0")]
        from: String,
        #[arg(long, env = "PREFIXLOG_AUDIT_TO")]
        to: Option<String>,
    },
    /// Judge every placement in a range against the index at its answer token's offsets: what
    /// the chosen worker held, the best any worker held, per tier, and the blocks and tokens
    /// lost; aggregated by gateway, keyspace, policy, worker and time bucket.
    Loss {
        /// Start, as log time (RFC 3339 or ms; default: the log start).
        #[arg(long, env = "PREFIXLOG_AUDIT_FROM", conflicts_with = "from_offsets")]
        from: Option<String>,
        /// End, as log time (default: the log's end now).
        #[arg(long, env = "PREFIXLOG_AUDIT_TO", conflicts_with = "to_offsets")]
        to: Option<String>,
        /// Start as next offsets per partition: `0:120,1:98,...`.
        #[arg(long)]
        from_offsets: Option<String>,
        /// End as next offsets per partition (partitions not named: to their end).
        #[arg(long)]
        to_offsets: Option<String>,
        /// Width of a time bucket, in seconds of log time.
        #[arg(long, default_value_t = 60)]
        bucket_secs: u64,
        /// JSON lines (one per decision, one per aggregate row, a summary) instead of the table.
        #[arg(long, conflicts_with = "follow")]
        json: bool,
        /// Also write an SVG plot of lost prefill tokens per time bucket, one line per gateway.
        #[arg(long, conflicts_with = "follow")]
        svg: Option<std::path::PathBuf>,
        /// Run continuously: judge placements as they are appended and export the totals as
        /// Prometheus counters on --admin-addr (`/metrics`), until SIGTERM or Ctrl-C.
        #[arg(long, conflicts_with_all = ["to", "to_offsets"])]
        follow: bool,
        /// With --follow: the admin HTTP address (`/metrics`, `/healthz`).
        #[arg(long, env = "PREFIXLOG_AUDIT_ADMIN_ADDR", default_value = "127.0.0.1:9155")]
        admin_addr: std::net::SocketAddr,
        /// With --follow: how often to look for new records.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        poll: std::time::Duration,
    },
}

/// A range end: offsets, log time, or `default`.
fn range_point(time: Option<String>, offsets: Option<String>, default: Point) -> anyhow::Result<Point> {
    Ok(match (time, offsets) {
        (Some(t), _) => Point::Time(parse_time(&t)?),
        (_, Some(o)) => Point::Offsets(parse_offsets(&o)?),
        _ => default,
    })
}

pub fn parse_time(s: &str) -> anyhow::Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| anyhow::anyhow!("{s:?} is neither RFC 3339 nor milliseconds: {e}"))?;
    Ok(t.duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64)
}

pub fn parse_offsets(s: &str) -> anyhow::Result<Vec<NextOffset>> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            let (p, o) =
                x.split_once(':').ok_or_else(|| anyhow::anyhow!("expected partition:offset, got {x:?}"))?;
            Ok(NextOffset::new(p.trim().parse()?, o.trim().parse()?))
        })
        .collect()
}

fn load_queries(p: &PathBuf) -> anyhow::Result<Vec<Query>> {
    let text = std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?;
    serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{}: not a JSON array of queries: {e}", p.display()))
}

pub fn run(a: Args, rt: &tokio::runtime::Handle) -> anyhow::Result<()> {
    let brokers = a.kafka.require_brokers("audit")?;
    let log = a.kafka.spec(&brokers)?.with_settings(a.settings.settings()).with_shard(a.shard.clone())?;
    let store = match &a.data_dir {
        Some(d) => Some(CheckpointStore::open_reader(&d.join("checkpoints"))?),
        None => None,
    };
    let at = |point: Point| -> anyhow::Result<prefixlog_audit::Reconstructed> {
        let r = reconstruct(store.as_ref(), &log, &point, true)?;
        eprintln!(
            "reconstructed {point:?}: from {} + {} records; offsets {:?}",
            r.checkpoint.map_or("the log start".to_string(), |c| format!("checkpoint {c}")),
            r.replayed,
            r.offsets()
        );
        Ok(r)
    };
    match a.cmd {
        Cmd::Loss {
            from,
            to,
            from_offsets,
            to_offsets,
            bucket_secs,
            json,
            svg,
            follow,
            admin_addr,
            poll,
        } => {
            let start = Point::Offsets(log.owned().iter().map(|&p| NextOffset::new(p, 0)).collect());
            let from = range_point(from, from_offsets, start)?;
            if follow {
                return follow_loss(store.as_ref(), &log, &from, admin_addr, poll, rt);
            }
            let to = range_point(to, to_offsets, Point::Offsets(vec![]))?;
            let opts = LossOptions { bucket_ms: bucket_secs.max(1) * 1000, keep_decisions: json };
            let r = judge_range(store.as_ref(), &log, &from, &to, &opts)?;
            if json {
                json_lines(&r).iter().for_each(|l| println!("{l}"));
            } else {
                print!("{}", table(&r));
            }
            if let Some(path) = svg {
                std::fs::write(&path, prefixlog_audit::loss_svg::svg(&r))?;
                eprintln!("lost tokens over time written to {}", path.display());
            }
            eprintln!(
                "judged {} placements over {} records in {:.2} s",
                r.total.decisions, r.replayed, r.secs
            );
        }
        Cmd::At { time, offsets, queries, summary, holder } => {
            let point = match (time, offsets) {
                (Some(t), _) => Point::Time(parse_time(&t)?),
                (_, Some(o)) => Point::Offsets(parse_offsets(&o)?),
                _ => unreachable!("clap requires one"),
            };
            let r = at(point)?;
            let engine = r.applier.engine();
            if let Some(q) = queries {
                let answers: Vec<serde_json::Value> = load_queries(&q)?
                    .iter()
                    .map(|q| match answer(engine, q) {
                        Ok(a) => serde_json::to_value(a).expect("serialisable"),
                        Err(e) => serde_json::json!({ "error": e.to_string() }),
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({ "offsets": r.offsets(), "answers": answers })
                    )?
                );
            }
            if summary {
                for ((ks, w), b) in worker_blocks(engine) {
                    println!("{ks}\tworker {w}\t{b} blocks");
                }
            }
            if let Some(h) = holder {
                let (ks, key) = parse_holder(&h)?;
                println!("{}", serde_json::to_string_pretty(&holder_blocks(engine, &ks, key))?);
            }
        }
        Cmd::Explain { record } => {
            let NextOffset { partition: p, offset: o } =
                *parse_offsets(&record)?.first().ok_or_else(|| anyhow::anyhow!("--record p:o"))?;
            let value = read_record(&log, p, o)?;
            let op = decode(value.as_deref(), p, log.partitions, usize::MAX)
                .map_err(|r| anyhow::anyhow!("record {p}:{o} is a bad record ({r})"))?;
            let Op::Placement { keyspace, holder, locals, answered_at, .. } = op else {
                anyhow::bail!("record {p}:{o} is not a placement");
            };
            anyhow::ensure!(
                !answered_at.is_empty(),
                "placement {p}:{o} carries no answer offsets: the gateway routed without an index answer"
            );
            let r = at(Point::Offsets(answered_at.clone()))?;
            let res =
                r.applier.engine().match_chain(&keyspace, &locals, &Default::default()).unwrap_or_default();
            println!("placement {p}:{o}: {} blocks routed to {holder} in {keyspace}; the index at {answered_at:?} said:", locals.len());
            println!("{:>10} {:>4} {:>5} {:>7} {:>8}  ", "worker", "dp", "lane", "depth", "total");
            for m in &res {
                let mark = if m.holder.worker == holder.worker { "  <- chosen" } else { "" };
                println!(
                    "{:>10} {:>4} {:>5} {:>7} {:>8}{mark}",
                    m.holder.worker, m.holder.dp_rank, m.holder.lane, m.depth, m.total
                );
            }
            if !res.iter().any(|m| m.holder.worker == holder.worker) {
                println!("chosen worker {} held none of the prefix (depth 0)", holder.worker);
            }
        }
        Cmd::Diff { from, to, queries } => {
            let (t1, t2) = (parse_time(&from)?, parse_time(&to)?);
            let r1 = at(Point::Time(t1))?;
            let b1 = worker_blocks(r1.applier.engine());
            let a1 = match &queries {
                Some(q) => {
                    Some(load_queries(q)?.iter().map(|q| answer(r1.applier.engine(), q)).collect::<Vec<_>>())
                }
                None => None,
            };
            drop(r1);
            let r2 = at(Point::Time(t2))?;
            let b2 = worker_blocks(r2.applier.engine());
            let mut keys: Vec<&(KeyspaceId, u64)> = b1.keys().chain(b2.keys()).collect();
            keys.sort();
            keys.dedup();
            println!("keyspace\tworker\tblocks@from\tblocks@to\tchange");
            for k in keys {
                let (x, y) = (b1.get(k).copied().unwrap_or(0), b2.get(k).copied().unwrap_or(0));
                println!("{}\t{}\t{x}\t{y}\t{:+}", k.0, k.1, y as i64 - x as i64);
            }
            if let (Some(q), Some(a1)) = (queries, a1) {
                for (i, (q, a1)) in load_queries(&q)?.iter().zip(a1).enumerate() {
                    let a2 = answer(r2.applier.engine(), q);
                    println!(
                        "query {i}: from {}\n         to   {}",
                        serde_json::to_string(&a1.ok())?,
                        serde_json::to_string(&a2.ok())?
                    );
                }
            }
        }
        Cmd::Verify { from, to } => {
            let store = store
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("verify needs --data-dir (the checkpoints to check)"))?;
            let (t1, t2) =
                (parse_time(&from)?, to.as_deref().map(parse_time).transpose()?.unwrap_or(u64::MAX));
            let r = prefixlog_audit::verify(store, &log, t1, t2, true)?;
            for (id, p) in &r.mismatches {
                println!("checkpoint {id} partition {p}: MISMATCH (replay does not reproduce its digest)");
            }
            if !r.other_settings.is_empty() {
                println!(
                    "not compared (applied with other state settings): checkpoints {:?}",
                    r.other_settings
                );
            }
            println!("verified {} checkpoints: {} partition mismatches", r.checked, r.mismatches.len());
            if !r.mismatches.is_empty() {
                anyhow::bail!("determinism check failed");
            }
        }
    }
    Ok(())
}

/// `audit loss --follow`: the judge as a continuous job, its counters on an admin port.
fn follow_loss(
    store: Option<&CheckpointStore>,
    log: &LogSpec,
    from: &Point,
    admin_addr: std::net::SocketAddr,
    poll: std::time::Duration,
    rt: &tokio::runtime::Handle,
) -> anyhow::Result<()> {
    let counters = LossCounters::default();
    let registry = prometheus::Registry::new();
    counters.register(&registry)?;
    let ready = Arc::new(AlwaysReady("audit loss following"));
    let admin = rt
        .block_on(AdminPort::bind(admin_addr, registry, ready))
        .map_err(|e| anyhow::anyhow!("binding --admin-addr {admin_addr}: {e}"))?;
    eprintln!("audit loss --follow: counters on http://{}/metrics", admin.addr());
    let stop = Arc::new(AtomicBool::new(false));
    let on_signal = stop.clone();
    rt.spawn(async move {
        crate::bridge_cmd::shutdown_signal().await;
        on_signal.store(true, Ordering::Relaxed);
    });
    let replayed = follow(store, log, from, &counters, &stop, poll)?;
    eprintln!("audit loss --follow: stopped after {replayed} records");
    Ok(())
}

fn parse_holder(s: &str) -> anyhow::Result<(KeyspaceId, HolderKey)> {
    let err = || anyhow::anyhow!("expected MODEL/BLOCK_SIZE/SCHEME@WORKER:DP:LANE, got {s:?}");
    let (ks, h) = s.split_once('@').ok_or_else(err)?;
    let k: Vec<&str> = ks.rsplitn(3, '/').collect();
    let h: Vec<&str> = h.split(':').collect();
    if k.len() != 3 || h.len() != 3 {
        return Err(err());
    }
    Ok((
        KeyspaceId::new(k[2], k[1].parse()?, k[0].parse()?),
        HolderKey::new(h[0].parse()?, h[1].parse()?, h[2].parse()?),
    ))
}

/// One record of the log, read through the one log reader.
fn read_record(log: &LogSpec, p: u32, o: i64) -> anyhow::Result<Option<Vec<u8>>> {
    let mut reader = LogReader::open_bounded(log, [NextOffset::new(p, o)])?;
    for _ in 0..100 {
        match reader.poll(std::time::Duration::from_millis(100)) {
            Read::Record(r) => return Ok(r.payload().map(<[u8]>::to_vec)),
            Read::Discontinuity(d) => anyhow::bail!("record {p}:{o} is not retained: {d}"),
            Read::Idle | Read::BrokerError(_) => {}
        }
    }
    anyhow::bail!("record {p}:{o} not found within 10 s (beyond the partition's end?)")
}
