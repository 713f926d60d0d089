//! Rebuilding the state at a past point.

use indicatif::{ProgressBar, ProgressStyle};
use prefixlog_snapshot::{restore_for, CheckpointMeta, CheckpointStore, RestoreError};
use prefixlog_state::NextOffset;
use prefixlog_state::{
    check_compatible, Applier, ApplyLogOptions, BeforeApply, LogError, LogIdentity, LogProbe, LogSource,
    Until,
};
use std::collections::BTreeMap;

/// Where to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Point {
    /// Next offsets per partition (what a query response's `applied` offsets say): every record
    /// below them is applied, none at or above. Owned partitions not named are taken to their
    /// end.
    Offsets(Vec<NextOffset>),
    /// Log time in ms: per partition, every record before the first one stamped after it.
    Time(u64),
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "the requested point is older than anything retained: {why}. Earliest reachable point: {earliest}"
    )]
    TooOld { why: String, earliest: String },
    #[error("the requested point is beyond the end of the log (partition {partition}: asked {asked}, log ends at {end})")]
    BeyondEnd { partition: u32, asked: i64, end: i64 },
    #[error("partition {0} is not part of this audit (not owned by --shard)")]
    NotOwned(u32),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    /// Probing or reading the log (the Kafka edge's error inside).
    #[error(transparent)]
    Log(#[from] LogError),
}

/// The state at the point.
pub struct Reconstructed {
    pub applier: Applier,
    /// The checkpoint replay started from (None: the log start).
    pub checkpoint: Option<u64>,
    /// Records replayed on top of it.
    pub replayed: u64,
    /// The log audited (its settings: the command line's; a checkpoint's own settings apply
    /// when replay starts from it).
    pub log: LogIdentity,
}

/// Whether `meta` is a checkpoint of the log `log` covering `need`, whatever its settings (an
/// audit applies a checkpoint's own settings): the one compatibility rule, settings relaxed.
pub fn of_this_log(meta: &CheckpointMeta, log: &LogIdentity, need: &[u32]) -> bool {
    let ours = LogIdentity { settings: meta.identity.settings, ..log.clone() };
    check_compatible(&ours, &meta.identity, need).is_ok()
}

impl Reconstructed {
    pub fn offsets(&self) -> Vec<i64> {
        self.applier.offsets()
    }
}

/// The target next offsets of a point given as offsets, every owned partition named.
fn target_offsets(
    log: &dyn LogSource,
    point: &Point,
    probe: &LogProbe,
) -> Result<Option<BTreeMap<u32, i64>>, AuditError> {
    let Point::Offsets(o) = point else { return Ok(None) };
    let mut t: BTreeMap<u32, i64> = log.owned().iter().map(|&p| (p, probe.high(p))).collect();
    for &NextOffset { partition: p, offset: off } in o {
        let Some(x) = t.get_mut(&p) else { return Err(AuditError::NotOwned(p)) };
        if off > probe.high(p) {
            return Err(AuditError::BeyondEnd { partition: p, asked: off, end: probe.high(p) });
        }
        *x = off;
    }
    Ok(Some(t))
}

fn usable(meta: &CheckpointMeta, point: &Point, target: &Option<BTreeMap<u32, i64>>) -> bool {
    match (point, target) {
        (Point::Offsets(_), Some(t)) => t.iter().all(|(&p, &o)| meta.offsets[p as usize] <= o),
        (Point::Time(time), _) => meta.covered().all(|(_, _, lt)| lt <= *time),
        _ => false,
    }
}

/// The newest retained checkpoint of this log covering the audited partitions and no later
/// than the point, and the oldest such checkpoint (for the "too old" message). The one
/// compatibility rule applies, with the checkpoint's own settings: an audit reproduces what
/// the replica said with the settings it ran with.
fn choose(
    store: &CheckpointStore,
    ours: &LogIdentity,
    need: &[u32],
    point: &Point,
    target: &Option<BTreeMap<u32, i64>>,
) -> (Option<CheckpointMeta>, Option<CheckpointMeta>) {
    let (mut base, mut oldest) = (None, None);
    for id in store.ids() {
        let Ok(meta) = store.meta(id) else { continue };
        if !of_this_log(&meta, ours, need) {
            continue;
        }
        if base.is_none() && usable(&meta, point, target) {
            base = Some(meta.clone());
        }
        oldest = Some(meta);
    }
    (base, oldest)
}

fn too_old(oldest: Option<CheckpointMeta>, probe: &LogProbe) -> AuditError {
    let earliest = match oldest {
        Some(m) => {
            format!("checkpoint {} (log time {} ms, offsets {:?})", m.id, m.log_time(), m.covered_offsets())
        }
        None => format!("none: no retained checkpoint, and the log starts at {:?}", probe.watermarks),
    };
    AuditError::TooOld {
        why: "no retained checkpoint is at or before it and the log no longer starts at offset 0".into(),
        earliest,
    }
}

