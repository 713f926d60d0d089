//! The self-check and the partition repair (see the crate docs for the rule).
//!
//! Both run off to the side: a partition is rebuilt in a separate applier from a checkpoint
//! (or the log start) by applying the log up to a *fixed* target offset ([`LogSource::apply`]), which must be reached
//! exactly (a stall or a discontinuity is an error, never a partial rebuild). A repair then
//! catches the rebuilt partition up with the live one, still off to the side, and hands it to
//! the ingest thread, which swaps it in between two records and reads on from its offset —
//! so neither the applier lock nor ingest is ever held across Kafka I/O, and ingest into the
//! repaired partition and all others goes on throughout.

use parking_lot::Mutex;
use prefixlog_engine::{InvariantError, KeyspaceId};
use prefixlog_snapshot::{restore, CheckpointStore, Loaded, RestoreError};
use prefixlog_state::{
    check_compatible, Applier, ApplyLogOptions, LiveState, LogError, LogIdentity, LogSource, Until,
};
use std::collections::BTreeSet;
use std::sync::Arc;

/// What a replica needs to rebuild one of its partitions.
#[derive(Clone)]
pub struct RepairContext {
    /// The log (Kafka in a replica, memory in tests).
    pub log: Arc<dyn LogSource>,
    /// This replica's identity (its settings decide how the log is applied).
    pub identity: LogIdentity,
    pub store: Option<Arc<CheckpointStore>>,
    /// The partitions being repaired now (shared by anti-entropy and the scrubber).
    pub gate: RepairGate,
}

impl RepairContext {
    pub fn new(log: Arc<dyn LogSource>, identity: LogIdentity, store: Option<Arc<CheckpointStore>>) -> Self {
        Self { log, identity, store, gate: RepairGate::default() }
    }
}

/// One repair per partition at a time: anti-entropy rounds against several peers, and the
/// scrubber, may all find the same partition wrong at once, and two rebuilds of it would only
/// race to swap in the same state.
#[derive(Clone, Default)]
pub struct RepairGate(Arc<Mutex<BTreeSet<u32>>>);

/// Holds partition `p`'s place in the [`RepairGate`] until dropped.
pub struct Repairing {
    gate: RepairGate,
    partition: u32,
}

impl RepairGate {
    /// The partition's place, or `None` when a repair of it is running.
    pub fn enter(&self, partition: u32) -> Option<Repairing> {
        self.0.lock().insert(partition).then(|| Repairing { gate: self.clone(), partition })
    }
}

