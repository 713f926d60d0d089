//! Matching where some holders are off the GPU: a slot (worker, dp rank, lane) may hold a
//! query's blocks on several tiers, and its answer combines them.
//!
//! A slot's combined depth is the contiguous prefix of positions that *some* counted tier
//! holds, and each position is credited to the first tier in the query's preference order
//! that holds it. Never overcount: a position counts only if a holder of the slot is a member
//! of that position's run, exactly as for one holder.
//!
//! Two stages. First the holders' intervals of the query:
//! - depth only ([`Keyspace::match_slots_into`]): the one-tier walk with progress kept per
//!   slot (`match_depth::<true>`), which keeps its early exit and its skip of runs with the
//!   same holders, and orders the slots by depth; then each stage's run's members are
//!   credited with the stage's stretch, for the slots that got that far only, and each slot's
//!   holdings are combined where its leader finds them (no list to sort);
//! - with intervals ([`Keyspace::match_full`]): every position of the chain, every holder.
//!
//! Then each slot's holdings are combined ([`combine`]), stretch by stretch. The one-tier path
//! (`matching`) is taken whenever every holder of the keyspace is on the GPU.

use crate::keyspace::Keyspace;
use crate::matching::walk::{Acc, Filter, SCRATCH};
use crate::types::{HolderKey, HolderMatch, MatchDetail, MatchOptions, Tier, TierDepth, TierRun};
use smallvec::SmallVec;

/// One counted tier's holder of a slot, matched.
pub(super) struct Holding {
    pub tier: Tier,
    /// Position of the tier in the query's preference order.
    pub rank: usize,
    pub acc: Acc,
    pub blocks: u32,
    pub fed: bool,
    pub gapped: bool,
}

