//! Longest-prefix matching ([`Keyspace::match_chain`]): walk the query's chain down the trie
//! and credit each holder only for positions it holds, contiguously from position 0; then
//! order the answer and cut it to `top_k`.
//!
//! Which path a query takes: where every holder of the keyspace is on the GPU, the one-tier
//! walks of `walk` answer it directly (depth only, or with intervals); where some holder is
//! off the GPU, `tiers` combines each slot's tiers from the same walks.

mod tiers;
mod top;
mod walk;

use crate::keyspace::Keyspace;
use crate::types::{HolderMatch, MatchDetail, MatchOptions, Tier};
use top::{Cut, TOP};
use walk::{Filter, SCRATCH};

impl Keyspace {
    /// Scores every holder against `locals` (a chain of local hashes from position 0).
    ///
    /// Without `opts.intervals`, only holders with depth ≥ 1 are returned and the walk stops
    /// at the first position no holder still covers contiguously. With it, every holder that
    /// covers any position is returned with its intervals. Results are sorted by depth
    /// (descending), then holder key, and cut to `opts.top_k`.
    pub fn match_chain(&self, locals: &[u64], opts: &MatchOptions) -> Vec<HolderMatch> {
        let mut out = Vec::new();
        self.match_chain_into(locals, opts, &mut out);
        out
    }

    /// [`Self::match_chain`] into a caller's buffer (cleared first), so a caller answering
    /// many queries reuses one allocation: a match that lists hundreds of holders otherwise
    /// spends a noticeable part of its time allocating and freeing the result.
    pub fn match_chain_into(&self, locals: &[u64], opts: &MatchOptions, out: &mut Vec<HolderMatch>) {
        out.clear();
        let sorted;
        let candidates = match opts.candidates.as_deref() {
            Some(c) if !c.is_sorted() => {
                sorted = sorted_copy(c);
                Some(&sorted[..])
            }
            c => c,
        };
        let order = opts.tier_order();
        let mut filter =
            Filter { lane: opts.lane, candidates, exclude_gapped: opts.exclude_gapped, tiers: None };
        if self.holders.off_gpu() > 0 {
            // Some slot may hold blocks on several tiers: combine them (`tiers`).
            filter.tiers = Some(order);
            if self.top_slots(locals, opts, &filter, out) {
                return;
            }
            if opts.intervals {
                let held = self.match_full(locals, &filter);
                out.extend(self.match_tiers(held, opts, &filter));
                sort_and_cut(out, opts);
            } else {
                self.match_slots_into(locals, opts, &filter, out);
                // In the answer's order already, unless weights order it by score.
                if opts.tier_weights.is_some() {
                    sort_and_cut(out, opts);
                }
                out.truncate(opts.top_k.unwrap_or(usize::MAX));
            }
            return;
        }
        if !order.contains(&Tier::Gpu) {
            return; // every holder is on the GPU, which does not count
        }
        let gpu_weight = opts.tier_weights.map(|w| u64::from(w[Tier::Gpu.code() as usize]));
        if opts.intervals {
            out.extend(self.match_full(locals, &filter).into_iter().map(|(h, a)| {
                let detail = MatchDetail { intervals: a.intervals, ..Default::default() };
                let mut m = self.result(h, a.depth).with_detail(detail);
                m.weighted = gpu_weight.map(|w| w * u64::from(a.depth));
                m
            }));
            sort_and_cut(out, opts);
            return;
        }
        if let Some(k) = opts.top_k {
            let done = TOP.with(|s| {
                let s = &mut *s.borrow_mut();
                if !self.match_top::<false>(locals, &filter, Cut::First(k), s) {
                    return false;
                }
                out.extend(s.found.iter().map(|&(h, depth)| {
                    let mut m = self.result(h, depth);
                    m.weighted = gpu_weight.map(|w| w * u64::from(depth));
                    m
                }));
                true
            });
            if done {
                return;
            }
        }
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            self.match_depth::<false>(locals, &filter, s);
            s.sort_by_depth_then_key();
            let n = s.order.len().min(opts.top_k.unwrap_or(usize::MAX));
            out.reserve(n);
            s.take_in_order(|i, h, depth| {
                if i < n {
                    let mut m = self.result(h, depth);
                    m.weighted = gpu_weight.map(|w| w * u64::from(depth));
                    out.push(m);
                }
            });
        })
    }

    /// Every holder at the best depth `locals` reaches (all the ties, ordered by key), where
    /// every holder is on the GPU and no filter applies; the top-k walk answers it without
    /// crediting every holder. `false` (and `out` left empty) where the keyspace has holders
    /// off the GPU or the walk gave up: [`Self::match_chain_into`] must answer.
    pub fn best_holders_into(&self, locals: &[u64], out: &mut Vec<HolderMatch>) -> bool {
        out.clear();
        if self.holders.off_gpu() > 0 {
            return false;
        }
        let filter = Filter { lane: None, candidates: None, exclude_gapped: false, tiers: None };
        TOP.with(|s| {
            let s = &mut *s.borrow_mut();
            if !self.match_top::<false>(locals, &filter, Cut::BestDepth, s) {
                return false;
            }
            out.extend(s.found.iter().map(|&(h, depth)| self.result(h, depth)));
            true
        })
    }

    /// The tier path's answer from the `top_k` best slots only, where the query asks for a few
    /// by depth (no intervals, no tier weights) and the top-k walk answers (`top`).
    fn top_slots(&self, locals: &[u64], opts: &MatchOptions, f: &Filter, out: &mut Vec<HolderMatch>) -> bool {
        let Some(k) = opts.top_k.filter(|_| !opts.intervals && opts.tier_weights.is_none()) else {
            return false;
        };
        TOP.with(|s| {
            let s = &mut *s.borrow_mut();
            let answered = self.match_top::<true>(locals, f, Cut::First(k), s);
            if answered {
                self.top_slots_into(opts, f, s, out);
            }
            answered
        })
    }

    /// A GPU-only keyspace's answer for holder `h`.
    fn result(&self, h: u32, depth: u32) -> HolderMatch {
        let holder = self.holders.card(h);
        HolderMatch {
            holder: holder.key(),
            depth,
            total: holder.blocks,
            inferred: !holder.fed,
            gapped: holder.gapped,
            weighted: None,
            detail: None,
        }
    }
}

/// Orders results by weighted score (with weights), then depth (descending), then slot, and
/// keeps the `top_k` best.
fn sort_and_cut(out: &mut Vec<HolderMatch>, opts: &MatchOptions) {
    out.sort_unstable_by(|a, b| {
        b.weighted.cmp(&a.weighted).then(b.depth.cmp(&a.depth)).then(a.holder.cmp(&b.holder))
    });
    out.truncate(opts.top_k.unwrap_or(usize::MAX));
}

fn sorted_copy(c: &[u64]) -> Vec<u64> {
    let mut v = c.to_vec();
    v.sort_unstable();
    v
}
