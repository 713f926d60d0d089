//! Routing-loss attribution: every placement in a log range judged against the index as it
//! stood just before the placement's record, in one replay.
//!
//! For each placement the judge asks the replayed index for the prompt's prefix (its local
//! block hashes) and records what the chosen worker held, what the best worker held, the best on
//! each storage tier, and the difference. The state is the one the replay reaches at the
//! placement's position: its own partition exactly up to the record before it, other partitions
//! as far as the replay has read them (see docs/audit.md, "Limits"). A placement carrying the
//! gateway's answer offsets (its token) is noted, with how many records its partitions moved on
//! between the answer and the judgement.

use crate::reconstruct::{advance_observed, reconstruct, AuditError, Point};
use prefixlog_engine::{HolderMatch, KeyspaceId, MatchOptions, Tier};
use prefixlog_snapshot::CheckpointStore;
use prefixlog_state::record::{decode, is_placement, Op};
use prefixlog_state::NextOffset;
use prefixlog_state::{Applier, LogSource};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// One judged placement.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Decision {
    pub partition: u32,
    pub offset: i64,
    /// Log time of the placement record (ms).
    pub log_time: u64,
    pub gateway: String,
    /// Empty when the placement names none.
    pub policy: String,
    pub keyspace: String,
    pub worker: u64,
    pub dp_rank: u32,
    pub prompt_blocks: u32,
    /// The prompt's last local hash (chained: it names the whole prefix), 0 for an empty one;
    /// lets a caller pair a decision with its own record of the request.
    pub prompt_tail: u64,
    pub block_size: u32,
    /// Contiguous prefix blocks the chosen worker held.
    pub chosen_blocks: u32,
    /// The most any worker held.
    pub best_blocks: u32,
    /// Every worker holding `best_blocks` (ties), ascending; empty when nobody held any.
    pub best_workers: Vec<u64>,
    /// Per tier name, the deepest prefix any worker held on that tier alone.
    pub best_per_tier: BTreeMap<String, u32>,
    /// Per tier name, the chosen worker's prefix on that tier alone.
    pub chosen_per_tier: BTreeMap<String, u32>,
    pub lost_blocks: u32,
    pub lost_tokens: u64,
    /// The gateway's answer offsets, when the placement carries them.
    pub answered_at: Vec<NextOffset>,
    /// Records applied on the answer's partitions between the answer and this judgement
    /// (0 without a token).
    pub records_since_answer: i64,
}

/// Sums over a group of decisions.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct LossTotals {
    pub decisions: u64,
    /// Decisions whose chosen worker held less than the best.
    pub lossy_decisions: u64,
    pub chosen_blocks: u64,
    pub achievable_blocks: u64,
    pub lost_blocks: u64,
    pub lost_tokens: u64,
    /// Decisions without the gateway's answer offsets.
    pub without_token: u64,
}

impl LossTotals {
    fn add(&mut self, d: &Decision) {
        self.decisions += 1;
        self.lossy_decisions += u64::from(d.lost_blocks > 0);
        self.chosen_blocks += u64::from(d.chosen_blocks);
        self.achievable_blocks += u64::from(d.best_blocks);
        self.lost_blocks += u64::from(d.lost_blocks);
        self.lost_tokens += d.lost_tokens;
        self.without_token += u64::from(d.answered_at.is_empty());
    }

    /// Lost blocks as a percentage of achievable ones (0 when nothing was achievable).
    pub fn lost_percent(&self) -> f64 {
        if self.achievable_blocks == 0 {
            0.0
        } else {
            100.0 * self.lost_blocks as f64 / self.achievable_blocks as f64
        }
    }
}

/// How to judge and what to keep.
#[derive(Clone, Copy, Debug)]
pub struct LossOptions {
    /// Width of a time bucket (ms of log time).
    pub bucket_ms: u64,
    /// Keep every decision (for JSON lines and tests); otherwise only the totals.
    pub keep_decisions: bool,
}

impl Default for LossOptions {
    fn default() -> Self {
        Self { bucket_ms: 60_000, keep_decisions: true }
    }
}

/// Everything judged over a range.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LossReport {
    pub decisions: Vec<Decision>,
    pub total: LossTotals,
    pub by_gateway: BTreeMap<String, LossTotals>,
    pub by_keyspace: BTreeMap<String, LossTotals>,
    pub by_policy: BTreeMap<String, LossTotals>,
    pub by_worker: BTreeMap<u64, LossTotals>,
    /// Keyed by bucket start (ms of log time).
    pub by_bucket: BTreeMap<u64, LossTotals>,
    pub bucket_ms: u64,
    /// Records replayed (placements included).
    pub replayed: u64,
    pub secs: f64,
}

impl LossReport {
    fn new(opts: &LossOptions) -> Self {
        Self { bucket_ms: opts.bucket_ms.max(1), ..Self::default() }
    }

