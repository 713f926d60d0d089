//! Routing-loss attribution: what a placement's decision cost, and totals over many.
//!
//! A placement ([`Placed`]) is judged by matching its prompt (its local block hashes) against
//! an index state and recording what the chosen worker held, what the best worker held, the
//! best on each storage tier, and the difference ([`Decision`]). [`Tally`] sums the matches of
//! groups of holders judged apart (the partitions, each at the offset the placement's token
//! names: [`crate::loss_judge`]). [`judge_record`] judges one placement against a state as it
//! is (`--follow`, [`crate::loss_follow`]).

use prefixlog_engine::{HolderKey, HolderMatch, Keyspace, KeyspaceId, MatchOptions, Tier};
use prefixlog_state::record::{decode, is_placement, Op};
use prefixlog_state::Applier;
use prefixlog_state::NextOffset;
use serde::Serialize;
use std::collections::BTreeMap;

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
    /// Records of the placement's own partition between the answer and the placement (0
    /// without a token).
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
    /// Per gateway, keyed by bucket start (the SVG plot's lines).
    pub by_gateway_bucket: BTreeMap<String, BTreeMap<u64, LossTotals>>,
    pub bucket_ms: u64,
    /// Records replayed (placements included).
    pub replayed: u64,
    pub secs: f64,
}

impl LossReport {
    pub(crate) fn new(opts: &LossOptions) -> Self {
        Self { bucket_ms: opts.bucket_ms.max(1), ..Self::default() }
    }

    /// Adds one decision to every aggregate.
    pub fn add(&mut self, d: Decision, keep: bool) {
        self.total.add(&d);
        self.by_gateway.entry(d.gateway.clone()).or_default().add(&d);
        self.by_keyspace.entry(d.keyspace.clone()).or_default().add(&d);
        self.by_policy.entry(policy_name(&d.policy).to_string()).or_default().add(&d);
        self.by_worker.entry(d.worker).or_default().add(&d);
        let bucket = d.log_time / self.bucket_ms * self.bucket_ms;
        self.by_bucket.entry(bucket).or_default().add(&d);
        self.by_gateway_bucket.entry(d.gateway.clone()).or_default().entry(bucket).or_default().add(&d);
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

/// A placement as its record says: what was placed, where, and the gateway's answer token.
#[derive(Clone, Debug)]
pub struct Placed {
    pub partition: u32,
    pub offset: i64,
    pub log_time: u64,
    pub keyspace: KeyspaceId,
    pub holder: HolderKey,
    pub locals: Vec<u64>,
    /// The gateway's answer token, ordered by partition.
    pub answered_at: Vec<NextOffset>,
    pub gateway: String,
    pub policy: String,
}

impl Placed {
    /// The placement of one record, when it is a valid placement (`None` for anything else).
    pub fn of_record(
        partitions: u32,
        partition: u32,
        offset: i64,
        log_time: u64,
        value: Option<&[u8]>,
    ) -> Option<Placed> {
        if !value.is_some_and(is_placement) {
            return None;
        }
        let Ok(Op::Placement { keyspace, holder, locals, mut answered_at, gateway, policy }) =
            decode(value, partition, partitions, usize::MAX)
        else {
            return None;
        };
        // By partition (stable: a partition named twice keeps its first entry first), so that
        // [`Placed::answered_on`] is a binary search.
        answered_at.sort_by_key(|a| a.partition);
        Some(Placed { partition, offset, log_time, keyspace, holder, locals, answered_at, gateway, policy })
    }

    /// The answer token's offset on partition `q` (its first entry for `q`), if it names `q`.
    pub fn answered_on(&self, q: u32) -> Option<i64> {
        let i = self.answered_at.partition_point(|a| a.partition < q);
        self.answered_at.get(i).filter(|a| a.partition == q).map(|a| a.offset)
    }

    /// The prompt matched against a state's index (every holder it has).
    pub fn matches(&self, applier: &Applier) -> Vec<HolderMatch> {
        let mut out = Vec::new();
        self.matches_into(applier, &mut out);
        out
    }

    /// [`Self::matches`] into a caller's buffer (cleared first).
    pub fn matches_into(&self, applier: &Applier, out: &mut Vec<HolderMatch>) {
        out.clear();
        if let Some(ks) = applier.engine().keyspace(&self.keyspace) {
            self.matches_in(&ks.read(), out);
        }
    }

    /// The prompt matched against every holder of `ks` (the placement's keyspace), into a
    /// caller's buffer: the judge matches every placement once per partition.
    pub fn matches_in(&self, ks: &Keyspace, out: &mut Vec<HolderMatch>) {
        ks.match_chain_into(&self.locals, &MatchOptions::default(), out);
    }

    /// What the tally needs from a partition that cannot hold the chosen worker (a worker's
    /// holders all live on its own partition): the best depth, every holder at it, and the
    /// best per tier. Where every holder is on the GPU (the best per tier is the best), the
    /// engine's best-holders walk answers without crediting every holder; otherwise the full
    /// match.
    pub fn best_in(&self, ks: &Keyspace, out: &mut Vec<HolderMatch>) {
        if !ks.best_holders_into(&self.locals, out) {
            self.matches_in(ks, out);
        }
    }

    /// The decision, from the tally of every holder's match against the state it is judged on.
    /// `records_since_answer`: records of the placement's own partition between the answer and
    /// the placement.
    pub fn decide(self, mut tally: Tally, records_since_answer: i64) -> Decision {
        let holder = self.holder;
        let chosen_blocks = tally.chosen.iter().map(|m| m.depth).max().unwrap_or(0);
        let lost_blocks = tally.best_blocks - chosen_blocks;
        Decision {
            partition: self.partition,
            offset: self.offset,
            log_time: self.log_time,
            gateway: self.gateway,
            policy: self.policy,
            keyspace: keyspace_name(&self.keyspace),
            worker: holder.worker,
            dp_rank: holder.dp_rank,
            prompt_blocks: self.locals.len() as u32,
            prompt_tail: self.locals.last().copied().unwrap_or(0),
            block_size: self.keyspace.block_size,
            chosen_blocks,
            best_blocks: tally.best_blocks,
            best_workers: tally.take_best_workers(),
            best_per_tier: tally.best_per_tier.named(),
            chosen_per_tier: per_tier(tally.chosen.iter()),
            lost_blocks,
            lost_tokens: u64::from(lost_blocks) * u64::from(self.keyspace.block_size),
            answered_at: self.answered_at,
            records_since_answer,
        }
    }
}

/// What a placement's matches showed so far, summed over groups of holders matched apart (the
/// partitions, each at its own offset): the best depth and who holds it, the best per tier,
/// and the chosen holder's own matches.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub best_blocks: u32,
    /// Every worker holding `best_blocks`, in no order and possibly repeated (a worker with
    /// several dp ranks or tiers): sorted once, by [`Tally::take_best_workers`]. Empty while nobody
    /// holds any block.
    best_workers: Vec<u64>,
    pub best_per_tier: TierDepths,
    pub chosen: Vec<HolderMatch>,
}

impl Tally {
    /// Every worker holding the best depth, ascending, each once (taken: the tally keeps none).
    pub fn take_best_workers(&mut self) -> Vec<u64> {
        let mut w = std::mem::take(&mut self.best_workers);
        // Stable on purpose: the list is a few sorted runs (each partition's best holders come
        // in key order), which the stable sort merges instead of sorting from scratch.
        w.sort();
        w.dedup();
        w
    }