/// Rebuilds the state at `point`: newest usable retained checkpoint, then exact replay.
pub fn reconstruct(
    store: Option<&CheckpointStore>,
    log: &dyn LogSource,
    point: &Point,
    progress: bool,
) -> Result<Reconstructed, AuditError> {
    reconstruct_at(store, log, &log.probe()?, point, progress)
}

/// [`reconstruct`] with the log's range as `probe` says (tests use it to present a log whose
/// head retention has dropped).
pub fn reconstruct_at(
    store: Option<&CheckpointStore>,
    log: &dyn LogSource,
    probe: &LogProbe,
    point: &Point,
    progress: bool,
) -> Result<Reconstructed, AuditError> {
    let started = std::time::Instant::now();
    let target = target_offsets(log, point, probe)?;
    let ours = LogIdentity {
        cluster_id: probe.cluster_id.clone(),
        topic: log.topic().to_string(),
        partitions: log.partitions(),
        owned: log.owned().to_vec(),
        settings: log.settings(),
    };
    let (base, oldest) = match store {
        Some(s) => choose(s, &ours, log.owned(), point, &target),
        None => (None, None),
    };
    let (mut applier, checkpoint) = match &base {
        Some(meta) => {
            let loaded = store.expect("a base implies a store").load(meta.id).map_err(RestoreError::from)?;
            let ours = LogIdentity { settings: meta.identity.settings, ..ours.clone() };
            (restore_for(&loaded, &ours, log.owned())?, Some(meta.id))
        }
        // From the log start: with the settings of this log's oldest retained checkpoint when
        // there is one (what the replica ran with, closer than the command line's flags).
        None if probe.from_start() => {
            let settings = oldest.as_ref().map_or(log.settings(), |m| m.identity.settings);
            if settings != log.settings() {
                tracing::info!(
                    checkpoint = oldest.as_ref().map(|m| m.id),
                    ?settings,
                    "replaying from the log start with the settings of the oldest retained checkpoint"
                );
            }
            (Applier::new(log.partitions(), settings), None)
        }
        None => return Err(too_old(oldest, probe)),
    };
    // For a checkpoint base, the log must still hold everything after it.
    for &p in log.owned() {
        let (from, low) = (applier.partition(p).next_offset, probe.low(p));
        if from < low {
            return Err(AuditError::TooOld {
                why: format!("partition {p} would replay from offset {from} but the log starts at {low}"),
                earliest: format!("log start offsets {:?}", probe.watermarks),
            });
        }
    }
    // A checkpoint base must be of this very log: the replay starts at the record before each
    // offset and checks it is the one the checkpoint applied (`LogSource::apply`).
    let restored_secs = started.elapsed().as_secs_f64();
    let replayed = advance_on(&mut applier, log, probe, point, progress, None)?;
    tracing::info!(
        checkpoint,
        restored_secs,
        replayed,
        secs = started.elapsed().as_secs_f64(),
        "reconstructed"
    );
    Ok(Reconstructed { applier, checkpoint, replayed, log: ours })
}

/// Applies records from the applier's current offsets up to `point` (also for walking forward
/// from one reconstructed point to a later one).
pub fn advance(
    applier: &mut Applier,
    log: &dyn LogSource,
    point: &Point,
    progress: bool,
) -> Result<u64, AuditError> {
    advance_on(applier, log, &log.probe()?, point, progress, None)
}

/// [`advance`] calling `before_apply` with the state just before each record (audits that
/// judge records in the same pass as the replay).
pub fn advance_observed(
    applier: &mut Applier,
    log: &dyn LogSource,
    point: &Point,
    before_apply: &mut BeforeApply<'_>,
) -> Result<u64, AuditError> {
    advance_on(applier, log, &log.probe()?, point, false, Some(before_apply))
}

/// Where applying the log from `applier`'s offsets to `point` stops.
pub(crate) fn until_for(
    applier: &Applier,
    log: &dyn LogSource,
    probe: &LogProbe,
    point: &Point,
) -> Result<Until, AuditError> {
    Ok(match point {
        Point::Time(t) => Until::Time(*t),
        Point::Offsets(_) => {
            let target = target_offsets(log, point, probe)?.unwrap_or_default();
            Until::Offsets(
                target.into_iter().filter(|&(p, o)| applier.partition(p).next_offset < o).collect(),
            )
        }
    })
}

/// [`advance`] on the log's range as `probe` says (probed just before by the caller).
fn advance_on(
    applier: &mut Applier,
    log: &dyn LogSource,
    probe: &LogProbe,
    point: &Point,
    progress: bool,
    before_apply: Option<&mut BeforeApply<'_>>,
) -> Result<u64, AuditError> {
    let until = until_for(applier, log, probe, point)?;
    let bar = if progress { ProgressBar::new(0) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("replaying {bar:40} {pos}/{len} records ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut report = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let opts = ApplyLogOptions {
        progress: Some(&mut report),
        probe: Some(probe),
        before_apply: before_apply.map(|f| f as &mut BeforeApply<'_>),
        ..ApplyLogOptions::default()
    };
    let n = log.apply(applier, &until, opts)?;
    bar.finish_and_clear();
    Ok(n)
}
