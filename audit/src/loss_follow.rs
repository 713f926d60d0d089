//! `prefixlog audit loss --follow`: the loss judge as a continuous job, its totals as
//! Prometheus counters (per gateway and policy) so a dashboard shows lost tokens per minute
//! beside the hit rate.

use crate::loss::{judge_record, policy_name, Decision};
use crate::reconstruct::{advance_observed, reconstruct, AuditError, Point};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::{Applier, LogSource};
use prometheus::{IntCounterVec, Opts, Registry};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The counters, labelled `gateway` and `policy`.
#[derive(Clone)]
pub struct LossCounters {
    pub decisions: IntCounterVec,
    pub lossy_decisions: IntCounterVec,
    pub achievable_blocks: IntCounterVec,
    pub lost_blocks: IntCounterVec,
    pub lost_tokens: IntCounterVec,
}

fn vec(name: &str, help: &str) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), &["gateway", "policy"]).expect("valid counter")
}

impl Default for LossCounters {
    fn default() -> Self {
        Self {
            decisions: vec("prefixlog_audit_loss_decisions_total", "Placements judged."),
            lossy_decisions: vec(
                "prefixlog_audit_loss_lossy_decisions_total",
                "Placements whose chosen worker held less than the best worker.",
            ),
            achievable_blocks: vec(
                "prefixlog_audit_loss_achievable_blocks_total",
                "Prefix blocks the best worker held, summed over placements.",
            ),
            lost_blocks: vec(
                "prefixlog_audit_loss_lost_blocks_total",
                "Prefix blocks the best worker held beyond the chosen one.",
            ),
            lost_tokens: vec("prefixlog_audit_loss_lost_tokens_total", "Lost blocks times the block size."),
        }
    }
}

impl LossCounters {
    pub fn register(&self, r: &Registry) -> prometheus::Result<()> {
        for c in [
            &self.decisions,
            &self.lossy_decisions,
            &self.achievable_blocks,
            &self.lost_blocks,
            &self.lost_tokens,
        ] {
            r.register(Box::new(c.clone()))?;
        }
        Ok(())
    }

    pub fn observe(&self, d: &Decision) {
        let labels = [d.gateway.as_str(), policy_name(&d.policy)];
        self.decisions.with_label_values(&labels).inc();
        if d.lost_blocks > 0 {
            self.lossy_decisions.with_label_values(&labels).inc();
        }
        self.achievable_blocks.with_label_values(&labels).inc_by(u64::from(d.best_blocks));
        self.lost_blocks.with_label_values(&labels).inc_by(u64::from(d.lost_blocks));
        self.lost_tokens.with_label_values(&labels).inc_by(d.lost_tokens);
    }
}

/// Rebuilds the state at `from`, then judges every placement up to the log's end, again every
/// `poll`, until `stop` is set. Returns the records replayed.
pub fn follow(
    store: Option<&CheckpointStore>,
    log: &dyn LogSource,
    from: &Point,
    counters: &LossCounters,
    stop: &AtomicBool,
    poll: Duration,
) -> Result<u64, AuditError> {
    let mut state = reconstruct(store, log, from, false)?;
    let partitions = log.partitions();
    let mut observe = |applier: &Applier, p: u32, offset: i64, t: u64, value: Option<&[u8]>| {
        if let Some(d) = judge_record(applier, partitions, p, offset, t, value) {
            counters.observe(&d);
        }
    };
    let mut replayed = 0;
    while !stop.load(Ordering::Relaxed) {
        replayed += advance_observed(&mut state.applier, log, &Point::Offsets(vec![]), &mut observe)?;
        std::thread::sleep(poll);
    }
    Ok(replayed)
}