    /// Adds another tally (of other holders).
    pub fn merge(&mut self, other: Tally) {
        if other.best_blocks > self.best_blocks {
            self.best_blocks = other.best_blocks;
            self.best_workers = other.best_workers;
        } else if other.best_blocks > 0 && other.best_blocks == self.best_blocks {
            self.best_workers.extend(other.best_workers);
        }
        for t in Tier::ALL {
            if let Some(d) = other.best_per_tier.0[t.code() as usize] {
                self.best_per_tier.max(t, d);
            }
        }
        self.chosen.extend(other.chosen);
    }

    /// Adds the matches of a group of holders, `holder` being the chosen one.
    pub fn add(&mut self, holder: HolderKey, matches: &[HolderMatch]) {
        if matches.is_empty() {
            return;
        }
        let best = matches.iter().map(|m| m.depth).max().unwrap_or(0);
        if best > self.best_blocks {
            self.best_blocks = best;
            self.best_workers.clear();
        }
        if best > 0 && best == self.best_blocks {
            self.best_workers.extend(matches.iter().filter(|m| m.depth == best).map(|m| m.holder.worker));
        }
        self.best_per_tier.add(matches.iter());
        self.chosen.extend(
            matches
                .iter()
                .filter(|m| m.holder.worker == holder.worker && m.holder.dp_rank == holder.dp_rank)
                .cloned(),
        );
    }
}

/// The decision of one record judged on `applier`'s state as it is (the position-based
/// judgement of `--follow`), when it is a valid placement (`None` for anything else).
pub fn judge_record(
    applier: &Applier,
    partitions: u32,
    partition: u32,
    offset: i64,
    log_time: u64,
    value: Option<&[u8]>,
) -> Option<Decision> {
    let placed = Placed::of_record(partitions, partition, offset, log_time, value)?;
    let since = placed.answered_on(partition).map_or(0, |o| (offset - o).max(0));
    let mut tally = Tally::default();
    tally.add(placed.holder, &placed.matches(applier));
    Some(placed.decide(tally, since))
}

fn keyspace_name(k: &KeyspaceId) -> String {
    k.to_string()
}

/// Per tier name, the deepest single-tier prefix among `matches` (a GPU-only answer carries no
/// tier detail: its depth is the GPU's).
fn per_tier<'a>(matches: impl Iterator<Item = &'a HolderMatch>) -> BTreeMap<String, u32> {
    let mut out = TierDepths::default();
    out.add(matches);
    out.named()
}

/// The deepest single-tier prefix per tier (indexed by [`Tier::code`]), `None` for a tier no
/// match named.
#[derive(Clone, Copy, Debug, Default)]
pub struct TierDepths([Option<u32>; 4]);

impl TierDepths {
    fn add<'a>(&mut self, matches: impl Iterator<Item = &'a HolderMatch>) {
        for m in matches {
            if m.tiers().is_empty() {
                self.max(Tier::Gpu, m.depth);
            }
            for t in m.tiers() {
                self.max(t.tier, t.depth);
            }
        }
    }

    fn max(&mut self, tier: Tier, depth: u32) {
        let e = &mut self.0[tier.code() as usize];
        *e = Some(e.map_or(depth, |d| d.max(depth)));
    }

    fn named(&self) -> BTreeMap<String, u32> {
        Tier::ALL
            .iter()
            .filter_map(|&t| self.0[t.code() as usize].map(|d| (t.name().to_string(), d)))
            .collect()
    }
}