impl Drop for Repairing {
    fn drop(&mut self) {
        self.gate.0.lock().remove(&self.partition);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error("partition {partition}: no checkpoint at or before offset {trusted} and the log starts at {log_start}: cannot rebuild")]
    NoBase { partition: u32, trusted: i64, log_start: i64 },
    #[error("partition {partition}: {source}")]
    ApplyLog { partition: u32, source: LogError },
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// Probing the log's range.
    #[error(transparent)]
    Probe(LogError),
    #[error("swapping the rebuilt partition in: {0}")]
    Swap(LogError),
    #[error("the rebuild task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The outcome of a self-check.
pub enum SelfCheck {
    /// Our state at the point is what our log produces: the peer must repair.
    Consistent,
    /// Our partition diverged from our log; `rebuilt` holds it at the mismatched point.
    Diverged { rebuilt: Box<Applier>, from_checkpoint: Option<u64> },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RepairOutcome {
    Consistent,
    /// Another repair of the partition is running; nothing was done.
    AlreadyRunning,
    /// The partition was rebuilt and swapped in; the live state went on from `swapped_at`.
    Repaired {
        from_checkpoint: Option<u64>,
        swapped_at: i64,
    },
}

/// The newest local checkpoint that can stand for partition `p` no later than `trusted`.
fn base_checkpoint(ctx: &RepairContext, p: u32, trusted: i64) -> Option<Loaded> {
    let store = ctx.store.as_ref()?;
    store.ids().into_iter().find_map(|id| {
        let m = store.meta(id).ok()?;
        let fits =
            check_compatible(&ctx.identity, &m.identity, &[p]).is_ok() && m.offsets[p as usize] <= trusted;
        fits.then(|| store.load(id).ok()).flatten()
    })
}

/// Replays partition `p` of `a` to next offset `to`, exactly.
fn advance(ctx: &RepairContext, a: &mut Applier, p: u32, to: i64) -> Result<(), RepairError> {
    let until = Until::Offsets([(p, to)].into_iter().collect());
    ctx.log
        .apply(a, &until, ApplyLogOptions::default())
        .map_err(|source| RepairError::ApplyLog { partition: p, source })?;
    Ok(())
}

/// Checks our partition `p` against our own log at `point` (where we recorded `recorded`),
/// starting from a checkpoint no later than `trusted` (the last offset both replicas agreed
/// on). Blocking: run it off the async workers.
pub fn self_check(
    ctx: &RepairContext,
    p: u32,
    point: i64,
    recorded: u64,
    trusted: Option<i64>,
) -> Result<SelfCheck, RepairError> {
    let trusted = trusted.unwrap_or(0);
    let (mut rebuilt, from_checkpoint) = match base_checkpoint(ctx, p, trusted) {
        Some(l) => (restore(&l)?.extract(&[p]), Some(l.meta.id)),
        None => {
            let log_start = ctx.log.probe().map_err(RepairError::Probe)?.low(p);
            if log_start > 0 {
                return Err(RepairError::NoBase { partition: p, trusted, log_start });
            }
            (Applier::new(ctx.log.partitions(), ctx.identity.settings), None)
        }
    };
    advance(ctx, &mut rebuilt, p, point)?;
    if rebuilt.partition_digest(p) == recorded {
        return Ok(SelfCheck::Consistent);
    }
    Ok(SelfCheck::Diverged { rebuilt: Box::new(rebuilt), from_checkpoint })
}

/// Brings `rebuilt` (partition `p`) up to the live state's offset, off to the side, twice —
/// the second pass picks up what arrived during the first — and has the ingest thread swap it
/// in. Records the live state applied after the last pass are applied again on the new state.
pub async fn swap_in(
    ctx: &RepairContext,
    replica: &dyn LiveState,
    p: u32,
    rebuilt: Applier,
) -> Result<i64, RepairError> {
    let mut rebuilt = rebuilt;
    for _ in 0..2 {
        let live = live_offset(replica.applier(), p);
        let (ctx2, mut a) = (ctx.clone(), rebuilt);
        rebuilt = tokio::task::spawn_blocking(move || advance(&ctx2, &mut a, p, live).map(|()| a)).await??;
    }
    let at = rebuilt.partition(p).next_offset;
    replica.replace_partition(p, rebuilt).await.map_err(RepairError::Swap)?;
    Ok(at)
}

fn live_offset(applier: &Mutex<Applier>, p: u32) -> i64 {
    applier.lock().partition(p).next_offset
}

/// The self-check, and the repair if it finds our partition diverged.
pub async fn check_and_repair(
    ctx: &RepairContext,
    replica: &dyn LiveState,
    p: u32,
    point: i64,
    recorded: u64,
    trusted: Option<i64>,
) -> Result<RepairOutcome, RepairError> {
    let Some(_repairing) = ctx.gate.enter(p) else { return Ok(RepairOutcome::AlreadyRunning) };
    let ctx2 = ctx.clone();
    let check = tokio::task::spawn_blocking(move || self_check(&ctx2, p, point, recorded, trusted)).await??;
    match check {
        SelfCheck::Consistent => Ok(RepairOutcome::Consistent),
        SelfCheck::Diverged { rebuilt, from_checkpoint } => {
            let swapped_at = swap_in(ctx, replica, p, *rebuilt).await?;
            Ok(RepairOutcome::Repaired { from_checkpoint, swapped_at })
        }
    }
}

/// Rebuilds partition `p` off to the side and swaps it in, without a self-check: the repair
/// for a partition whose query structures a scrub found inconsistent with its digests (which
/// may well agree with every peer's, so comparing them says nothing). The base is the newest
/// local checkpoint whose rebuilt partition passes the same checks and reproduces the digest
/// the checkpoint recorded for it (an older one when a newer carries the damage), else the log
/// start.
pub async fn rebuild_and_swap(
    ctx: &RepairContext,
    replica: &dyn LiveState,
    p: u32,
) -> Result<RepairOutcome, RepairError> {
    let Some(_repairing) = ctx.gate.enter(p) else { return Ok(RepairOutcome::AlreadyRunning) };
    let upto = live_offset(replica.applier(), p);
    let ctx2 = ctx.clone();
    let (rebuilt, from_checkpoint) =
        tokio::task::spawn_blocking(move || sound_base(&ctx2, p, upto)).await??;
    let swapped_at = swap_in(ctx, replica, p, rebuilt).await?;
    Ok(RepairOutcome::Repaired { from_checkpoint, swapped_at })
}

/// Partition `p` alone, from the newest checkpoint (at or before `upto`) that rebuilds into a
/// consistent state with the digest it recorded, else from the log start.
fn sound_base(ctx: &RepairContext, p: u32, upto: i64) -> Result<(Applier, Option<u64>), RepairError> {
    if let Some(store) = &ctx.store {
        for id in store.ids() {
            let Ok(m) = store.meta(id) else { continue };
            if check_compatible(&ctx.identity, &m.identity, &[p]).is_err() || m.offsets[p as usize] > upto {
                continue;
            }
            let rebuilt =
                store.load(id).map_err(RestoreError::from).and_then(|l| restore(&l)).map(|a| a.extract(&[p]));
            match rebuilt.map(|a| (consistent(&a).err(), a)) {
                Ok((None, a)) if m.digests.get(p as usize).is_none_or(|&d| d == a.partition_digest(p)) => {
                    return Ok((a, Some(id)))
                }
                Ok((why, _)) => {
                    let why =
                        why.map_or("its rebuilt digest is not the one it recorded".into(), |e| e.to_string());
                    tracing::warn!(
                        checkpoint = id,
                        partition = p,
                        %why,
                        "repair: this checkpoint carries the damage; trying an older one"
                    )
                }
                Err(e) => {
                    tracing::warn!(checkpoint = id, partition = p, error = %e, "repair: checkpoint unusable")
                }
            }
        }
    }
    let log_start = ctx.log.probe().map_err(RepairError::Probe)?.low(p);
    if log_start > 0 {
        return Err(RepairError::NoBase { partition: p, trusted: upto, log_start });
    }
    Ok((Applier::new(ctx.log.partitions(), ctx.identity.settings), None))
}

/// A keyspace of a rebuilt state that fails the full invariant check.
#[derive(Debug, thiserror::Error)]
#[error("keyspace {keyspace}: {source}")]
struct Inconsistent {
    keyspace: KeyspaceId,
    #[source]
    source: InvariantError,
}

/// Every keyspace of `a` passes the full invariant check.
fn consistent(a: &Applier) -> Result<(), Inconsistent> {
    for ks in a.engine().keyspaces() {
        let g = ks.read();
        g.check_invariants().map_err(|source| Inconsistent { keyspace: g.id().clone(), source })?;
    }
    Ok(())
}
