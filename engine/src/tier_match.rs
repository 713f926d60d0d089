//! Matching where some holders are off the GPU: a slot (worker, dp rank, lane) may hold a
//! query's blocks on several tiers, and its answer combines them.
//!
//! Each tier's holder is matched on its own (intervals of the query it covers, from
//! [`Keyspace::match_full`]); a slot's combined depth is the contiguous prefix of positions
//! that *some* counted tier holds, and each position is credited to the first tier in the
//! query's preference order that holds it. Never overcount: a position counts only if a
//! holder of the slot is a member of that position's run, exactly as for one holder.
//!
//! This path costs a walk of the whole matched chain and a map of the touched holders; the
//! one-tier path (`matching`) keeps its early exit and is taken whenever every holder of the
//! keyspace is on the GPU.

use crate::keyspace::Keyspace;
use crate::matching::{Acc, Filter};
use crate::types::{HolderKey, HolderMatch, MatchOptions, Tier, TierDepth, TierRun};
use std::collections::BTreeMap;

/// One counted tier's holder of a slot, matched.
struct Holding {
    tier: Tier,
    /// Position of the tier in the query's preference order.
    rank: usize,
    acc: Acc,
    blocks: u32,
    fed: bool,
    gapped: bool,
}

impl Keyspace {
    /// Every slot the query touches, its tiers combined (unsorted, uncut).
    pub(crate) fn match_tiers(&self, locals: &[u64], opts: &MatchOptions, f: &Filter) -> Vec<HolderMatch> {
        let order = opts.tier_order();
        let mut slots: BTreeMap<HolderKey, Vec<Holding>> = BTreeMap::new();
        for (h, acc) in self.match_full(locals, f) {
            let card = self.holders.card(h);
            let rank = order.iter().position(|&t| t == card.key().tier).expect("the filter counts its tier");
            slots.entry(card.key().on(Tier::Gpu)).or_default().push(Holding {
                tier: card.key().tier,
                rank,
                acc,
                blocks: card.blocks,
                fed: card.fed,
                gapped: card.gapped,
            });
        }
        let mut out = Vec::with_capacity(slots.len());
        for (slot, mut held) in slots {
            self.add_untouched(slot, order, f, &mut held);
            held.sort_unstable_by_key(|h| h.rank);
            if let Some(m) = combine(slot, &held, opts) {
                out.push(m);
            }
        }
        out
    }

    /// The slot's other counted tiers' holders, which hold none of the query's positions: they
    /// still count in the slot's totals and are listed with depth 0.
    fn add_untouched(&self, slot: HolderKey, order: &[Tier], f: &Filter, held: &mut Vec<Holding>) {
        for (rank, &tier) in order.iter().enumerate() {
            if held.iter().any(|h| h.tier == tier) {
                continue;
            }
            let Some(h) = self.holders.get(&slot.on(tier)) else { continue };
            if !self.holder_ok(f, h) {
                continue;
            }
            let card = self.holders.card(h);
            let acc = Acc::default();
            held.push(Holding { tier, rank, acc, blocks: card.blocks, fed: card.fed, gapped: card.gapped });
        }
    }
}

/// The slot's answer from its holdings (in preference order), or `None` if it is not reported.
fn combine(slot: HolderKey, held: &[Holding], opts: &MatchOptions) -> Option<HolderMatch> {
    let runs = runs_by_preference(held);
    let depth: u32 = runs.iter().map(|r| r.blocks).sum();
    let intervals = if opts.intervals { union(held) } else { Vec::new() };
    let reported = if opts.intervals { !intervals.is_empty() } else { depth > 0 };
    if !reported {
        return None;
    }
    let weighted = opts
        .tier_weights
        .map(|w| runs.iter().map(|r| u64::from(r.blocks) * u64::from(w[r.tier.code() as usize])).sum());
    Some(HolderMatch {
        holder: slot,
        depth,
        total: held.iter().map(|h| h.blocks).sum(),
        inferred: held.iter().all(|h| !h.fed),
        gapped: held.iter().any(|h| h.gapped),
        intervals,
        tiers: held.iter().map(|h| TierDepth { tier: h.tier, depth: h.acc.depth, total: h.blocks }).collect(),
        runs,
        weighted,
    })
}

/// Walks positions from 0 while some holding covers them, crediting each to the first holding
/// (in preference order) that does, and merges equal neighbours into runs.
fn runs_by_preference(held: &[Holding]) -> Vec<TierRun> {
    let mut next = vec![0usize; held.len()]; // per holding, its first interval not yet passed
    let mut runs: Vec<TierRun> = Vec::new();
    let mut p = 0u32;
    loop {
        let mut found = None;
        for (j, h) in held.iter().enumerate() {
            let iv = &h.acc.intervals;
            while next[j] < iv.len() && iv[next[j]].1 <= p {
                next[j] += 1;
            }
            if iv.get(next[j]).is_some_and(|&(from, _)| from <= p) {
                found = Some(h.tier);
                break;
            }
        }
        let Some(tier) = found else { return runs };
        match runs.last_mut() {
            Some(r) if r.tier == tier => r.blocks += 1,
            _ => runs.push(TierRun { tier, blocks: 1 }),
        }
        p += 1;
    }
}

/// The positions any holding covers, as sorted disjoint half-open intervals.
fn union(held: &[Holding]) -> Vec<(u32, u32)> {
    let mut all: Vec<(u32, u32)> = held.iter().flat_map(|h| h.acc.intervals.iter().copied()).collect();
    all.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(all.len());
    for (from, to) in all {
        match out.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
    }
    out
}