impl Keyspace {
    /// The depth-only tier path's answers into `out`, in the answer's order (unless tier
    /// weights order them by score: then unsorted) and uncut.
    ///
    /// The slots come out of the walk ordered by combined depth, then key
    /// (`sort_by_depth_then_key` on their leaders); each stage's run's members are credited
    /// with the stage's stretch into their slot's holdings, one per tier code, for the slots
    /// that got that far only; then each slot's holdings are taken in preference order and
    /// combined. No list of holdings to sort or search: a slot's are found by its leader.
    pub(crate) fn match_slots_into(
        &self,
        locals: &[u64],
        opts: &MatchOptions,
        f: &Filter,
        out: &mut Vec<HolderMatch>,
    ) {
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            self.match_depth::<true>(locals, f, s);
            s.sort_by_depth_then_key();
            let mut at = std::mem::take(&mut s.at);
            at.resize(self.holders.slots.len(), u32::MAX);
            for (i, &leader) in s.order.iter().enumerate() {
                at[leader as usize] = i as u32;
            }
            let mut accs = std::mem::take(&mut s.slot_accs);
            accs.clear();
            accs.resize_with(s.order.len(), Default::default);
            for (stage, &run) in s.runs.iter().enumerate() {
                let from = if stage == 0 { 0 } else { s.ends[stage - 1] };
                let to = s.ends[stage];
                for m in self.trie.runs[run].members.iter() {
                    let leader = self.holders.leader(m.holder) as usize;
                    // The slot's depth is `ends[stage of its leader - 1]`: past this stretch?
                    if s.stage[leader] as usize <= stage || !self.holder_ok(f, m.holder) {
                        continue;
                    }
                    let tier = self.holders.card(m.holder).key().tier;
                    accs[at[leader] as usize][tier.code() as usize].credit(from, to);
                }
            }
            let order = opts.tier_order();
            out.reserve(s.order.len());
            let mut held: SmallVec<[Holding; 4]> = SmallVec::new();
            for (&leader, slot_accs) in s.order.iter().zip(accs.iter_mut()) {
                held.clear();
                for (rank, &tier) in order.iter().enumerate() {
                    let Some(h) = self.holders.on_tier(leader, tier) else { continue };
                    if !self.holder_ok(f, h) {
                        continue;
                    }
                    let card = self.holders.card(h);
                    let acc = std::mem::take(&mut slot_accs[tier.code() as usize]);
                    held.push(Holding {
                        tier,
                        rank,
                        acc,
                        blocks: card.blocks,
                        fed: card.fed,
                        gapped: card.gapped,
                    });
                }
                let slot = self.holders.card(leader).key().on(Tier::Gpu);
                out.extend(combine(slot, &held, opts));
            }
            for &leader in &s.order {
                at[leader as usize] = u32::MAX;
                s.stage[leader as usize] = 0;
            }
            s.at = at;
            s.slot_accs = accs;
        })
    }

    /// Every slot of `held` (holders with their intervals of the query), its tiers combined
    /// (unsorted, uncut).
    pub(crate) fn match_tiers(
        &self,
        held: Vec<(u32, Acc)>,
        opts: &MatchOptions,
        f: &Filter,
    ) -> Vec<HolderMatch> {
        let order = opts.tier_order();
        let mut held: Vec<(HolderKey, u32, Holding)> = held
            .into_iter()
            .map(|(h, acc)| {
                let card = self.holders.card(h);
                let tier = card.key().tier;
                let rank = order.iter().position(|&t| t == tier).expect("the filter counts its tier");
                let holding =
                    Holding { tier, rank, acc, blocks: card.blocks, fed: card.fed, gapped: card.gapped };
                (card.key().on(Tier::Gpu), self.holders.leader(h), holding)
            })
            .collect();
        held.sort_unstable_by_key(|(slot, _, h)| (*slot, h.rank));
        let mut out = Vec::new();
        let mut slot_held = Vec::new();
        let mut rest = held.into_iter().peekable();
        while let Some((slot, leader, first)) = rest.next() {
            slot_held.clear();
            slot_held.push(first);
            while let Some((_, _, h)) = rest.next_if(|(s, _, _)| *s == slot) {
                slot_held.push(h);
            }
            self.add_untouched(leader, order, f, &mut slot_held);
            slot_held.sort_unstable_by_key(|h| h.rank);
            out.extend(combine(slot, &slot_held, opts));
        }
        out
    }

    /// The slot's other counted tiers' holders, which hold none of the query's positions: they
    /// still count in the slot's totals and are listed with depth 0.
    fn add_untouched(&self, leader: u32, order: &[Tier], f: &Filter, held: &mut Vec<Holding>) {
        for (rank, &tier) in order.iter().enumerate() {
            let Some(h) = self.holders.on_tier(leader, tier) else { continue };
            if held.iter().any(|h| h.tier == tier) {
                continue;
            }
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
pub(super) fn combine(slot: HolderKey, held: &[Holding], opts: &MatchOptions) -> Option<HolderMatch> {
    let runs = runs_by_preference(held);
    let depth: u32 = runs.iter().map(|r| r.blocks).sum();
    let intervals = if opts.intervals { union(held) } else { SmallVec::new() };
    let reported = if opts.intervals { !intervals.is_empty() } else { depth > 0 };
    if !reported {
        return None;
    }
    let weighted = opts
        .tier_weights
        .map(|w| runs.iter().map(|r| u64::from(r.blocks) * u64::from(w[r.tier.code() as usize])).sum());
    let tiers =
        held.iter().map(|h| TierDepth { tier: h.tier, depth: h.acc.depth, total: h.blocks }).collect();
    let m = HolderMatch {
        holder: slot,
        depth,
        total: held.iter().map(|h| h.blocks).sum(),
        inferred: held.iter().all(|h| !h.fed),
        gapped: held.iter().any(|h| h.gapped),
        weighted,
        detail: None,
    };
    Some(m.with_detail(MatchDetail { intervals, tiers, runs }))
}

/// Walks positions from 0 while some holding covers them, crediting each stretch to the
/// first holding (in preference order) that covers it, and merges equal neighbours into runs.
/// A stretch ends where its holding's interval ends or where a preferred holding's next
/// interval begins, so the walk steps interval by interval, not position by position.
fn runs_by_preference(held: &[Holding]) -> SmallVec<[TierRun; 4]> {
    // Per holding, its first interval not yet passed.
    let mut next: smallvec::SmallVec<[usize; 4]> = smallvec::smallvec![0; held.len()];
    let mut runs: SmallVec<[TierRun; 4]> = SmallVec::new();
    let mut p = 0u32;
    loop {
        // The first holding covering `p`, and where the next preferred interval begins.
        let mut preferred_from = u32::MAX;
        let mut found = None;
        for (j, h) in held.iter().enumerate() {
            let iv = &h.acc.intervals;
            while next[j] < iv.len() && iv[next[j]].1 <= p {
                next[j] += 1;
            }
            match iv.get(next[j]) {
                Some(&(from, to)) if from <= p => {
                    found = Some((h.tier, to.min(preferred_from)));
                    break;
                }
                Some(&(from, _)) => preferred_from = preferred_from.min(from),
                None => {}
            }
        }
        let Some((tier, end)) = found else { return runs };
        match runs.last_mut() {
            Some(r) if r.tier == tier => r.blocks += end - p,
            _ => runs.push(TierRun { tier, blocks: end - p }),
        }
        p = end;
    }
}

/// The positions any holding covers, as sorted disjoint half-open intervals.
fn union(held: &[Holding]) -> SmallVec<[(u32, u32); 2]> {
    let mut all: Vec<(u32, u32)> = held.iter().flat_map(|h| h.acc.intervals.iter().copied()).collect();
    all.sort_unstable();
    let mut out: SmallVec<[(u32, u32); 2]> = SmallVec::new();
    for (from, to) in all {
        match out.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => out.push((from, to)),
        }
    }
    out
}
