//! The demo's placements judged from the log (`prefixlog audit loss`) next to its live oracle:
//! the fraction of decisions where they disagree on "the chosen worker held less than the best",
//! and the judge's run time over a plain replay of the same range.

use super::report::Outcome;
use prefixlog_audit::{judge_range, reconstruct, LossOptions, Point};
use prefixlog_ingest::LogSpec;
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
    let start = Point::Offsets((0..partitions).map(|p| (p, 0)).collect());
    let end = Point::Offsets(vec![]);
    let t = Instant::now();
    let plain = reconstruct(None, spec, &end, false)?;
    let replay_secs = t.elapsed().as_secs_f64();
    drop(plain);
    let report = judge_range(None, spec, &start, &end, &LossOptions::default())?;
    let mut live: HashMap<(u64, u64), Vec<&Outcome>> = HashMap::new();
    for o in outcomes {
        live.entry((u64::from(o.chosen), o.prompt_tail)).or_default().push(o);
    }
    let (mut paired, mut disagree) = (0, 0);
    let mut dump = String::new();
    for d in &report.decisions {
        if let Some(o) = live.get_mut(&(d.worker, d.prompt_tail)).and_then(Vec::pop) {
            paired += 1;
            let lossy = o.lossy();
            disagree += usize::from(lossy != (d.lost_blocks > 0));
            let own = d.answered_at.iter().find(|x| x.0 == d.partition).map_or(-1, |x| d.offset - x.1);
            dump.push_str(&format!(
                "{} {} live {} {} ans {} {} audit {} {} {:?} since {} own {} p{}@{} tok {}\n",
                u8::from(lossy != (d.lost_blocks > 0)),
                u8::from(lossy),
                o.hit.gpu,
                o.oracle.gpu,
                o.answer_chosen,
                o.answer_best,
                d.chosen_blocks,
                d.best_blocks,
                o.answered,
                d.records_since_answer,
                own,
                d.partition,
                d.offset,
                d.answered_at.len()
            ));
        }
    }
    if let Ok(path) = std::env::var("PREFIXLOG_DEMO_LOSS_DUMP") {
        std::fs::write(path, dump)?;
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
