//! The demo's placements judged from the log (`prefixlog audit loss`) next to its live oracle,
//! per gateway policy ([`super::policy_feeds`]): the share of achievable prefix blocks each
//! policy's decisions realised, by the audit and by the live oracle; the fraction of decisions
//! where they disagree on "the chosen worker held less than the best"; and the judge's run
//! time over a plain replay of the same range (both timed in this process over the whole log,
//! consumer start-up included in both).
//!
//! `PREFIXLOG_DEMO_LOSS_DUMP=FILE` writes one line per paired decision (disagreement first):
//! what the live oracle, the gateway's index answer and the audit each saw.

use super::policy_feeds::{Judged, Policy, WorkerIds};
use super::report::Outcome;
use prefixlog_audit::{judge_range, reconstruct, Decision, LossOptions, LossReport, Point};
use prefixlog_ingest::LogSpec;
use prefixlog_state::NextOffset;
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::time::Instant;

/// Time buckets of the lost-tokens plot (ms of log time: the demo's log time is wall time).
const BUCKET_MS: u64 = 2_000;

/// One policy's row.
pub struct PolicyRow {
    pub policy: Policy,
    /// Placements of the policy judged by the audit.
    pub decisions: u64,
    pub paired: usize,
    pub disagree: usize,
    /// Chosen over achievable blocks, by the audit and by the live oracle.
    pub audit_realised: f64,
    pub live_realised: f64,
}

pub struct Comparison {
    pub rows: Vec<PolicyRow>,
    pub decisions: usize,
    /// Judged decisions paired with a live outcome.
    pub paired: usize,
    pub disagree: usize,
    pub replay_secs: f64,
    pub audit_secs: f64,
    pub summary: String,
    /// Lost prefill tokens over time per gateway (`prefixlog audit loss --svg`).
    pub svg: String,
}

impl Comparison {
    pub fn line(&self) -> String {
        let mut t = format!("{}\n\n", self.summary);
        t.push_str("| policy | decisions | achievable prefix blocks realised: audit | live oracle | decisions that disagree |\n");
        t.push_str("|---|---:|---:|---:|---:|\n");
        for r in &self.rows {
            let _ = writeln!(
                t,
                "| {} | {} | {:.3} | {:.3} | {:.2}% |",
                r.policy.name(),
                r.decisions,
                r.audit_realised,
                r.live_realised,
                percent(r.disagree, r.paired)
            );
        }
        let _ = write!(
            t,
            "\naudit loss vs live oracle: {:.2}% of decisions disagree, audit {:.2}x replay time \
             ({} placements judged, {} paired with a request; replay {:.2} s, audit {:.2} s)",
            percent(self.disagree, self.paired),
            self.audit_secs / self.replay_secs.max(f64::MIN_POSITIVE),
            self.decisions,
            self.paired,
            self.replay_secs,
            self.audit_secs
        );
        t
    }
}

/// What pairs a placement with a request: (policy name, worker id in the log, prompt tail).
type DecisionKey<'a> = (&'a str, u64, u64);

fn percent(n: usize, of: usize) -> f64 {
    100.0 * n as f64 / of.max(1) as f64
}

fn ratio(num: u64, den: u64) -> f64 {
    num as f64 / den.max(1) as f64
}

/// Replays the log once plainly and once judging, and pairs every decision with a request by
/// (policy, chosen worker, prompt).
pub fn compare(
    spec: &LogSpec,
    partitions: u32,
    workers: usize,
    outcomes: &[Outcome],
) -> anyhow::Result<Comparison> {
    let ids = WorkerIds::new(workers, partitions);
    let start = Point::Offsets((0..partitions).map(|p| NextOffset::new(p, 0)).collect());
    let end = Point::Offsets(vec![]);
    let t = Instant::now();
    let plain = reconstruct(None, spec, &end, false)?;
    let replay_secs = t.elapsed().as_secs_f64();
    drop(plain);
    let opts = LossOptions { bucket_ms: BUCKET_MS, keep_decisions: true };
    let report = judge_range(None, spec, &start, &end, &opts)?;
    // A key repeats when the trace replays in a loop (`--faults`): the n-th decision in log
    // order pairs with the n-th request of that key, first to first.
    let mut live: HashMap<DecisionKey, VecDeque<(&Outcome, Judged)>> = HashMap::new();
    for o in outcomes {
        for p in Policy::ALL {
            let j = o.judged[p.index()];
            live.entry((p.name(), ids.id(p, j.chosen), o.prompt_tail)).or_default().push_back((o, j));
        }
    }
    let mut rows: Vec<PolicyRow> = Policy::ALL.iter().map(|&p| row(p, &report, outcomes)).collect();
    let mut dump = Vec::new();
    for d in &report.decisions {
        let Some((o, j)) =
            live.get_mut(&(d.policy.as_str(), d.worker, d.prompt_tail)).and_then(VecDeque::pop_front)
        else {
            continue;
        };
        let Some(r) = rows.iter_mut().find(|r| r.policy.name() == d.policy) else { continue };
        let differ = j.lossy() != (d.lost_blocks > 0);
        r.paired += 1;
        r.disagree += usize::from(differ);
        dump.push((differ, dump_line(d, o, &j)));
    }
    if let Ok(path) = std::env::var("PREFIXLOG_DEMO_LOSS_DUMP") {
        dump.sort_by_key(|(differ, _)| !differ);
        std::fs::write(path, dump.into_iter().map(|(_, l)| l).collect::<String>())?;
    }
    Ok(Comparison {
        decisions: report.decisions.len(),
        paired: rows.iter().map(|r| r.paired).sum(),
        disagree: rows.iter().map(|r| r.disagree).sum(),
        rows,
        replay_secs,
        audit_secs: report.secs,
        summary: prefixlog_audit::loss_report::summary_line(&report),
        svg: prefixlog_audit::loss_svg::svg(&report),
    })
}

/// A policy's row before pairing: the audit's and the live oracle's realised shares.
fn row(policy: Policy, report: &LossReport, outcomes: &[Outcome]) -> PolicyRow {
    let audit = report.by_policy.get(policy.name()).copied().unwrap_or_default();
    let (depth, best) = outcomes
        .iter()
        .map(|o| o.judged[policy.index()])
        .fold((0u64, 0u64), |(d, b), j| (d + u64::from(j.depth), b + u64::from(j.best)));
    PolicyRow {
        policy,
        decisions: audit.decisions,
        paired: 0,
        disagree: 0,
        audit_realised: ratio(audit.chosen_blocks, audit.achievable_blocks),
        live_realised: ratio(depth, best),
    }
}

fn dump_line(d: &Decision, o: &Outcome, j: &Judged) -> String {
    format!(
        "{} {} worker {}: live {} of {}, index answer {} of {} ({:?}), audit {} of {} \
         (p{}@{}, token of {} partitions, {} records since the answer)\n",
        if j.lossy() != (d.lost_blocks > 0) { "DIFFER" } else { "same" },
        d.policy,
        d.worker,
        j.depth,
        j.best,
        o.answer_chosen,
        o.answer_best,
        o.answered,
        d.chosen_blocks,
        d.best_blocks,
        d.partition,
        d.offset,
        d.answered_at.len(),
        d.records_since_answer
    )
}

/// Where the lost-tokens plot goes: next to the hit-ratio chart, `<its stem>-lost-tokens.svg`.
pub fn plot_path(chart: &std::path::Path) -> std::path::PathBuf {
    let stem = chart.file_stem().map_or("demo".into(), |s| s.to_string_lossy());
    chart.with_file_name(format!("{stem}-lost-tokens.svg"))
}