    /// Adds one decision to every aggregate.
    pub fn add(&mut self, d: Decision, keep: bool) {
        self.total.add(&d);
        self.by_gateway.entry(d.gateway.clone()).or_default().add(&d);
        self.by_keyspace.entry(d.keyspace.clone()).or_default().add(&d);
        self.by_policy.entry(policy_name(&d.policy).to_string()).or_default().add(&d);
        self.by_worker.entry(d.worker).or_default().add(&d);
        self.by_bucket.entry(d.log_time / self.bucket_ms * self.bucket_ms).or_default().add(&d);
        if keep {
            self.decisions.push(d);
        }
    }
}

/// A policy as reported: `(none)` for placements that name none.
pub fn policy_name(p: &str) -> &str {
    if p.is_empty() {
        "(none)"
    } else {
        p
    }
}

/// Judges every placement in `[from, to)`: state at `from` rebuilt as `reconstruct` does, then
/// one replay to `to` with each placement judged just before it is applied.
pub fn judge_range(
    store: Option<&CheckpointStore>,
    log: &dyn LogSource,
    from: &Point,
    to: &Point,
    opts: &LossOptions,
) -> Result<LossReport, AuditError> {
    let started = Instant::now();
    let mut state = reconstruct(store, log, from, false)?;
    let mut report = LossReport::new(opts);
    let partitions = log.partitions();
    let mut observe = |applier: &Applier, p: u32, offset: i64, t: u64, value: Option<&[u8]>| {
        if let Some(d) = judge_record(applier, partitions, p, offset, t, value) {
            report.add(d, opts.keep_decisions);
        }
    };
    let replayed = advance_observed(&mut state.applier, log, to, &mut observe)?;
    report.replayed = replayed;
    report.secs = started.elapsed().as_secs_f64();
    Ok(report)
}

/// The decision of one record, when it is a valid placement (`None` for anything else).
pub fn judge_record(
    applier: &Applier,
    partitions: u32,
    partition: u32,
    offset: i64,
    log_time: u64,
    value: Option<&[u8]>,
) -> Option<Decision> {
    if !value.is_some_and(is_placement) {
        return None;
    }
    let Ok(Op::Placement { keyspace, holder, locals, answered_at, gateway, policy }) =
        decode(value, partition, partitions, usize::MAX)
    else {
        return None;
    };
    let matches =
        applier.engine().match_chain(&keyspace, &locals, &MatchOptions::default()).unwrap_or_default();
    let chosen: Vec<&HolderMatch> = matches
        .iter()
        .filter(|m| m.holder.worker == holder.worker && m.holder.dp_rank == holder.dp_rank)
        .collect();
    let chosen_blocks = chosen.iter().map(|m| m.depth).max().unwrap_or(0);
    let best_blocks = matches.iter().map(|m| m.depth).max().unwrap_or(0);
    let mut best_workers: Vec<u64> = matches
        .iter()
        .filter(|m| best_blocks > 0 && m.depth == best_blocks)
        .map(|m| m.holder.worker)
        .collect();
    best_workers.sort_unstable();
    best_workers.dedup();
    let lost_blocks = best_blocks - chosen_blocks;
    let records_since_answer =
        answered_at.iter().map(|a| (applier.partition(a.partition).next_offset - a.offset).max(0)).sum();
    Some(Decision {
        partition,
        offset,
        log_time,
        gateway,
        policy,
        keyspace: keyspace_name(&keyspace),
        worker: holder.worker,
        dp_rank: holder.dp_rank,
        prompt_blocks: locals.len() as u32,
        prompt_tail: locals.last().copied().unwrap_or(0),
        block_size: keyspace.block_size,
        chosen_blocks,
        best_blocks,
        best_workers,
        best_per_tier: per_tier(matches.iter()),
        chosen_per_tier: per_tier(chosen.into_iter()),
        lost_blocks,
        lost_tokens: u64::from(lost_blocks) * u64::from(keyspace.block_size),
        answered_at,
        records_since_answer,
    })
}

fn keyspace_name(k: &KeyspaceId) -> String {
    k.to_string()
}

/// Per tier name, the deepest single-tier prefix among `matches` (a GPU-only answer carries no
/// tier detail: its depth is the GPU's).
fn per_tier<'a>(matches: impl Iterator<Item = &'a HolderMatch>) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for m in matches {
        let tiers: Vec<(Tier, u32)> = if m.tiers().is_empty() {
            vec![(Tier::Gpu, m.depth)]
        } else {
            m.tiers().iter().map(|t| (t.tier, t.depth)).collect()
        };
        for (tier, depth) in tiers {
            let e = out.entry(tier.name().to_string()).or_insert(0);
            *e = (*e).max(depth);
        }
    }
    out
}
