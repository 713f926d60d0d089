//! The self-check and the partition rebuild (see the crate docs for the rule).

use parking_lot::Mutex;
use prefixlog_audit::{advance, LogSource, Point};
use prefixlog_engine::{Engine, EngineConfig};
use prefixlog_ingest::{probe_log, Applier, ApplyConfig, ReplicaConfig};
use prefixlog_snapshot::{restore, CheckpointStore};
use std::sync::Arc;

/// What a replica needs to rebuild one of its partitions.
#[derive(Clone)]
pub struct RepairContext {
    pub store: Option<Arc<CheckpointStore>>,
    pub log: ReplicaConfig,
    pub engine_cfg: EngineConfig,
    pub apply_cfg: ApplyConfig,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RepairOutcome {
    /// Our state at the point is what our log produces: the peer must repair.
    Consistent,
    /// Our partition diverged from our log and was rebuilt and swapped in.
    Repaired { from_checkpoint: Option<u64>, replayed_to: i64 },
}

fn log_source(ctx: &RepairContext) -> Result<LogSource, String> {
    let probe = probe_log(&ctx.log).map_err(|e| e.to_string())?;
    Ok(LogSource {
        brokers: ctx.log.brokers.clone(),
        topic: ctx.log.topic.clone(),
        partitions: probe.partitions,
        properties: ctx.log.properties.clone(),
        low_watermarks: probe.low_watermarks,
        high_watermarks: probe.high_watermarks,
    })
}

/// Replays only partition `p` of `a` up to next offset `to`.
fn advance_partition(a: &mut Applier, log: &LogSource, p: u32, to: i64) -> Result<(), String> {
    let point: Vec<(u32, i64)> =
        (0..log.partitions).map(|q| (q, if q == p { to } else { a.partition(q).next_offset })).collect();
    advance(a, log, &Point::Offsets(point), false).map(|_| ()).map_err(|e| e.to_string())
}

/// Checks our partition `p` against our own log at `point` (where we recorded `recorded`),
/// starting from a checkpoint no later than `trusted` (the last offset both replicas agreed
/// on), and repairs it if it diverged.
pub fn self_check(
    applier: &Mutex<Applier>,
    ctx: &RepairContext,
    p: u32,
    point: i64,
    recorded: u64,
    trusted: Option<i64>,
) -> Result<RepairOutcome, String> {
    let log = log_source(ctx)?;
    let trusted = trusted.unwrap_or(0);
    let mut base = None;
    if let Some(store) = &ctx.store {
        for id in store.ids() {
            let Ok(m) = store.meta(id) else { continue };
            if m.offsets.get(p as usize).is_some_and(|&o| o <= trusted) && m.identity.topic == log.topic {
                if let Ok(l) = store.load(id) {
                    base = Some(l);
                    break;
                }
            }
        }
    }
    let (mut rebuilt, from_checkpoint) = match &base {
        Some(l) => (restore(l, ctx.engine_cfg.clone(), ctx.apply_cfg.clone())?, Some(l.meta.id)),
        None => {
            if log.low_watermarks.get(p as usize).copied().unwrap_or(0) > 0 {
                return Err(format!(
                    "partition {p}: no checkpoint at or before offset {trusted} and the log no longer starts at 0: cannot rebuild"
                ));
            }
            (Applier::new(Arc::new(Engine::new(ctx.engine_cfg.clone())), ctx.apply_cfg.clone()), None)
        }
    };
    advance_partition(&mut rebuilt, &log, p, point)?;
    if rebuilt.partition(p).next_offset != point {
        return Err(format!(
            "partition {p}: replay stopped at {} before {point}",
            rebuilt.partition(p).next_offset
        ));
    }
    if rebuilt.partition_digest(p) == recorded {
        return Ok(RepairOutcome::Consistent);
    }
    // Diverged: pause ingest (hold the applier), replay to where we are, swap the partition in.
    // Queries keep running on the other partitions' holders; the swap itself takes each
    // keyspace's write lock once.
    let mut a = applier.lock();
    let to = a.partition(p).next_offset;
    advance_partition(&mut rebuilt, &log, p, to)?;
    a.replace_partition(p, &rebuilt);
    Ok(RepairOutcome::Repaired { from_checkpoint, replayed_to: to })
}
