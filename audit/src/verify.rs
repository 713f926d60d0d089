//! Determinism over real history: replay a range and check every retained checkpoint in it.

use crate::reconstruct::{advance, of_this_log, reconstruct, AuditError, Point};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::LogSource;
use prefixlog_state::NextOffset;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Checkpoints reproduced and compared.
    pub checked: usize,
    /// `(checkpoint, partition)` whose digest the replay did not reproduce.
    pub mismatches: Vec<(u64, u32)>,
    /// Checkpoints in the range applied with other settings than the replay's (not compared).
    pub other_settings: Vec<u64>,
}

/// Starts at log time `from` and walks forward through every retained checkpoint up to log
/// time `to`, comparing each owned partition's digest, as the checkpoint recorded it, with the
/// replayed state at its offsets. One engine in memory: the replayed one.
pub fn verify(
    store: &CheckpointStore,
    log: &dyn LogSource,
    from: u64,
    to: u64,
    progress: bool,
) -> Result<VerifyReport, AuditError> {
    let mut r = reconstruct(Some(store), log, &Point::Time(from), progress)?;
    // Only this log's checkpoints: another cluster's, topic's or partition count's say nothing
    // about this log (and their offsets do not index its partitions).
    let mut metas: Vec<_> = store
        .ids()
        .into_iter()
        .filter_map(|id| store.meta(id).ok())
        .filter(|m| of_this_log(m, &r.log, log.owned()))
        .collect();
    metas.sort_by_key(|m| m.id);
    let mut report = VerifyReport::default();
    for m in metas.iter().filter(|m| m.log_time() <= to && Some(m.id) != r.checkpoint) {
        if log.owned().iter().any(|&p| m.offsets[p as usize] < r.applier.partition(p).next_offset) {
            continue; // before the range start
        }
        if m.identity.settings != *r.applier.settings() {
            report.other_settings.push(m.id);
            continue;
        }
        let point =
            Point::Offsets(log.owned().iter().map(|&p| NextOffset::new(p, m.offsets[p as usize])).collect());
        advance(&mut r.applier, log, &point, progress)?;
        report.checked += 1;
        for &p in log.owned() {
            if m.digests.get(p as usize) != Some(&r.applier.partition_digest(p)) {
                report.mismatches.push((m.id, p));
            }
        }
    }
    Ok(report)
}
