//! The demo's placements judged from the log (`prefixlog audit loss`) next to its live oracle:
//! the fraction of decisions where they disagree on "the chosen worker held less than the best",
//! and the judge's run time over a plain replay of the same range.

use super::report::Outcome;
use prefixlog_audit::{judge_range, reconstruct, LossOptions, Point};
use prefixlog_ingest::LogSpec;
use prefixlog_state::NextOffset;
use std::collections::HashMap;
use std::time::Instant;

pub struct Comparison {
    pub decisions: usize,
    /// Judged decisions paired with a live outcome.
    pub paired: usize,
    pub disagree: usize,
    pub replay_secs: f64,
    pub audit_secs: f64,
    pub summary: String,
}

impl Comparison {
    pub fn line(&self) -> String {
        format!(
            "{}\naudit loss vs live oracle: {:.2}% of decisions disagree, audit {:.2}x replay time \
             ({} placements judged, {} paired with a request; replay {:.2} s, audit {:.2} s)",
            self.summary,
            100.0 * self.disagree as f64 / self.paired.max(1) as f64,
            self.audit_secs / self.replay_secs.max(f64::MIN_POSITIVE),
            self.decisions,
            self.paired,
            self.replay_secs,
            self.audit_secs
        )
    }
}

/// Replays the log once plainly and once judging, and pairs every decision with a request by
/// (chosen worker, prompt).
pub fn compare(spec: &LogSpec, partitions: u32, outcomes: &[Outcome]) -> anyhow::Result<Comparison> {
    let start = Point::Offsets((0..partitions).map(|p| NextOffset::new(p, 0)).collect());
    let end = Point::Offsets(vec![]);
    let t = Instant::now();
    let plain = reconstruct(None, spec, &end, false)?;
    let replay_secs = t.elapsed().as_secs_f64();
    drop(plain);
    let report = judge_range(None, spec, &start, &end, &LossOptions::default())?;
    let mut live: HashMap<(u64, u64), Vec<bool>> = HashMap::new();
    for o in outcomes {
        live.entry((u64::from(o.chosen), o.prompt_tail)).or_default().push(o.lossy());
    }
    let (mut paired, mut disagree) = (0, 0);
    for d in &report.decisions {
        if let Some(lossy) = live.get_mut(&(d.worker, d.prompt_tail)).and_then(Vec::pop) {
            paired += 1;
            disagree += usize::from(lossy != (d.lost_blocks > 0));
        }
    }
    Ok(Comparison {
        decisions: report.decisions.len(),
        paired,
        disagree,
        replay_secs,
        audit_secs: report.secs,
        summary: prefixlog_audit::loss_report::summary_line(&report),
    })
}
